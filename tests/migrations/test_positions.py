"""Revision 0006: items numbered per session, in place, keeping every row and its order.

A database at 0005 holds sessions whose items interleave (their global ids
alternate between sessions), advanced rows (structure rows pointing at items by
id, usage, branch names) and awkward table names. Upgraded, each session's items
are numbered 1…n in their old order, the structure rows point at the same items,
and appends continue after the old last position; downgraded, the items get ids
again in each session's order, and upgraded again nothing has moved.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, Text, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from agents_memory import SessionStore, TableNames, create_engine, get_models, migrations

TAG = uuid.uuid4().hex[:8]
PAIRS = {
    "plain": TableNames(f"p{TAG}_sessions", f"p{TAG}_messages"),
    "mixed-case": TableNames(f"Pos_{TAG}_Sessions", f"Pos_{TAG}_Messages"),
    "longest": TableNames((f"pl_{TAG}_" + "s" * 63)[:63], (f"pm_{TAG}_" + "m" * 63)[:63]),
    # reserved words on every database (test_table_names uses others, so runs never meet)
    "reserved": TableNames("Table", "Column"),
}
SESSIONS = ("b", "a", "c")
EXTRA = {"b": [{"role": "user", "content": "again"}], "c": [{"role": "user", "content": "kept"}]}
"""What the test appends at head, kept through the downgrade."""
PER_SESSION = 7


def kw(names: TableNames) -> dict[str, str]:
    return {"sessions_table": names.sessions, "messages_table": names.messages}


def _at_0005(names: TableNames) -> dict[str, Table]:
    """The tables as revision 0005 left them (only the columns this test writes or reads)."""
    md = MetaData()
    return {
        "sessions": Table(names.sessions, md, Column("session_id", String(255))),
        "messages": Table(
            names.messages,
            md,
            Column("id", Integer),
            Column("session_id", String(255)),
            Column("message_data", Text),
        ),
        "structure": Table(
            names.structure,
            md,
            Column("id", Integer),
            Column("session_id", String(255)),
            Column("message_id", Integer),
            Column("branch_id", String(255)),
            Column("message_type", Text),
            Column("sequence_number", Integer),
            Column("user_turn_number", Integer),
            Column("branch_turn_number", Integer),
        ),
        "usage": Table(
            names.turn_usage,
            md,
            Column("session_id", String(255)),
            Column("branch_id", String(255)),
            Column("user_turn_number", Integer),
            *(
                Column(c, Integer)
                for c in ("requests", "input_tokens", "output_tokens", "total_tokens")
            ),
        ),
        "branches": Table(
            names.branches, md, Column("session_id", String(255)), Column("branch_id", String(255))
        ),
    }


def _item(sid: str, i: int) -> dict[str, Any]:
    return {"role": "user" if i % 2 == 0 else "assistant", "content": f"{sid}-{i}"}


async def _write_0005(engine: AsyncEngine, names: TableNames) -> None:
    """Interleaved items (round robin across sessions), a main and an alt branch, usage."""
    t = _at_0005(names)
    async with engine.begin() as conn:
        await conn.execute(t["sessions"].insert(), [{"session_id": s} for s in SESSIONS])
        for i in range(PER_SESSION):
            for sid in SESSIONS:  # ids alternate between the sessions
                data = json.dumps(_item(sid, i))
                await conn.execute(t["messages"].insert().values(session_id=sid, message_data=data))
        m = t["messages"]
        for sid in SESSIONS:
            ids = (
                (await conn.execute(select(m.c.id).where(m.c.session_id == sid).order_by(m.c.id)))
                .scalars()
                .all()
            )
            rows = [
                {
                    "session_id": sid,
                    "message_id": item_id,
                    "branch_id": "main",
                    "message_type": "user" if i % 2 == 0 else "assistant",
                    "sequence_number": i + 1,
                    "user_turn_number": i // 2 + 1,
                    "branch_turn_number": i // 2 + 1,
                }
                for i, item_id in enumerate(ids)
            ]
            # "alt" shares the first two items (a branch copies structure rows, not items)
            rows += [
                {**row, "branch_id": "alt", "sequence_number": PER_SESSION + k + 1}
                for k, row in enumerate(rows[:2])
            ]
            await conn.execute(t["structure"].insert(), rows)
            await conn.execute(
                t["usage"].insert(),
                [
                    {
                        "session_id": sid,
                        "branch_id": "main",
                        "user_turn_number": turn,
                        "requests": 1,
                        "input_tokens": turn,
                        "output_tokens": 2,
                        "total_tokens": turn + 2,
                    }
                    for turn in (1, 2)
                ],
            )
            await conn.execute(t["branches"].insert().values(session_id=sid, branch_id="alt"))


async def _structure_contents(engine: AsyncEngine, names: TableNames, *, head: bool) -> set[Any]:
    """``(session, branch, sequence, the item's text)`` of every structure row."""
    if head:
        models = get_models(names)
        s, m = models.Structure.__table__, models.Message.__table__
        on = (s.c.session_id == m.c.session_id) & (s.c.message_position == m.c.position)
    else:
        t = _at_0005(names)
        s, m = t["structure"], t["messages"]
        on = s.c.message_id == m.c.id
    query = select(s.c.session_id, s.c.branch_id, s.c.sequence_number, m.c.message_data).join(m, on)
    async with engine.connect() as conn:
        return {tuple(r) for r in (await conn.execute(query)).all()}


async def _usage(engine: AsyncEngine, names: TableNames) -> set[Any]:
    u = _at_0005(names)["usage"]
    async with engine.connect() as conn:
        return {tuple(r) for r in (await conn.execute(select(u))).all()}


async def _numbered_per_session(engine: AsyncEngine, names: TableNames) -> None:
    """Each session's items at positions 1…n in their old order; its counter at n."""
    models = get_models(names)
    m, s = models.Message.__table__, models.Session.__table__
    async with engine.connect() as conn:
        for sid in SESSIONS:
            rows = (
                await conn.execute(
                    select(m.c.position, m.c.message_data)
                    .where(m.c.session_id == sid)
                    .order_by(m.c.position)
                )
            ).all()
            assert [r[0] for r in rows] == list(range(1, PER_SESSION + 1))
            assert [json.loads(r[1]) for r in rows] == [_item(sid, i) for i in range(PER_SESSION)]
            top = select(s.c.last_position).where(s.c.session_id == sid)
            assert (await conn.execute(top)).scalar_one() == PER_SESSION


async def _ids_per_session(engine: AsyncEngine, names: TableNames) -> None:
    """At 0005 again: ids in each session's order, unique; a new row's id after them all."""
    assert await migrations.current(engine, **kw(names)) == "0005"
    t = _at_0005(names)["messages"]
    async with engine.begin() as conn:
        ids = {}
        for sid in SESSIONS:
            rows = (
                await conn.execute(
                    select(t.c.id, t.c.message_data).where(t.c.session_id == sid).order_by(t.c.id)
                )
            ).all()
            ids[sid] = [r[0] for r in rows]
            expected = [_item(sid, i) for i in range(PER_SESSION)]
            expected += EXTRA.get(sid, [])
            assert [json.loads(r[1]) for r in rows] == expected
        every = [i for sid in SESSIONS for i in ids[sid]]
        assert len(set(every)) == len(every)
        # 0005's writers insert without an id: the sequence goes on after the largest
        await conn.execute(t.insert().values(session_id="a", message_data='{"n": "new"}'))
        newest = (
            await conn.execute(select(t.c.id).where(t.c.message_data == '{"n": "new"}'))
        ).scalar_one()
        assert newest > max(every)


@pytest.fixture(params=list(PAIRS), ids=list(PAIRS))
async def pair(
    request: pytest.FixtureRequest, backend: Any, drop_set: Any
) -> AsyncIterator[TableNames]:
    names = PAIRS[request.param]
    yield names
    if backend.kind != "sqlite":
        engine = create_engine(backend.url)
        try:
            await drop_set(engine, names)
        finally:
            await engine.dispose()


async def test_0006_keeps_every_row_its_order_and_its_structure(
    file_backend: Any, pair: TableNames
) -> None:
    names = pair
    engine = create_engine(file_backend.url)
    try:
        await migrations.upgrade(engine, revision="0005", **kw(names))
        await _write_0005(engine, names)
        before = await _structure_contents(engine, names, head=False)
        usage = await _usage(engine, names)
        assert len(before) == len(SESSIONS) * (PER_SESSION + 2)

        await migrations.upgrade(engine, revision="0006", **kw(names))
        assert await migrations.current(engine, **kw(names)) == "0006"
        await migrations.upgrade(engine, **kw(names))
        assert await migrations.check(engine, **kw(names)) == []
        await _numbered_per_session(engine, names)
        m = get_models(names).Message.__table__
        assert await _structure_contents(engine, names, head=True) == before
        assert await _usage(engine, names) == usage

        store = SessionStore(engine, **kw(names))
        advanced = store.advanced_session("a")
        assert await advanced.get_items() == [_item("a", i) for i in range(PER_SESSION)]
        assert await advanced.get_items(branch_id="alt") == [_item("a", 0), _item("a", 1)]
        await store.session("b").add_items([{"role": "user", "content": "after"}])
        async with engine.connect() as conn:
            newest = select(func.max(m.c.position)).where(m.c.session_id == "b")
            assert (await conn.execute(newest)).scalar_one() == PER_SESSION + 1
        assert await store.session("b").pop_item() == {"role": "user", "content": "after"}
        await store.session("c").add_items([{"role": "user", "content": "kept"}])
        # popped: its position is not handed out again (the counter never goes back)
        await store.session("b").add_items([{"role": "user", "content": "again"}])
        async with engine.connect() as conn:
            newest = select(func.max(m.c.position)).where(m.c.session_id == "b")
            assert (await conn.execute(newest)).scalar_one() == PER_SESSION + 2

        await migrations.downgrade(engine, revision="0005", **kw(names))
        await _ids_per_session(engine, names)
        assert await _structure_contents(engine, names, head=False) == before
        assert await _usage(engine, names) == usage

        await migrations.upgrade(engine, **kw(names))
        assert await migrations.check(engine, **kw(names)) == []
        assert await _structure_contents(engine, names, head=True) == before
        items = await SessionStore(engine, **kw(names)).session("a").get_items()
        assert items == [*(_item("a", i) for i in range(PER_SESSION)), {"n": "new"}]
    finally:
        await engine.dispose()
