"""SQLiteSession (stdlib sqlite3) on its own and next to SQLAlchemySession.

The shared contract, files exchanged with SQLAlchemySession (both directions),
concurrency from tasks, threads and processes, rollback on failure, and closing.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import agents
import agents.memory as sdk_memory
import pytest
from agents import testing
from session_contract import SessionContract, msg

from agents_memory import (
    DatabaseConnectionError,
    Session,
    SessionClosedError,
    SessionSettings,
    SessionStore,
    SQLAlchemySession,
    SQLiteSession,
    TableNames,
    migrations,
)


class FileHarness:
    """The contract's view of SQLiteSessions on one database file."""

    def __init__(self, path: Path, names: TableNames) -> None:
        self.path = path
        self.names = names
        self.made: list[SQLiteSession] = []

    def session(
        self, session_id: str, *, session_settings: SessionSettings | None = None
    ) -> SQLiteSession:
        """A new SQLiteSession (its own connection) on the file."""
        s = SQLiteSession(
            session_id, self.path, self.names.sessions, self.names.messages, session_settings
        )
        self.made.append(s)
        return s

    async def exists(self, session_id: str) -> bool:
        """Whether the file holds the session's row."""
        with contextlib.closing(sqlite3.connect(self.path)) as conn:
            tables = "SELECT 1 FROM sqlite_master WHERE name = ?"
            if conn.execute(tables, (self.names.sessions,)).fetchone() is None:
                return False  # no table yet: nothing was ever written
            query = f"SELECT 1 FROM {self.names.sessions} WHERE session_id = ?"
            return conn.execute(query, (session_id,)).fetchone() is not None

    async def insert_raw(self, session_id: str, data: str) -> None:
        """Insert a row with plain sqlite3, bypassing the session."""
        s, m = self.names.sessions, self.names.messages
        with contextlib.closing(sqlite3.connect(self.path)) as conn, conn:
            conn.execute(
                f"UPDATE {s} SET last_position = last_position + 1 WHERE session_id = ?",
                (session_id,),
            )
            conn.execute(
                f"INSERT INTO {m} (session_id, position, message_data) "
                f"SELECT session_id, last_position, ? FROM {s} WHERE session_id = ?",
                (data, session_id),
            )


class TestSQLiteSessionContract(SessionContract):
    """The shared Session contract, for SQLiteSessions on a database file."""

    @pytest.fixture
    def harness(self, tmp_path: Path, names: TableNames) -> Iterator[FileHarness]:
        """A fresh file; every session made on it is closed afterwards."""
        h = FileHarness(tmp_path / "contract.db", names)
        yield h
        for s in h.made:
            s.close()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "memory.db"


def query(path: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute(sql, params).fetchall()


def execute(path: Path, sql: str) -> None:
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute(sql)


# -- construction -----------------------------------------------------------------------------


async def test_in_memory_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without db_path the history lives in memory, private to the session, and no file appears."""
    monkeypatch.chdir(tmp_path)
    with SQLiteSession("s") as a, SQLiteSession("s") as b:
        assert isinstance(a, Session)
        assert a.db_path == ":memory:"
        await a.add_items([msg(1), msg(2)])
        assert await a.get_items(limit=1) == [msg(2)]
        assert await b.get_items() == []
        assert await a.pop_item() == msg(2)
        await a.clear_session()
        assert await a.get_items() == []
    assert await asyncio.to_thread(lambda: list(tmp_path.iterdir())) == []


async def test_path_or_str(db: Path) -> None:
    """db_path may be a Path or a str naming the same file."""
    with SQLiteSession("s", db) as a:
        await a.add_items([msg(1)])
    with SQLiteSession("s", str(db)) as b:
        assert await b.get_items() == [msg(1)]
        assert b.db_path == str(db)
        assert b.sessions_table == "agent_sessions"
        assert b.messages_table == "agent_messages"


@pytest.mark.parametrize("name", ["bad-name", "1abc", "a b", "x;drop", "", "a" * 64, "ü"])
def test_bad_table_names(db: Path, name: str) -> None:
    """Table names follow the one identifier rule (TableNames), as for SQLAlchemySession."""
    with pytest.raises(ValueError, match="table name"):
        SQLiteSession("s", db, sessions_table=name)
    with pytest.raises(ValueError, match="table name"):
        SQLiteSession("s", db, messages_table=name)


def test_bad_constructor_arguments(db: Path, tmp_path: Path) -> None:
    """Non-string names, equal names, odd paths and missing directories are refused up front."""
    with pytest.raises(TypeError):
        SQLiteSession("s", db, sessions_table=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must differ"):
        SQLiteSession("s", db, sessions_table="same", messages_table="same")
    with pytest.raises(TypeError, match="db_path"):
        SQLiteSession("s", 42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="memory"):
        SQLiteSession("s", "")
    with pytest.raises(FileNotFoundError, match="create it first"):
        SQLiteSession("s", tmp_path / "missing" / "x.db")


async def test_wal_and_busy_timeout(db: Path) -> None:
    """A file database is in WAL mode and its connection waits 30 s for a busy lock."""
    with SQLiteSession("s", db) as s:
        await s.add_items([msg(1)])
        timeout = await s._call(lambda c: c.execute("PRAGMA busy_timeout").fetchone()[0])
        foreign_keys = await s._call(lambda c: c.execute("PRAGMA foreign_keys").fetchone()[0])
    assert query(db, "PRAGMA journal_mode") == [("wal",)]
    assert timeout == 30_000
    assert foreign_keys == 1


# -- the same tables as SQLAlchemySession -----------------------------------------------------


def _schema(path: Path) -> set[tuple[Any, ...]]:
    """Objects and, per table, its columns (name, type, not-null, default, pk) and indexes.

    Structure, not DDL text: ALTER TABLE (as a migration runs it) and CREATE TABLE
    (as SQLiteSession runs it) spell the same table differently.
    """
    out: set[tuple[Any, ...]] = set()
    for kind, name in query(path, "SELECT type, name FROM sqlite_master"):
        if str(name).startswith("sqlite_"):
            continue
        out.add((kind, name))
        if kind == "table":
            out |= {(name, *c[1:]) for c in query(path, f"PRAGMA table_info({name})")}
            out |= {(name, *f[2:]) for f in query(path, f"PRAGMA foreign_key_list({name})")}
        else:
            out |= {(name, *c) for c in query(path, f"PRAGMA index_info({name})")}
    return out


async def test_schema_is_the_sqlalchemy_schema(tmp_path: Path, names: TableNames) -> None:
    """The tables, index and constraints SQLiteSession creates are exactly SQLAlchemySession's."""
    ours, theirs = tmp_path / "ours.db", tmp_path / "theirs.db"
    with SQLiteSession("s", ours, names.sessions, names.messages) as s:
        await s.add_items([msg(1)])
    async with SQLAlchemySession.from_url(
        "s",
        url=f"sqlite:///{theirs}",
        create_tables=True,
        sessions_table=names.sessions,
        messages_table=names.messages,
    ) as t:
        await t.add_items([msg(1)])
    assert _schema(ours) == _schema(theirs)
    derived = names.derived_names("sqlite")
    assert {
        r[1]
        for r in _schema(ours)
        if r[0] in ("table", "index") and not r[1].startswith("sqlite_autoindex_")
    } == {
        *names.tables,
        f"idx_{names.sessions}_updated_at",
        f"idx_{names.sessions}_expires_at",
        names.version_table,
        derived["structure_turn_index"],
        derived["structure_item_index"],
    }


async def test_new_file_is_recorded_at_head(tmp_path: Path, names: TableNames) -> None:
    """A file SQLiteSession creates is stamped at head: migrations see no work and no drift."""
    path = tmp_path / "fresh.db"
    with SQLiteSession("s", path, names.sessions, names.messages) as s:
        await s.add_items([msg(1)])
    url = f"sqlite:///{path}"
    kw = {"sessions_table": names.sessions, "messages_table": names.messages}
    assert await migrations.current(url, **kw) == migrations.head()
    assert await migrations.check(url, **kw) == []
    await migrations.upgrade(url, **kw)  # nothing to do
    with SQLiteSession("s", path, names.sessions, names.messages) as s:
        assert await s.get_items() == [msg(1)]


async def test_older_file_is_not_stamped(tmp_path: Path, names: TableNames) -> None:
    """Tables at an older revision are used as they are, never recorded as head."""
    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    kw = {"sessions_table": names.sessions, "messages_table": names.messages}
    await migrations.upgrade(url, revision="0001", **kw)
    with SQLiteSession("s", path, names.sessions, names.messages) as s:
        await s.add_items([msg(1)])
    assert await migrations.current(url, **kw) == "0001"
    await migrations.upgrade(url, **kw)
    assert await migrations.check(url, **kw) == []


async def test_sqlalchemy_reads_what_sqlite_wrote(tmp_path: Path, names: TableNames) -> None:
    """A file written by SQLiteSession is read, popped and listed by SQLAlchemySession."""
    path = tmp_path / "a.db"
    items = [msg(0), {"content": "lone \ud800 and nul \x00"}, msg(2, "assistant")]
    with SQLiteSession("conv", path, names.sessions, names.messages) as s:
        await s.add_items(items)
    url = f"sqlite:///{path}"
    kw = {"sessions_table": names.sessions, "messages_table": names.messages}
    async with SessionStore.from_url(url, **kw) as store:
        other = store.session("conv")
        assert await other.get_items() == items
        assert await other.get_items(limit=1) == items[-1:]
        info = await store.get_session("conv")
        assert info is not None
        assert info.item_count == 3
        assert info.updated_at >= info.created_at
        assert await other.pop_item() == items[-1]
        await other.add_items([msg(9)])
    with SQLiteSession("conv", path, names.sessions, names.messages) as s:
        assert await s.get_items() == [*items[:2], msg(9)]


async def test_sqlite_reads_what_sqlalchemy_wrote(tmp_path: Path, names: TableNames) -> None:
    """A file written by SQLAlchemySession is read, popped and cleared by SQLiteSession."""
    path = tmp_path / "b.db"
    items = [msg(0), {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]
    kw = {"sessions_table": names.sessions, "messages_table": names.messages}
    async with SessionStore.from_url(f"sqlite:///{path}", create_tables=True, **kw) as store:
        await store.session("conv").add_items(items)
        await store.session("other").add_items([msg(5)])
        with SQLiteSession("conv", path, names.sessions, names.messages) as s:
            assert await s.get_items() == items
            assert await s.pop_item() == items[-1]
            assert await store.session("conv").get_items() == items[:1]
            await s.add_items([msg(7)])
            assert await store.session("conv").get_items() == [items[0], msg(7)]
            await s.clear_session()
        assert await store.get_session("conv") is None
        assert await store.session("other").get_items() == [msg(5)]


async def test_agents_sdk_sqlite_files_are_shared(tmp_path: Path) -> None:
    """A file written by the Agents SDK's own SQLiteSession is read by ours, and the reverse."""
    path = tmp_path / "sdk.db"
    sdk = sdk_memory.SQLiteSession("conv", path)
    try:
        await sdk.add_items([msg(0)])
        with SQLiteSession("conv", path) as ours:
            assert await ours.get_items() == [msg(0)]
            await ours.add_items([msg(1)])
        assert await sdk.get_items() == [msg(0), msg(1)]
    finally:
        sdk.close()


async def test_agents_sdk_files_keep_their_id_order(tmp_path: Path) -> None:
    """The SDK's tables (items keyed by a global id) are used as they are, ordered by that id.

    Appends, pops, a replace and a compaction swap interleaved across two sessions,
    through ours and the SDK's class alike; nothing is migrated or stamped.
    """
    path = tmp_path / "sdk.db"
    sdk = sdk_memory.SQLiteSession("a", path)
    try:
        with SQLiteSession("a", path) as a, SQLiteSession("b", path) as b:
            for i in range(3):
                await a.add_items([msg(i)])
                await b.add_items([msg(10 + i)])
                await sdk.add_items([msg(20 + i)])
            assert await a.get_items() == [msg(0), msg(20), msg(1), msg(21), msg(2), msg(22)]
            assert await a.pop_item() == msg(22)
            snapshot = await a._get_compaction_snapshot(2)
            assert snapshot is not None
            assert snapshot.items == [msg(21), msg(2)]
            assert await snapshot.replace_suffix(0, [msg(99)])
            assert await sdk.get_items() == [msg(0), msg(20), msg(1), msg(99)]
            await b.replace_items([msg(5), msg(6)])
            assert await b.get_items() == [msg(5), msg(6)]
        assert not any(
            "position" in (r[0] or "") for r in query(path, "SELECT sql FROM sqlite_master")
        )
        assert "agent_sessions_version" not in _tables(path)
    finally:
        sdk.close()


# -- concurrency ------------------------------------------------------------------------------


def assert_whole_batches(items: list[dict[str, Any]], keys: set[tuple[int, int]], size: int):
    """Every batch (writer, batch) is present once, contiguous and in order; nothing else is."""
    assert len(items) == len(keys) * size
    for start in range(0, len(items), size):
        chunk = items[start : start + size]
        assert [i["k"] for i in chunk] == list(range(size))
        assert len({(i["w"], i["b"]) for i in chunk}) == 1
    assert {(i["w"], i["b"]) for i in items} == keys


def batch(w: int, b: int, size: int) -> list[dict[str, Any]]:
    return [{"w": w, "b": b, "k": k} for k in range(size)]


async def test_many_tasks_on_one_session(db: Path) -> None:
    """40 tasks sharing one session append, read and pop without losing or splitting a batch."""
    with SQLiteSession("shared", db) as s:

        async def writer(w: int) -> None:
            for b in range(5):
                await s.add_items(batch(w, b, 4))
                assert len(await s.get_items(limit=4)) == 4

        await asyncio.gather(*(writer(w) for w in range(40)))
        items = await s.get_items()
    assert_whole_batches(items, {(w, b) for w in range(40) for b in range(5)}, 4)


async def test_many_tasks_each_with_a_session(db: Path) -> None:
    """40 tasks, each with its own session (connection) on one file, lose nothing."""

    async def writer(w: int) -> None:
        with SQLiteSession("shared", db) as s:
            for b in range(5):
                await s.add_items(batch(w, b, 4))

    await asyncio.gather(*(writer(w) for w in range(40)))
    with SQLiteSession("shared", db) as s:
        items = await s.get_items()
    assert_whole_batches(items, {(w, b) for w in range(40) for b in range(5)}, 4)


def test_several_threads_on_one_file(db: Path) -> None:
    """Six threads, each with its own event loop and tasks, write one file: nothing is lost.

    Half the tasks use a session of their own thread; the rest share one session
    across all threads (and so across event loops).
    """
    shared = SQLiteSession("shared", db)
    errors: list[BaseException] = []

    async def thread_main(t: int) -> None:
        with SQLiteSession("shared", db) as own:

            async def writer(w: int, s: SQLiteSession) -> None:
                for b in range(10):
                    await s.add_items(batch(t * 100 + w, b, 3))

            await asyncio.gather(*(writer(w, own if w % 2 else shared) for w in range(8)))

    def run(t: int) -> None:
        try:
            asyncio.run(thread_main(t))
        except BaseException as exc:  # noqa: BLE001  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    shared.close()
    assert errors == []
    with SQLiteSession("shared", db) as s:
        items = asyncio.run(s.get_items())
    keys = {(t * 100 + w, b) for t in range(6) for w in range(8) for b in range(10)}
    assert_whole_batches(items, keys, 3)


def test_pops_from_several_threads_claim_each_item_once(db: Path) -> None:
    """Four threads popping one session through their own connections each get distinct items."""
    with SQLiteSession("q", db) as s:
        asyncio.run(s.add_items([{"n": n} for n in range(200)]))
    popped: list[int] = []
    errors: list[BaseException] = []

    async def drain() -> None:
        with SQLiteSession("q", db) as own:
            while (item := await own.pop_item()) is not None:
                popped.append(item["n"])  # type: ignore[typeddict-item]

    def run() -> None:
        try:
            asyncio.run(drain())
        except BaseException as exc:  # noqa: BLE001  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(popped) == list(range(200))


WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from agents_memory import SQLiteSession

    async def main(path, w):
        with SQLiteSession("shared", path) as s:
            await asyncio.gather(*(
                s.add_items([{"w": w * 10 + t, "b": b, "k": k} for k in range(5)])
                for t in range(4) for b in range(5)
            ))

    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
    """
)


async def test_several_processes_on_one_file(db: Path) -> None:
    """Three processes racing to create and append to one file lose nothing and never fail."""
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", WRITER, str(db), str(w), stderr=subprocess.PIPE
        )
        for w in range(3)
    ]
    for p in procs:
        _, err = await p.communicate()
        assert p.returncode == 0, err.decode()
    with SQLiteSession("shared", db) as s:
        items = await s.get_items()
    keys = {(w * 10 + t, b) for w in range(3) for t in range(4) for b in range(5)}
    assert_whole_batches(items, keys, 5)


# -- failures roll back -----------------------------------------------------------------------


async def test_failed_write_rolls_back_and_connection_stays_usable(
    db: Path, names: TableNames
) -> None:
    """A write the database refuses mid-batch leaves nothing behind, not even the session row."""
    with SQLiteSession("s", db, names.sessions, names.messages) as s:
        assert await s.get_items() == []  # the first call creates the tables
        execute(
            db,
            f"CREATE TRIGGER refuse BEFORE INSERT ON {names.messages} "
            "WHEN NEW.message_data LIKE '%boom%' BEGIN SELECT RAISE(ABORT, 'refused'); END",
        )
        with pytest.raises(sqlite3.IntegrityError, match="refused"):
            await s.add_items([msg(1), {"content": "boom"}, msg(2)])
        assert query(db, f"SELECT count(*) FROM {names.sessions}") == [(0,)]
        assert await s.get_items() == []
        assert not await s._call(lambda c: c.in_transaction)
        await s.add_items([msg(1), msg(2)])
        assert await s.get_items() == [msg(1), msg(2)]
        with pytest.raises(sqlite3.IntegrityError):
            await s.add_items([{"content": "boom"}])
        assert await s.get_items() == [msg(1), msg(2)]


async def test_failed_pop_keeps_the_item(db: Path, names: TableNames) -> None:
    """A pop the database refuses returns nothing and removes nothing; the next pop works."""
    with SQLiteSession("s", db, names.sessions, names.messages) as s:
        await s.add_items([msg(1), msg(2)])
        execute(
            db,
            f"CREATE TRIGGER refuse BEFORE DELETE ON {names.messages} "
            "BEGIN SELECT RAISE(ABORT, 'refused'); END",
        )
        with pytest.raises(sqlite3.IntegrityError, match="refused"):
            await s.pop_item()
        with pytest.raises(sqlite3.IntegrityError):
            await s.clear_session()
        assert await s.get_items() == [msg(1), msg(2)]
        execute(db, "DROP TRIGGER refuse")
        assert await s.pop_item() == msg(2)


# -- closing ----------------------------------------------------------------------------------


async def test_every_call_after_close_raises(db: Path) -> None:
    """After close(), every operation raises SessionClosedError; close() may be repeated."""
    s = SQLiteSession("s", db)
    await s.add_items([msg(1)])
    s.close()
    s.close()
    with pytest.raises(SessionClosedError, match="closed"):
        await s.get_items()
    for call in (
        s.get_items(limit=0),
        s.add_items([msg(2)]),
        s.add_items([]),
        s.pop_item(),
        s.clear_session(),
    ):
        with pytest.raises(SessionClosedError):
            await call
    with SQLiteSession("s", db) as again:
        assert await again.get_items() == [msg(1)]


async def test_close_lets_started_work_finish(db: Path) -> None:
    """A write already under way when close() is called completes; close waits for it."""
    s = SQLiteSession("s", db)
    writes = [asyncio.create_task(s.add_items([msg(i)])) for i in range(20)]
    await asyncio.sleep(0)  # every task has handed its write to the session's thread
    await asyncio.to_thread(s.close)
    await asyncio.gather(*writes)
    with SQLiteSession("s", db) as again:
        assert len(await again.get_items()) == 20


async def test_async_with_closes(db: Path) -> None:
    """``async with`` closes the session on the way out."""
    async with SQLiteSession("s", db) as s:
        await s.add_items([msg(1)])
    with pytest.raises(SessionClosedError):
        await s.get_items()
    assert "SQLiteSession(session_id='s'" in repr(s)


def test_sessions_on_one_file_share_one_write_queue(tmp_path: Path) -> None:
    """Writers on one file (however it is spelled) queue on one lock; in-memory ones do not."""
    a = SQLiteSession("a", tmp_path / "x.db")
    b = SQLiteSession("b", f"{tmp_path}/./x.db")
    c = SQLiteSession("c", tmp_path / "y.db")
    m1, m2 = SQLiteSession("m"), SQLiteSession("m")
    try:
        assert a._write_lock is b._write_lock
        assert a._write_lock is not c._write_lock
        assert m1._write_lock is not m2._write_lock
    finally:
        for s in (a, b, c, m1, m2):
            s.close()


@pytest.mark.integration
async def test_runner_keeps_history_in_the_file(db: Path) -> None:
    """The Agents SDK's Runner, with a scripted model, keeps two turns in a SQLiteSession."""
    model = testing.ScriptedModel(
        [[testing.assistant_message("Paris.")], [testing.assistant_message("About 2.1 million.")]]
    )
    agent = agents.Agent(name="geo", instructions="Answer briefly.", model=model)
    with SQLiteSession("runner", db) as session:
        await agents.Runner.run(agent, "Capital of France?", session=session)
        second = await agents.Runner.run(agent, "How many people?", session=session)
        assert second.final_output == "About 2.1 million."
        assert "Paris." in str(model.calls[1].input)
        assert [i.get("role") for i in await session.get_items()] == [
            "user",
            "assistant",
            "user",
            "assistant",
        ]


async def test_invalid_utf8_row_is_a_corrupt_row(db: Path) -> None:
    """A TEXT row holding invalid UTF-8 is skipped like other corrupt rows, not a failed read."""
    async with SQLiteSession("conv", db) as s:
        await s.add_items([msg(0)])
        with contextlib.closing(sqlite3.connect(db)) as conn, conn:
            conn.execute(
                "INSERT INTO agent_messages (session_id, position, message_data) "
                "VALUES (?, 2, CAST(? AS TEXT))",
                ("conv", b'{"a":"\xff\xfe"}'),
            )
        assert await s.get_items() == [msg(0)]
        assert await s.pop_item() == msg(0)  # the corrupt newest row is removed on the way
        assert await s.get_items() == []


def _tables(path: Path) -> list[str]:
    return [r[0] for r in query(path, "SELECT name FROM sqlite_master WHERE type = 'table'")]


async def test_constructor_creates_the_tables(db: Path) -> None:
    """As in the SDK, the constructor creates the tables: a failed first write leaves them."""
    with SQLiteSession("s", db) as s:
        assert {"agent_sessions", "agent_messages"} <= set(_tables(db))
        with pytest.raises(TypeError):
            await s.add_items([object()])  # type: ignore[list-item]
    assert {"agent_sessions", "agent_messages"} <= set(_tables(db))
    assert query(db, "SELECT count(*) FROM agent_messages") == [(0,)]


def test_constructor_fails_on_a_file_that_is_not_a_database(db: Path) -> None:
    """A path that holds something else fails in the constructor, not at the first call."""
    db.write_bytes(b"not a database, just bytes " * 100)
    with pytest.raises(DatabaseConnectionError, match="not a SQLite database") as info:
        SQLiteSession("s", db)
    assert isinstance(info.value.__cause__, sqlite3.DatabaseError)  # the driver's, kept
