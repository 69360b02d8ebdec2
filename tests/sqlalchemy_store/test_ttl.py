"""Expiry on the read and write paths, on every database and both runners.

No test waits for a clock: a session is made expired by writing a deadline in the
past (``expire``), as a deadline that has just passed looks to the database.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import agents
import pytest
from advanced_items import answer, call, output, run_result, user
from sqlalchemy import bindparam, event, func, select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine

from agents_memory import (
    AdvancedSQLAlchemySession,
    AdvancedSQLiteSession,
    SchemaNotReadyError,
    SessionNotFoundError,
    SessionStore,
    SQLAlchemySession,
    SQLiteSession,
    TableNames,
    create_engine,
    get_models,
    migrations,
)
from agents_memory._databases import sqlite as lite
from agents_memory._databases.base import observed
from agents_memory._sqlalchemy._store import backend_of

HOUR = dt.timedelta(hours=1)
PAST = dt.datetime(2020, 1, 1)  # noqa: DTZ001 - the store keeps naive UTC


def _observe(_conn: Any, _cursor: Any, _statement: str, *_: Any) -> None:
    """An execution listener: the engine is observed, so its statements go through SQLAlchemy."""


@pytest.fixture(params=["driver", "sqlalchemy"])
def runner(request: pytest.FixtureRequest, engine: AsyncEngine) -> Iterator[str]:
    """Each test once on the database's driver runner and once on the SQLAlchemy runner."""
    core = request.param == "sqlalchemy"
    if core:
        event.listen(engine.sync_engine, "before_cursor_execute", _observe)
    assert observed(engine) == core
    yield request.param
    if core:
        event.remove(engine.sync_engine, "before_cursor_execute", _observe)


def store_on(engine: AsyncEngine, names: TableNames, **kw: Any) -> SessionStore:
    return SessionStore(
        engine,
        sessions_table=names.sessions,
        messages_table=names.messages,
        create_tables=True,
        **kw,
    )


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


async def expire(store: SessionStore, *sids: str, at: dt.datetime = PAST) -> None:
    """Move the deadline of ``sids`` to ``at`` (a time passed), behind the library's back."""
    backend = backend_of(store)
    s = backend.st.sessions
    kind = backend.db.stamp_type(s.c.expires_at.type)
    statement = (
        update(s).where(s.c.session_id.in_(sids)).values(expires_at=bindparam("at", type_=kind))
    )
    async with store.engine.begin() as conn:
        await conn.execute(statement, {"at": backend.db.stamp(at)})


async def stored(store: SessionStore, sid: str) -> list[Any]:
    """Every item row of ``sid`` as stored, expired or not (oldest first)."""
    m = backend_of(store).st.messages
    query = select(m.c.message_data).where(m.c.session_id == sid).order_by(m.c.position)
    async with store.engine.connect() as conn:
        return [json.loads(r) for r in (await conn.execute(query)).scalars()]


def near(value: dt.datetime | None, before: dt.datetime, after: dt.datetime) -> bool:
    """``value`` lies in ``[before, after]`` (to the database's precision: 1 ms slack)."""
    slack = dt.timedelta(milliseconds=1)
    return value is not None and before - slack <= value <= after + slack


async def test_store_ttl_is_renewed_by_every_write(
    runner: str, engine: AsyncEngine, names: TableNames
) -> None:
    """add_items and replace_items each move the deadline to now + ttl; reads do not."""
    store = store_on(engine, names, ttl=HOUR)
    s = store.session("a")
    before = now()
    await s.add_items([{"i": 0}])
    first = await s.expires_at()
    assert near(first, before + HOUR, now() + HOUR)
    await expire(store, "a", at=now() + dt.timedelta(minutes=1))  # close, not passed
    assert await s.get_items() == [{"i": 0}]
    assert (await s.expires_at()) is not None
    assert await s.expires_at() < before + HOUR  # type: ignore[operator]  # reads renew nothing
    before = now()
    await s.add_items([{"i": 1}])
    assert near(await s.expires_at(), before + HOUR, now() + HOUR)
    await expire(store, "a", at=now() + dt.timedelta(minutes=1))
    before = now()
    await s.replace_items([{"i": 2}])
    assert near(await s.expires_at(), before + HOUR, now() + HOUR)
    assert await s.get_items() == [{"i": 2}]
    # a store without ttl leaves a deadline that has not passed as it is
    plain = store_on(engine, names)
    await plain.session("a").add_items([{"i": 3}])
    assert near(await s.expires_at(), before + HOUR, now() + HOUR)
    with pytest.raises(ValueError, match="ttl"):
        store_on(engine, names, ttl=dt.timedelta(0))
    with pytest.raises(ValueError, match="ttl"):
        SQLAlchemySession("x", engine=engine, ttl=5)  # type: ignore[arg-type]


async def test_expired_session_reads_as_empty(
    runner: str, engine: AsyncEngine, names: TableNames
) -> None:
    """Before any prune: no items, no pop, no fork; the rows are still there for prune."""
    store = store_on(engine, names)
    s = store.session("gone")
    await s.add_items([{"i": i} for i in range(5)])
    await store.session("other").add_items([{"i": 9}])
    await expire(store, "gone")
    assert await s.get_items() == []
    assert await s.get_items(limit=2) == []
    assert [x async for x in s.iter_items(batch_size=2)] == []
    assert await s.pop_item() is None
    with pytest.raises(SessionNotFoundError):
        await store.fork("gone", "copy")
    assert await store.get_session("gone") is None
    assert await stored(store, "gone") == [{"i": i} for i in range(5)]  # untouched until prune
    assert await store.session("other").get_items() == [{"i": 9}]
    assert await store.session("other").pop_item() == {"i": 9}
    report = await store.prune()
    assert report.sessions_deleted == 1
    assert await stored(store, "gone") == []


async def test_set_ttl_on_an_expired_session_does_not_bring_it_back(
    runner: str, engine: AsyncEngine, names: TableNames
) -> None:
    """A new deadline on an expired session: its old items are gone, the row stays."""
    store = store_on(engine, names)
    s = store.session("late")
    await s.add_items([{"i": 0}, {"i": 1}])
    await s.set_ttl(HOUR)  # not expired: the items stay
    assert await s.get_items() == [{"i": 0}, {"i": 1}]
    await expire(store, "late")
    await s.set_ttl(HOUR)
    assert await s.get_items() == []
    assert await stored(store, "late") == []
    assert await store.get_session("late") is not None
    await s.add_items([{"i": 2}])
    assert await s.get_items() == [{"i": 2}]


@pytest.mark.parametrize("ttl", [None, HOUR], ids=["no-ttl", "ttl"])
async def test_write_to_expired_session_starts_afresh(
    runner: str, engine: AsyncEngine, names: TableNames, ttl: dt.timedelta | None
) -> None:
    """The old items go in the write's own transaction; the deadline is cleared or renewed."""
    store = store_on(engine, names, ttl=ttl)
    s = store.session("again")
    await s.add_items([{"old": i} for i in range(3)])
    await expire(store, "again")
    before = now()
    await s.add_items([{"new": 0}, {"new": 1}])
    assert await s.get_items() == [{"new": 0}, {"new": 1}]
    assert await stored(store, "again") == [{"new": 0}, {"new": 1}]
    if ttl is None:
        assert await s.expires_at() is None
    else:
        assert near(await s.expires_at(), before + ttl, now() + ttl)
    assert await store.get_session("again") is not None
    # replace_items on an expired session: the new history, live again
    await expire(store, "again")
    await s.replace_items([{"r": 1}])
    assert await s.get_items() == [{"r": 1}]
    assert await store.get_session("again") is not None
    assert (await store.prune()).sessions_deleted == 0


async def test_fork_target_gets_the_store_deadline(
    runner: str, engine: AsyncEngine, names: TableNames
) -> None:
    """A fork's new session expires ttl after the fork; without ttl it never does."""
    store = store_on(engine, names, ttl=HOUR)
    await store.session("src").add_items([{"role": "user", "content": "hi"}])
    before = now()
    await store.fork("src", "dst")
    assert near(await store.session("dst").expires_at(), before + HOUR, now() + HOUR)
    plain = store_on(engine, names)
    await plain.session("nodeadline").add_items([{"role": "user", "content": "hi"}])
    await plain.fork("nodeadline", "dst3")  # a source without a deadline is live
    assert await plain.session("dst3").expires_at() is None
    await plain.fork("src", "dst2")
    assert await plain.session("dst2").expires_at() is None
    assert await plain.session("dst2").get_items() == [{"role": "user", "content": "hi"}]


async def test_writers_racing_a_prune(runner: str, engine: AsyncEngine, names: TableNames) -> None:
    """Each expired session ends holding exactly the racing write's item, whoever went first.

    The prune walks sessions in id order while the writer writes to them in reverse
    order: sessions the writer reaches first are live again when the prune looks
    (kept), the others are deleted first and the write starts them afresh. Both
    outcomes must occur; the report counts the second.
    """
    store = store_on(engine, names)
    sids = [f"s{i:03}" for i in range(150)]
    for sid in sids:
        await store.session(sid).add_items([{"old": sid}, {"old": 2}])
    kept_seen = deleted_seen = 0
    for _round in range(5):
        await expire(store, *sids)

        async def writer() -> None:
            for sid in reversed(sids):
                await store.session(sid).add_items([{"new": sid}])

        report, _ = await asyncio.gather(store.prune(), writer())
        for sid in sids:
            assert await stored(store, sid) == [{"new": sid}], sid
        deleted_seen += report.sessions_deleted
        kept_seen += len(sids) - report.sessions_deleted
        if kept_seen and deleted_seen:
            break
        for sid in sids:  # the next round starts from old items again
            await store.session(sid).replace_items([{"old": sid}, {"old": 2}])
    assert kept_seen > 0, "the writer never renewed a session before the prune reached it"
    assert deleted_seen > 0, "the prune never deleted a session before its write"


async def test_unmigrated_tables_keep_the_plain_statements(
    runner: str, engine: AsyncEngine, names: TableNames
) -> None:
    """Tables without expires_at (never migrated) are read and written as before; ttl= refuses."""
    kw = {"sessions_table": names.sessions, "messages_table": names.messages}
    await migrations.upgrade(engine, revision="0001", **kw)
    async with engine.begin() as conn:
        await conn.execute(text(f"DROP TABLE {names.version_table}"))
    store = SessionStore(engine, **kw)
    s = store.session("s1")
    await s.add_items([{"i": 0}, {"i": 1}])
    await s.replace_items([{"i": 2}, {"i": 3}])
    assert await s.get_items() == [{"i": 2}, {"i": 3}]
    assert await s.get_items(limit=1) == [{"i": 3}]
    assert await s.pop_item() == {"i": 3}
    await store.session("s2").add_items([{"j": 0}])  # (a fork needs 0002's metadata column)
    with pytest.raises(SchemaNotReadyError, match="expires_at"):
        await SessionStore(engine, ttl=HOUR, **kw).session("s1").add_items([{"i": 4}])
    assert await migrations.current(engine, **kw) is None  # nothing was migrated
    m = backend_of(store).st.messages
    async with engine.connect() as conn:
        count = (await conn.execute(select(func.count()).select_from(m))).scalar_one()
    assert count == 2  # s1's {i: 2}, s2's {j: 0}


async def test_sqlite_session_ttl(tmp_path: Path) -> None:
    """The stdlib SQLiteSession: ttl renewed by writes, expired reads empty, restarts fresh."""
    path = tmp_path / "ttl.db"
    with SQLiteSession("a", path, ttl=HOUR) as s:
        before = now()
        await s.add_items([{"i": 0}, {"i": 1}])
        async with SessionStore.from_url(f"sqlite:///{path}") as store:
            view = store.session("a")
            assert near(await view.expires_at(), before + HOUR, now() + HOUR)
            await expire(store, "a")
            assert await s.get_items() == []
            assert await s.pop_item() is None
            await s.add_items([{"i": 2}])
            assert await s.get_items() == [{"i": 2}]
            assert await stored(store, "a") == [{"i": 2}]
            assert near(await view.expires_at(), before + HOUR, now() + HOUR)
            await expire(store, "a")
            await s.replace_items([{"i": 3}])
            assert await s.get_items() == [{"i": 3}]
    with pytest.raises(ValueError, match="ttl"):
        SQLiteSession("a", path, ttl=dt.timedelta(seconds=-1))


def _vm_steps(conn: sqlite3.Connection, sql: str, params: tuple[Any, ...]) -> int:
    """How many SQLite virtual-machine instructions (in tens) a statement runs."""
    steps = 0

    def tick() -> int:
        nonlocal steps
        steps += 1
        return 0

    conn.set_progress_handler(tick, 10)
    try:
        conn.execute(sql, params)
    finally:
        conn.set_progress_handler(None, 10)
    return steps


async def test_sqlite_expiry_check_of_an_append_does_not_walk_the_items(tmp_path: Path) -> None:
    """``drop_expired`` (run by every append) costs the same on 20 items as on 2,000.

    Its first form, ``… AND EXISTS (deadline passed)``, made SQLite walk every item
    of a live session to delete none: appends slowed down as a session grew. Counted
    in SQLite's own instructions (its progress handler), not timed.
    """
    path = tmp_path / "walk.db"
    names = TableNames()
    with SQLiteSession("short", path) as short, SQLiteSession("long", path) as long_:
        await short.add_items([{"i": i} for i in range(20)])
        await long_.add_items([{"i": i} for i in range(2000)])
    drop = lite.compiled(names, expiry=True)["drop_expired"]
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        clock = lite.now()
        conn.execute("BEGIN")
        conn.execute(drop.sql, drop.positional({"sid": "short", "now": clock}))  # schema read
        steps = {
            sid: _vm_steps(conn, drop.sql, drop.positional({"sid": sid, "now": clock}))
            for sid in ("short", "long")
        }
        assert steps["long"] == steps["short"]  # nothing deleted, nothing walked
        assert conn.execute("SELECT count(*) FROM agent_messages").fetchone() == (2020,)
        conn.execute("ROLLBACK")
    finally:
        conn.close()
    async with SessionStore.from_url(f"sqlite:///{path}") as store:  # still deletes when due
        await expire(store, "long")
        with SQLiteSession("long", path) as s:
            await s.add_items([{"i": "new"}])
            assert await s.get_items() == [{"i": "new"}]


async def test_a_new_sessions_first_append_waits_for_no_other_sessions_items(
    backend: Any, store: SessionStore
) -> None:
    """Its expiry check (``drop_expired``) reads its own session's items only.

    On MySQL/MariaDB, base's ``session_id IN (the id, if expired)`` ran as a full scan of
    the items with next-key locks: a new session's first append waited for any
    transaction holding another session's items (and held up every other append
    meanwhile). Here a transaction holds every item of "busy" while "newer" is appended;
    "middle" sorts between the two, so the holder's own gap lock (InnoDB's, up to the
    next key after busy's items) ends before where newer's items go.
    """
    if backend.kind == "sqlite":
        pytest.skip("SQLite has one writer: an open write transaction holds every append")
    await store.session("busy").add_items([{"n": i} for i in range(3)])
    await store.session("middle").add_items([{"n": 0}])
    await expire(store, "busy")  # (an expired session's items: what drop_expired looks for)
    messages = store.table_names.messages
    other = create_engine(backend.url)
    try:
        async with other.connect() as conn:
            held = text(f"SELECT position FROM {messages} WHERE session_id = 'busy' FOR UPDATE")
            assert len((await conn.execute(held)).all()) == 3
            await asyncio.wait_for(store.session("newer").add_items([{"n": 1}]), 20)
            await conn.rollback()
    finally:
        await other.dispose()
    assert await store.session("newer").get_items() == [{"n": 1}]


async def test_sqlite_session_on_sdk_tables(tmp_path: Path) -> None:
    """A file the Agents SDK wrote (no expires_at): read and written as before; ttl= refuses."""
    path = tmp_path / "sdk.db"
    sdk = agents.SQLiteSession("a", str(path))
    await sdk.add_items([{"role": "user", "content": "hi"}])
    sdk.close()
    with SQLiteSession("a", path) as s:
        await s.add_items([{"role": "user", "content": "ours"}])
        assert len(await s.get_items()) == 2
        assert await s.pop_item() == {"role": "user", "content": "ours"}
    with pytest.raises(SchemaNotReadyError, match="expires_at"):
        SQLiteSession("a", path, ttl=HOUR)


async def test_compaction_snapshot_of_an_expired_session(
    runner: str, engine: AsyncEngine, names: TableNames
) -> None:
    """The SDK's partial-compaction hook sees expiry as every read and write does.

    A snapshot of an expired session is empty; a snapshot taken before the session
    expired is stale once it has (the old history is not compacted back to life);
    a swap is a write, so it renews the store's deadline.
    """
    store = store_on(engine, names, ttl=HOUR)
    s = store.session("c")
    history = [{"role": "user", "content": f"q {i}"} for i in range(6)]
    summary = [{"role": "user", "content": "summary"}]
    await s.add_items(history)
    snap = await s._get_compaction_snapshot(3)
    assert snap is not None
    assert snap.items == history[-3:]
    await expire(store, "c")
    assert await snap.replace_suffix(0, summary) is False
    assert await stored(store, "c") == history  # nothing deleted or inserted by the stale swap
    empty = await s._get_compaction_snapshot(3)
    assert empty is not None
    assert (empty.items, empty.complete) == ([], True)
    # live again (a write starts it afresh): a swap renews the deadline
    await s.add_items(history[:4])
    await expire(store, "c", at=now() + dt.timedelta(minutes=1))
    fresh = await s._get_compaction_snapshot(2)
    assert fresh is not None
    before = now()
    assert await fresh.replace_suffix(0, summary) is True
    assert await s.get_items() == [*history[:2], *summary]
    assert near(await s.expires_at(), before + HOUR, now() + HOUR)


async def test_sqlite_session_compaction_snapshot_of_an_expired_session(tmp_path: Path) -> None:
    """The stdlib SQLiteSession's hook: the same rules as SQLAlchemySession's."""
    path = tmp_path / "snap.db"
    history = [{"role": "user", "content": f"q {i}"} for i in range(6)]
    summary = [{"role": "user", "content": "summary"}]
    with SQLiteSession("c", path, ttl=HOUR) as s:
        await s.add_items(history)
        snap = await s._get_compaction_snapshot(3)
        assert snap is not None
        async with SessionStore.from_url(f"sqlite:///{path}") as store:
            await expire(store, "c")
            assert await snap.replace_suffix(0, summary) is False
            assert await stored(store, "c") == history
            empty = await s._get_compaction_snapshot(3)
            assert empty is not None
            assert empty.items == []
            await s.add_items(history[:4])
            await expire(store, "c", at=now() + dt.timedelta(minutes=1))
            fresh = await s._get_compaction_snapshot(2)
            assert fresh is not None
            before = now()
            assert await fresh.replace_suffix(0, summary) is True
            assert await s.get_items() == [*history[:2], *summary]
            assert near(await store.session("c").expires_at(), before + HOUR, now() + HOUR)


# -- advanced sessions: the same expiry as plain ones ------------------------------------------


async def advanced_rows(store: SessionStore, sid: str) -> dict[str, int]:
    """How many rows ``sid`` has in each table advanced sessions keep beside the items."""
    models = get_models(store.table_names)
    counts = {}
    async with store.engine.connect() as conn:
        for name in ("Structure", "TurnUsage", "Branch"):
            t = getattr(models, name).__table__
            query = select(func.count()).select_from(t).where(t.c.session_id == sid)
            counts[name] = int((await conn.execute(query)).scalar_one())
    return counts


async def branched(s: AdvancedSQLAlchemySession) -> None:
    """Two turns on main with usage, a branch 'b' from turn 2 with a turn and usage of its own."""
    await s.add_items([user("q1 apple"), answer("a1")])
    await s.store_run_usage(run_result(1, 10, 1))
    await s.add_items([user("q2"), call("lookup", "c1"), output("c1"), answer("a2")])
    await s.store_run_usage(run_result(2, 20, 2))
    await s.create_branch_from_turn(2, "b")
    await s.add_items([user("q2b"), answer("a2b")])
    await s.store_run_usage(run_result(3, 30, 3))


async def test_advanced_store_ttl_is_renewed_by_every_write(
    runner: str, engine: AsyncEngine, names: TableNames
) -> None:
    """add_items, replace_items and create_branch_from_turn each renew; reads and pops do not."""
    store = store_on(engine, names, ttl=HOUR)
    s = store.advanced_session("adv")
    writes = [
        lambda: s.add_items([user("q1"), answer("a1")]),
        lambda: s.add_items([user("q2"), answer("a2")]),
        lambda: s.replace_items([user("r1"), answer("r2"), user("r3")]),
        lambda: s.create_branch_from_turn(2, "b"),
    ]
    for write in writes:
        before = now()
        await write()
        assert near(await s.expires_at(), before + HOUR, now() + HOUR)
        await expire(store, "adv", at=now() + dt.timedelta(minutes=1))  # close, not passed
    close = await s.expires_at()
    await s.store_run_usage(run_result(1, 1, 1))
    assert await s.get_items() == [user("r1"), answer("r2")]  # branch 'b': turn 1 of main
    assert await s.pop_item() == answer("r2")
    assert await s.list_branches()
    assert await s.expires_at() == close
    # Plain stores (no ttl) leave a deadline that has not passed as it is.
    await store_on(engine, names).advanced_session("adv").add_items([user("x")])
    assert await s.expires_at() == close


async def test_advanced_expired_session_reads_as_empty(
    runner: str, engine: AsyncEngine, names: TableNames
) -> None:
    """Every read answers as for a new session; pop, usage and delete_branch find nothing."""
    store = store_on(engine, names)
    s = store.advanced_session("gone")
    await branched(s)
    await s.switch_to_branch("main")
    fresh = store.advanced_session("never-written")
    await expire(store, "gone")
    for session in (s, fresh):
        assert await session.get_items() == []
        assert await session.get_items(limit=1) == []
        assert await session.get_items(branch_id="b") == []
        assert [x async for x in session.iter_items()] == []
        assert await session.get_conversation_turns() == []
        assert await session.get_conversation_by_turns() == {}
        assert await session.find_turns_by_content("apple") == []
        assert await session.get_tool_usage() == []
        assert await session.get_session_usage() is None
        assert await session.get_session_usage("b") is None
        assert await session.get_turn_usage() == []
        assert await session.get_turn_usage(1) == {}
        assert await session.list_branches() == []
        with pytest.raises(ValueError, match="does not exist"):
            await session.switch_to_branch("b")
        with pytest.raises(ValueError, match="does not exist"):
            await session.delete_branch("b")
        with pytest.raises(ValueError, match="No user turns"):
            await session.create_branch_from_content("apple")
        assert await session.pop_item() is None
        await session.store_run_usage(run_result(5, 5, 5))  # no turn: nothing stored
    assert await store.session("gone").get_items() == []
    assert await store.get_session("gone") is None
    # Nothing was deleted by the reads and refused writes: the rows wait for prune.
    assert await advanced_rows(store, "gone") == {"Structure": 10, "TurnUsage": 3, "Branch": 1}
    assert len(await stored(store, "gone")) == 8
    assert (await store.prune()).sessions_deleted == 1
    assert await advanced_rows(store, "gone") == {"Structure": 0, "TurnUsage": 0, "Branch": 0}


@pytest.mark.parametrize("ttl", [None, HOUR], ids=["no-ttl", "ttl"])
@pytest.mark.parametrize("write", ["add", "replace", "branch"])
async def test_advanced_write_to_expired_session_starts_afresh(
    runner: str, engine: AsyncEngine, names: TableNames, ttl: dt.timedelta | None, write: str
) -> None:
    """Items, turns, usage and branch names all go in the write's transaction; back on main."""
    store = store_on(engine, names, ttl=ttl)
    s = store.advanced_session("again")
    await branched(s)
    assert s.current_branch_id == "b"
    await expire(store, "again")
    before = now()
    if write == "branch":  # refused (no such turn any more): rolled back, still expired
        with pytest.raises(ValueError, match="does not contain"):
            await s.create_branch_from_turn(1, "c")
        assert await advanced_rows(store, "again") == {
            "Structure": 10,
            "TurnUsage": 3,
            "Branch": 1,
        }
        assert await s.get_items() == []
        await s.add_items([user("n1"), answer("n2")])
    elif write == "add":
        await s.add_items([user("n1"), answer("n2")])
    else:
        await s.replace_items([user("n1"), answer("n2")])
    assert s.current_branch_id == "main"
    assert await s.get_items() == [user("n1"), answer("n2")]
    assert await stored(store, "again") == [user("n1"), answer("n2")]
    assert await advanced_rows(store, "again") == {"Structure": 2, "TurnUsage": 0, "Branch": 0}
    assert await s.get_session_usage() is None
    assert await s.get_turn_usage() == []
    assert [b["branch_id"] for b in await s.list_branches()] == ["main"]
    assert [t["turn"] for t in await s.get_conversation_turns()] == [1]
    if ttl is None:
        assert await s.expires_at() is None
    else:
        assert near(await s.expires_at(), before + ttl, now() + ttl)
    # The old branch name is free again, and a branch made now works as on any session.
    await s.add_items([user("n3"), answer("n4")])
    assert await s.create_branch_from_turn(2, "b") == "b"
    await s.add_items([user("n3b")])
    assert await s.get_items() == [user("n1"), answer("n2"), user("n3b")]
    await s.store_run_usage(run_result(1, 7, 7))
    assert (await s.get_session_usage()) == {
        "requests": 1,
        "input_tokens": 7,
        "output_tokens": 7,
        "total_tokens": 14,
        "total_turns": 1,
    }
    await s.switch_to_branch("main")
    assert await s.get_items() == [user("n1"), answer("n2"), user("n3"), answer("n4")]
    assert (await store.prune()).sessions_deleted == 0


async def test_advanced_sqlite_session_ttl(tmp_path: Path) -> None:
    """AdvancedSQLiteSession(ttl=): renewed by writes, expired reads empty, restarts fresh."""
    path = tmp_path / "adv.db"
    s = AdvancedSQLiteSession(session_id="a", db_path=path, create_tables=True, ttl=HOUR)
    try:
        before = now()
        await branched(s)
        async with SessionStore.from_url(f"sqlite:///{path}") as store:
            view = store.session("a")
            assert near(await view.expires_at(), before, now() + HOUR)
            await expire(store, "a")
            assert await s.get_items() == []
            assert await s.list_branches() == []
            assert await s.get_session_usage() is None
            before = now()
            await s.add_items([user("fresh")])
            assert near(await view.expires_at(), before + HOUR, now() + HOUR)
            assert await s.get_items() == [user("fresh")]
            assert await advanced_rows(store, "a") == {"Structure": 1, "TurnUsage": 0, "Branch": 0}
    finally:
        await s.aclose()
