"""Expiry across ``export``, ``import`` and ``copy``: what reads as gone stays gone, deadlines move.

An expired session reads as empty and is absent from listings, so a move leaves it
out; a live session's deadline travels with it (a JSON Lines field, ``expires_at``,
written only when set); a target store with ``ttl=`` gives what it receives its own
deadline, as any write there would. No test waits for a clock: deadlines are
written in the past (``expire``) or far ahead.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from sqlalchemy import bindparam, update
from sqlalchemy.ext.asyncio import AsyncEngine

from agents_memory import SessionStore, TableNames, migrations
from agents_memory._sqlalchemy._bulk import ItemRecord, SessionRecord, SessionWrite, bulk_for
from agents_memory._sqlalchemy._store import backend_of

T0 = dt.datetime.fromisoformat("2024-07-01 10:00:00.123456")
PAST = dt.datetime(2020, 1, 1)  # noqa: DTZ001 - the store keeps naive UTC
LATER = dt.datetime(2100, 1, 1, 12, 30, 15, 250000)  # noqa: DTZ001
HOUR = dt.timedelta(hours=1)


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


async def expire(store: SessionStore, sid: str, at: dt.datetime = PAST) -> None:
    """Move ``sid``'s deadline to ``at``, behind the library's back."""
    backend = backend_of(store)
    s = backend.st.sessions
    kind = backend.db.stamp_type(s.c.expires_at.type)
    statement = (
        update(s).where(s.c.session_id == sid).values(expires_at=bindparam("at", type_=kind))
    )
    async with store.engine.begin() as conn:
        await conn.execute(statement, {"at": backend.db.stamp(at)})


async def seed(store: SessionStore) -> None:
    """'live' (no deadline), 'dated' (a deadline far ahead) and 'gone' (expired), 2 items each."""
    for sid in ("live", "dated", "gone"):
        await store.session(sid).add_items([{"role": "user", "content": sid}, {"n": 2}])
    await expire(store, "dated", LATER)
    await expire(store, "gone")


async def test_export_leaves_out_expired_and_carries_deadlines(
    cli, store: SessionStore, tmp_path: Path
) -> None:
    """The file holds what list_sessions shows; a deadline comes back on import."""
    await seed(store)
    path = tmp_path / "e.jsonl"
    done = await cli("export", "-o", str(path))
    assert done.stdout.startswith("exported 2 sessions (4 items) from ")
    headers = [json.loads(line) for line in path.read_text().splitlines()]
    headers = [h for h in headers if "session" in h]
    assert [h["session"] for h in headers] == ["dated", "live"]
    assert headers[0]["expires_at"] == LATER.isoformat()
    assert "expires_at" not in headers[1]  # none set: the header is as before
    listed = {s.session_id for s in (await store.list_sessions()).sessions}
    assert listed == {"dated", "live"}
    # A named expired session is not found, as get_session does not find it.
    missing = await cli("export", "-o", str(tmp_path / "x.jsonl"), "gone", code=1)
    assert "gone" in missing.stderr + missing.stdout

    await cli("db", "downgrade", "base", "--yes")
    imported = await cli.json("import", str(path))
    assert (imported["sessions"], imported["items_written"]) == (2, 4)
    assert await store.session("dated").expires_at() == LATER
    assert await store.session("live").expires_at() is None
    assert await store.get_session("gone") is None


async def test_import_over_an_expired_target_session_starts_it_afresh(
    cli, store: SessionStore, tmp_path: Path
) -> None:
    """The target's expired session (absent to reads) is replaced, not appended to or resumed."""
    await seed(store)
    path = tmp_path / "e.jsonl"
    await cli("export", "-o", str(path), "live")
    await store.session("live").add_items([{"extra": 1}])
    await expire(store, "live")
    imported = await cli.json("import", str(path))
    assert (imported["sessions_written"], imported["items_written"]) == (1, 2)
    assert await store.session("live").get_items() == [
        {"role": "user", "content": "live"},
        {"n": 2},
    ]
    assert await store.session("live").expires_at() is None
    again = await cli.json("import", str(path))
    assert (again["items_written"], again["sessions_unchanged"]) == (0, 1)


async def test_import_of_a_passed_deadline_arrives_expired(
    cli, store: SessionStore, tmp_path: Path
) -> None:
    """A file's deadline that has passed since the export: the session arrives expired."""
    header = {
        "session": "old",
        "created_at": T0.isoformat(),
        "updated_at": T0.isoformat(),
        "metadata": None,
        "expires_at": PAST.isoformat(),
    }
    item = {"item": {"n": 1}, "created_at": T0.isoformat()}
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(header) + "\n" + json.dumps(item) + "\n")
    await cli("import", str(path))
    assert await store.get_session("old") is None
    assert await store.session("old").get_items() == []
    assert (await store.prune()).sessions_deleted == 1


async def test_copy_leaves_out_expired_and_carries_deadlines(
    cli, engine: AsyncEngine, names: TableNames, tmp_path: Path
) -> None:
    """copy: the same rule as export, from a SQLite file into the store under test."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'source.db'}"
    kw = {"sessions_table": names.sessions, "messages_table": names.messages}
    await migrations.upgrade(url, **kw)
    async with SessionStore.from_url(url, **kw) as source:
        await seed(source)
    result = await cli.json("copy", "--from", url, "--to", cli.url)
    assert (result["sessions"], result["items_written"]) == (2, 4)
    async with SessionStore(engine, **kw) as target:
        assert await target.session("dated").expires_at() == LATER
        assert await target.session("live").expires_at() is None
        assert await target.session("gone").get_items() == []
        assert await target.get_session("gone") is None
        # the target's own copy of a session, expired there, is started afresh by the copy
        await target.session("live").add_items([{"extra": 1}])
        await expire(target, "live")
        again = await cli.json("copy", "--from", url, "--to", cli.url)
        assert again["items_written"] == 2
        assert await target.session("live").get_items() == [
            {"role": "user", "content": "live"},
            {"n": 2},
        ]


async def test_a_target_with_ttl_gives_its_deadline(engine: AsyncEngine, names: TableNames) -> None:
    """Into a store with ttl=, each session written gets now + ttl, as a write there would.

    A carried deadline that has passed is kept: the session arrives expired.
    """
    kw = {"sessions_table": names.sessions, "messages_table": names.messages}
    async with SessionStore(engine, create_tables=True, ttl=HOUR, **kw) as store:
        bulk = bulk_for(store)
        before = now()
        await bulk.write(
            [
                SessionWrite(SessionRecord("a", T0, T0), [ItemRecord({"n": 1}, T0)]),
                SessionWrite(SessionRecord("b", T0, T0, None, LATER), [ItemRecord({"n": 2}, T0)]),
                SessionWrite(SessionRecord("c", T0, T0, None, PAST), [ItemRecord({"n": 3}, T0)]),
            ]
        )
        after = now()
        slack = dt.timedelta(milliseconds=1)
        for sid in ("a", "b"):
            deadline = await store.session(sid).expires_at()
            assert deadline is not None
            assert before + HOUR - slack <= deadline <= after + HOUR + slack
        assert await store.session("c").get_items() == []
        states = await bulk.states_after(None, 10)
        assert [s.record.session_id for s in states] == ["a", "b"]
