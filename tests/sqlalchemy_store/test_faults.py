"""Operational faults become typed errors that say what happened and what to do."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text, update

import agents_memory._databases.sqlite as sqlite_module
from agents_memory import DatabaseBusyError, DatabaseConnectionError, SessionStore, create_engine
from agents_memory.models import get_models


async def test_sqlite_locked_past_busy_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process holding the write lock too long: DatabaseBusyError, nothing written."""
    monkeypatch.setattr(sqlite_module, "BUSY_TIMEOUT_MS", 200)
    path = tmp_path / "busy.db"
    async with SessionStore.from_url(f"sqlite:///{path}", create_tables=True) as store:
        await store.session("s").add_items([{"n": 1}])
        holder = sqlite3.connect(path)
        holder.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(DatabaseBusyError, match=r"busy\.db.*can be retried"):
                await store.session("s").add_items([{"n": 2}])
        finally:
            holder.rollback()
            holder.close()
        assert await store.session("s").get_items() == [{"n": 1}]


async def test_sqlite_path_that_cannot_be_opened(tmp_path: Path) -> None:
    """A SQLite file in a missing directory: DatabaseConnectionError naming the path."""
    url = f"sqlite:///{tmp_path / 'missing' / 'x.db'}"
    async with SessionStore.from_url(url) as store:
        with pytest.raises(DatabaseConnectionError, match=r"missing/x\.db.*directory exists"):
            await store.session("s").get_items()
        await asyncio.sleep(0.1)  # aiosqlite's worker thread stops after a failed connect


async def test_deadlock_victim_is_retried(backend: Any, store: SessionStore) -> None:
    """An add_items that InnoDB picks as a deadlock victim runs again and lands once.

    Another transaction, heavier (it has inserted 50 rows, so InnoDB rolls back ours),
    gap-locks the session's items, our add locks the session row and waits on the gap,
    then the other one asks for the session row: a deadlock, every time.
    """
    if backend.kind != "mysql":
        pytest.skip("MySQL/MariaDB only (its next-key locks make this deadlock reproducible)")
    sessions, messages = store.table_names.sessions, store.table_names.messages
    s = store.session("q")
    await s.add_items([{"n": 0}])
    errors: list[BaseException] = []
    event.listen(
        store.engine.sync_engine, "handle_error", lambda ctx: errors.append(ctx.original_exception)
    )
    other = create_engine(backend.url)
    try:
        async with other.connect() as conn:
            await conn.execute(text(f"INSERT INTO {sessions} (session_id) VALUES ('heavy')"))
            await conn.execute(
                text(
                    f"INSERT INTO {messages} (session_id, position, message_data) "
                    "VALUES ('heavy', :p, '{}')"
                ),
                [{"p": p} for p in range(1, 51)],
            )
            await conn.execute(
                text(f"SELECT position FROM {messages} WHERE session_id = 'q' FOR UPDATE")
            )
            adding = asyncio.create_task(s.add_items([{"n": 1}, {"n": 2}]))
            await asyncio.sleep(0.5)  # our add holds the session row and waits on the gap
            await conn.execute(
                text(f"UPDATE {sessions} SET updated_at = updated_at WHERE session_id = 'q'")
            )
            await conn.commit()
        await adding
    finally:
        await other.dispose()
    assert [getattr(e, "args", (None,))[0] for e in errors] == [1213]
    assert await s.get_items() == [{"n": 0}, {"n": 1}, {"n": 2}]


async def _wait_for_lock_waiter(conn: Any, table: str) -> None:
    """Until a backend waits on a lock in a statement naming ``table`` (30 s at most)."""
    query = text(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND position(:table in query) > 0"
    )
    for _ in range(600):
        if (await conn.execute(query, {"table": table})).scalar_one():
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"no statement on {table} was seen waiting for the row lock")


@pytest.mark.direct_postgres("sets default_transaction_isolation at connect; PgBouncer refuses it")
@pytest.mark.parametrize("runner", ["driver", "sqlalchemy"])
@pytest.mark.parametrize("retries", [True, False], ids=["retried", "not-retried"])
async def test_serialization_failure_is_retried(
    backend: Any,
    names: Any,
    monkeypatch: pytest.MonkeyPatch,
    runner: str,
    retries: bool,
) -> None:
    """A 40001 (what CockroachDB and YugabyteDB raise on contention) runs again and lands once.

    Under REPEATABLE READ, our append waits on the session row that another transaction
    has updated (seen waiting in ``pg_stat_activity``); when that one commits, Postgres
    aborts ours with "could not serialize access due to concurrent update" (40001),
    every time. With the retries off the same sequence raises ``DatabaseBusyError``
    with nothing written: the proof that the failure really happened.
    """
    if backend.kind != "postgres":
        pytest.skip("Postgres only (SQLSTATE 40001 under REPEATABLE READ)")
    if not retries:
        monkeypatch.setattr("agents_memory._sqlalchemy._faults.DEADLOCK_RETRIES", 0)
    settings = {"server_settings": {"default_transaction_isolation": "repeatable read"}}
    engine = create_engine(backend.url, connect_args=settings)
    errors: list[str] = []
    if runner == "sqlalchemy":  # an observed engine: its statements go through SQLAlchemy
        event.listen(
            engine.sync_engine,
            "handle_error",
            lambda ctx: errors.append(str(getattr(ctx.original_exception, "sqlstate", ""))),
        )
    store = SessionStore(
        engine, sessions_table=names.sessions, messages_table=names.messages, create_tables=True
    )
    other = create_engine(backend.url)
    table = get_models(names).Session.__table__
    touch = update(table).where(table.c.session_id == "q").values(updated_at=table.c.updated_at)
    try:
        s = store.session("q")
        await s.add_items([{"n": 0}])
        async with other.connect() as holder, other.connect() as watcher:
            await holder.execute(touch)  # the session row, updated and not yet committed
            adding = asyncio.create_task(s.add_items([{"n": 1}, {"n": 2}]))
            await _wait_for_lock_waiter(watcher, names.sessions)
            await holder.commit()
            if retries:
                await adding
            else:
                with pytest.raises(DatabaseBusyError, match="serialization failure") as busy:
                    await adding
                cause = busy.value.__cause__
                assert getattr(getattr(cause, "orig", None), "sqlstate", None) == "40001"
        expected = [{"n": 0}, {"n": 1}, {"n": 2}] if retries else [{"n": 0}]
        assert await s.get_items() == expected
        if runner == "sqlalchemy":
            assert errors == ["40001"]
    finally:
        await store.close()
        await other.dispose()
        await engine.dispose()


def _loop_step(store: SessionStore, i: int) -> Any:
    """One asyncio.run()'s worth of work: append an item, read the session back."""

    async def step() -> list[dict[str, Any]]:
        s = store.session("loops")
        await s.add_items([{"i": i}])
        return await s.get_items()

    return step()


def test_store_from_url_follows_a_new_event_loop(backend: Any, names: Any) -> None:
    """A from_url() store keeps working across asyncio.run() calls (a script, a test per loop)."""
    store = SessionStore.from_url(
        backend.url,
        sessions_table=names.sessions,
        messages_table=names.messages,
        create_tables=True,
    )
    try:
        assert asyncio.run(_loop_step(store, 0)) == [{"i": 0}]
        assert asyncio.run(_loop_step(store, 1)) == [{"i": 0}, {"i": 1}]
        assert asyncio.run(_loop_step(store, 2)) == [{"i": 0}, {"i": 1}, {"i": 2}]
    finally:
        asyncio.run(store.close())


def test_callers_engine_works_on_a_new_loop(backend: Any, names: Any) -> None:
    """A caller's own engine used under one asyncio.run() after another keeps working.

    The protocol's driver connections are kept per event loop, and the engine's
    own pool replaces a connection whose loop is gone at checkout.
    """
    if backend.kind == "sqlite":
        pytest.skip("aiosqlite connections work from any event loop")
    engine = create_engine(backend.url)
    store = SessionStore(
        engine, sessions_table=names.sessions, messages_table=names.messages, create_tables=True
    )
    assert asyncio.run(_loop_step(store, 0)) == [{"i": 0}]
    assert asyncio.run(_loop_step(store, 1)) == [{"i": 0}, {"i": 1}]

    async def listing_then_dispose() -> list[str]:
        try:
            page = await store.list_sessions()
            return [info.session_id for info in page.sessions]
        finally:
            await engine.dispose()

    assert asyncio.run(listing_then_dispose()) == ["loops"]
