"""The hot path on the driver: same behaviour and error types as the SQLAlchemy path."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import pytest
import raw_rows
from sqlalchemy import event, exc, text

from agents_memory import (
    CorruptItemError,
    DatabaseBusyError,
    SchemaNotReadyError,
    SessionStore,
    create_engine,
)
from agents_memory._databases import mysql, postgres
from agents_memory._databases import sqlite as lite
from agents_memory._databases.base import observed


def item(i: int, **extra: Any) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": f"item {i} ✓", **extra}


def watch_statements(store: SessionStore) -> list[str]:
    """Route the store's statements through SQLAlchemy by observing them; return the log."""
    seen: list[str] = []

    def before(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append(statement)

    event.listen(store.engine.sync_engine, "before_cursor_execute", before)
    return seen


def impatient_sqlite(url: str) -> Any:
    """An engine whose SQLite connections never wait for a lock (busy_timeout 0)."""
    engine = create_engine(url, hide_parameters=True)

    @event.listens_for(engine.sync_engine, "connect")
    def no_wait(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA busy_timeout = 0")
        cursor.close()

    return engine


def same_tables(engine: Any, store: SessionStore) -> SessionStore:
    """A second store on ``engine`` over the tables of ``store``."""
    names = store.table_names
    return SessionStore(engine, sessions_table=names.sessions, messages_table=names.messages)


async def exercise(store: SessionStore) -> list[Any]:
    """Every operation of the protocol, with corrupt rows in the way; what each returned."""
    s = store.session("conv")
    out: list[Any] = []
    await s.add_items([item(i) for i in range(6)])
    async with store.engine.begin() as conn:  # a broken writer's rows, newest first
        for bad in ("{nope", '"a string"'):
            await raw_rows.append_raw(conn, store.table_names, "conv", bad)
    await s.add_items([item(6)])
    out.append(await s.get_items())
    out.append(await s.get_items(limit=3))
    out.append([i async for i in s.iter_items(batch_size=2)])
    out.append(await s.pop_item())
    out.append(await s.pop_item())  # skips (and removes) the two corrupt rows
    out.append(await s.get_items(limit=10))
    await s.clear_session()
    out.append(await s.get_items())
    out.append(await s.pop_item())
    out.append(await store.get_session("conv"))
    return out


async def test_driver_path_is_used(store: SessionStore) -> None:
    """An engine nobody observes runs the hot path on its database's driver runner."""
    assert not observed(store.engine)
    await store.session("warm").add_items([item(0)])
    ops = store._backend._operations()
    if store.engine.dialect.name == "sqlite":
        in_memory = store.engine.url.database in (None, "", ":memory:")
        assert isinstance(ops, lite.CoreOperations if in_memory else lite.ThreadOperations)
    elif store.engine.dialect.name == "postgresql":
        assert isinstance(ops._runner, postgres.DriverRunner)
    else:
        assert isinstance(ops._runner, mysql.DriverRunner)


async def test_observed_engine_runs_through_sqlalchemy(store: SessionStore) -> None:
    """With an execution listener on the engine, the listener sees every operation."""
    seen = watch_statements(store)
    s = store.session("a")
    await s.add_items([item(1)])
    assert await s.get_items() == [item(1)]
    assert await s.pop_item() == item(1)
    await s.clear_session()
    m = store.table_names.messages
    assert any(f"INSERT INTO {m}" in q for q in seen)
    assert any(f"FROM {m}" in q and q.lstrip().startswith("SELECT") for q in seen)
    assert any(q.startswith(f"DELETE FROM {m} WHERE") for q in seen)


async def test_both_paths_return_the_same(store: SessionStore) -> None:
    """Driver path and SQLAlchemy path give identical results, corrupt rows included."""
    fast = await exercise(store)
    watch_statements(store)
    slow = await exercise(store)
    assert fast == slow
    assert fast[0] == [item(i) for i in range(7)]
    assert fast[1] == [item(4), item(5), item(6)]
    assert fast[3] == item(6)
    assert fast[4] == item(5)
    assert fast[-3:] == [[], None, None]


async def test_corrupt_pop_raises_and_keeps_the_row(store: SessionStore) -> None:
    """With on_corrupt='raise', popping a corrupt row raises and leaves it in place."""
    await store.session("c").add_items([item(1)])
    strict = SessionStore(
        store.engine,
        sessions_table=store.table_names.sessions,
        messages_table=store.table_names.messages,
        on_corrupt="raise",
    )
    s = strict.session("c")
    async with store.engine.begin() as conn:
        await raw_rows.append_raw(conn, store.table_names, "c", "[")
    for _ in range(2):
        with pytest.raises(CorruptItemError):
            await s.pop_item()
    assert await store.session("c").get_items() == [item(1)]


async def test_missing_table_names_the_fix(store: SessionStore) -> None:
    """Tables dropped under a running store: the driver error becomes SchemaNotReadyError."""
    s = store.session("x")
    await s.add_items([item(1)])
    async with store.engine.begin() as conn:
        # (the advanced sessions' structure table refers to the messages table: it goes first)
        for table in (store.table_names.structure, store.table_names.messages):
            await conn.execute(text(f"DROP TABLE {table}"))
    with pytest.raises(SchemaNotReadyError, match="agents-memory db upgrade"):
        await s.get_items()
    with pytest.raises(SchemaNotReadyError):
        await s.add_items([item(2)])


@pytest.mark.direct_postgres(
    "sets lock_timeout as a connection startup parameter (server_settings), which PgBouncer "
    "1.18 refuses ('unsupported startup parameter'); ignoring it instead would drop the "
    "setting and leave the write waiting on the row lock forever"
)
async def test_database_errors_keep_sqlalchemy_types(file_backend: Any, store: SessionStore):
    """A lock conflict raises what the SQLAlchemy path raises (parameters hidden); then it works.

    SQLite: DatabaseBusyError caused by sqlalchemy.exc.OperationalError. Postgres: the
    sqlalchemy.exc.DBAPIError of a lock timeout, with its SQLSTATE.
    """
    if file_backend.kind == "mysql":
        pytest.skip("the lock-timeout setting below is Postgres'; MySQL lock waits: test_faults")
    s = store.session("locked")
    await s.add_items([item(0)])
    names = store.table_names
    if file_backend.kind == "sqlite":
        path = store.engine.url.database
        assert path is not None
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # another process holds SQLite's write lock
        impatient = impatient_sqlite(file_backend.url)
        other = same_tables(impatient, store)
        try:
            with pytest.raises(DatabaseBusyError, match="locked") as busy:
                await other.session("locked").add_items([item(1)])
            cause = busy.value.__cause__
            assert isinstance(cause, exc.OperationalError)
            assert "item 1" not in str(cause)  # hide_parameters is honoured
            blocker.rollback()
            await other.session("locked").add_items([item(2)])
        finally:
            blocker.close()
            await impatient.dispose()
    else:
        impatient = create_engine(
            file_backend.url,
            connect_args={"server_settings": {"lock_timeout": "200"}},
            hide_parameters=True,
        )
        other = same_tables(impatient, store)
        try:
            async with store.engine.connect() as holder:
                await holder.execute(
                    text(f"SELECT 1 FROM {names.sessions} WHERE session_id = 'locked' FOR UPDATE")
                )
                with pytest.raises(exc.DBAPIError, match="lock timeout") as info:
                    await other.session("locked").add_items([item(1)])
                assert getattr(info.value.orig, "sqlstate", None) == "55P03"
                assert "item 1" not in str(info.value)
                await holder.rollback()
            await other.session("locked").add_items([item(2)])
        finally:
            await impatient.dispose()
    assert await s.get_items() == [item(0), item(2)]


async def test_sqlite_writers_on_one_engine_never_collide(file_backend: Any, store: SessionStore):
    """Even with no busy wait at all, concurrent writers on one engine never see 'locked'.

    On SQLite they queue on the engine's write lock, so no two write transactions of one
    engine ever overlap; Postgres has no such lock (row locks keep batches whole).
    """
    if file_backend.kind != "sqlite":
        pytest.skip("the per-engine write lock is SQLite's")
    await store.session("warm").add_items([item(0)])
    impatient = impatient_sqlite(file_backend.url)
    other = same_tables(impatient, store)
    try:

        async def churn(i: int) -> None:
            s = other.session(f"w{i % 4}")
            for k in range(5):
                await s.add_items([item(k, w=i), item(k, w=i, second=True)])
                await s.get_items(limit=3)
            await s.pop_item()

        await asyncio.gather(*(churn(i) for i in range(24)))
        await asyncio.gather(*(other.session(f"w{i}").clear_session() for i in range(4)))
    finally:
        await impatient.dispose()


async def test_cancelled_writes_leave_nothing_half_done(store: SessionStore) -> None:
    """Writers cancelled at random points leave whole batches only, and the store keeps working."""
    s = store.session("cancel")

    async def writer(w: int) -> None:
        for b in range(20):
            await s.add_items([{"w": w, "b": b, "k": k} for k in range(3)])

    tasks = [asyncio.create_task(writer(w)) for w in range(8)]
    await asyncio.sleep(0.02)
    for t in tasks[::2]:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    items = await s.get_items()
    assert len(items) % 3 == 0
    for start in range(0, len(items), 3):
        chunk = items[start : start + 3]
        assert [i["k"] for i in chunk] == [0, 1, 2]
        assert len({(i["w"], i["b"]) for i in chunk}) == 1
    await s.add_items([{"after": True}])
    assert (await s.get_items(limit=1)) == [{"after": True}]


def _sqlite_threads() -> set[str]:
    import threading  # noqa: PLC0415

    return {t.name for t in threading.enumerate() if t.name.startswith("agents_memory-sqlite")}


async def test_dispose_stops_the_runner_threads(file_backend: Any, names: Any) -> None:
    """Disposing the engine stops the SQLite runner's threads (closing their connections).

    The next operation starts fresh ones.
    """
    if file_backend.kind != "sqlite":
        pytest.skip("only SQLite's runner has threads")
    engine = create_engine(file_backend.url)
    store = SessionStore(
        engine, sessions_table=names.sessions, messages_table=names.messages, create_tables=True
    )
    s = store.session("k")
    await asyncio.gather(s.add_items([item(1)]), s.get_items(), s.get_items())
    threads = lite._threads[engine.sync_engine]
    assert threads.writer._thread.is_alive()
    await engine.dispose()
    assert engine.sync_engine not in lite._threads
    await asyncio.to_thread(threads.writer._thread.join, 5)
    await asyncio.to_thread(threads.reader._thread.join, 5)
    assert not threads.writer._thread.is_alive()  # ended, its connection closed
    assert not threads.reader._thread.is_alive()
    assert await s.get_items() == [item(1)]
    await engine.dispose()


async def test_cancelled_sqlite_write_waiting_for_the_lock_is_withdrawn(
    file_backend: Any, store: SessionStore
) -> None:
    """A SQLite write cancelled while its transaction waits for the file lock never runs.

    Another process-like connection holds the file's write lock, so the writer waits
    inside ``BEGIN IMMEDIATE``. The batch has not joined the transaction yet (it joins
    once the lock is held, see ``GroupWriter``): the cancel is raised at once, while the
    lock is still held, and the batch is never written. (A cancel after joining waits
    for the commit: ``test_group_commit.py``.)
    """
    if file_backend.kind != "sqlite":
        pytest.skip("the one-job writes are SQLite's")
    s = store.session("settle")
    await s.add_items([item(0)])  # the backend is ready: the next write takes the driver path
    path = store.engine.url.database
    assert path
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        task = asyncio.create_task(s.add_items([item(1), item(2)]))
        await asyncio.sleep(0.2)  # the job is now waiting for the file lock
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert blocker.in_transaction  # raised before the writer got the lock
        blocker.execute("COMMIT")
    finally:
        blocker.close()
    assert await s.get_items() == [item(0)]
    await s.add_items([item(3)])
    assert await s.get_items(limit=1) == [item(3)]
