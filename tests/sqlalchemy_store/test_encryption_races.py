"""A clear racing another process's writer or a key rotation never deletes what it cannot open.

Postgres and MySQL: the writer (or the rotation) holds its transaction open under
a key the clearing keyring lacks; the clear is seen *waiting* for it on the
server (``pg_stat_activity`` / ``information_schema.innodb_trx``), then the other
side commits and the clear must raise the typed error with every row kept.
Without the session-row lock the clear took (and rotation's key-share lock) it
deleted those rows unchecked. SQLite has one writer: the race cannot happen there.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import raw_rows
from encrypted_stores import store_on
from encrypted_stores import stored as _rows
from sqlalchemy import insert, select, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agents_memory import Keyring, MissingKeyError, SessionStore, TableNames, get_models
from agents_memory._codec import encode_item

KEY_A = Keyring.generate_key()
KEY_B = Keyring.generate_key()
OLD = Keyring({"a": KEY_A}, current="a")
"""The clearing process's keyring: it has not been given key b yet."""
NEW = Keyring({"a": KEY_A, "b": KEY_B}, current="b")
"""Another process's keyring, already writing under b."""


@pytest.fixture
def server(backend: Any) -> str:
    if backend.kind == "sqlite":
        pytest.skip("SQLite has one writer at a time: no transaction can interleave a clear")
    return str(backend.kind)


async def _waiting(engine: AsyncEngine, kind: str, table: str) -> int:
    """Statements naming ``table`` that wait for a lock on the server right now.

    Polled only while the other transaction holds the lock such a statement needs,
    so one executing is one waiting.
    """
    if kind == "postgres":
        query = text(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE wait_event_type = 'Lock' AND strpos(query, :t) > 0"
        )
    else:
        # A statement still executing on the server while the other side holds the lock
        # it needs. (MariaDB's innodb_trx does not always list a waiting LOCK IN SHARE MODE
        # select, the processlist does.)
        query = text(
            "SELECT count(*) FROM information_schema.processlist "
            "WHERE command = 'Query' AND locate(:t, info) > 0 "
            "AND locate('information_schema', info) = 0"
        )
    async with engine.connect() as conn:
        return int((await conn.execute(query, {"t": table})).scalar_one())


async def _until_waiting(engine: AsyncEngine, kind: str, table: str, task: Any) -> None:
    """Poll until a statement on ``table`` is seen waiting (the race provably in progress)."""
    for _ in range(1200):
        if await _waiting(engine, kind, table):
            assert not task.done()
            return
        assert not task.done(), "finished without waiting: the race was not set up"
        await asyncio.sleep(0.05)
    pytest.fail(f"nothing waited on {table}")


@contextlib.asynccontextmanager
async def _open_transaction(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A transaction left open until the block ends (then committed)."""
    async with engine.connect() as conn:
        await conn.begin()
        yield conn
        await conn.commit()


async def _seed(store: SessionStore, prior: str) -> None:
    """Session ``u``: three plaintext rows, or three rows under key a."""
    if prior == "sealed":
        await store.session("u").add_items([{"n": n} for n in range(3)])
    else:
        async with store_on(store.engine, store.table_names, None) as plain:
            await plain.session("u").add_items([{"n": n} for n in range(3)])


@pytest.mark.parametrize("prior", ["plain", "sealed"])
async def test_clear_waits_for_a_writer_under_another_key_then_refuses(
    server: str, engine: AsyncEngine, names: TableNames, prior: str
) -> None:
    """Postgres' one-statement clear (a plaintext session) and the checked clear alike."""
    clearing = store_on(engine, names, OLD)
    await _seed(clearing, prior)
    m = get_models(names).Message.__table__
    async with _open_transaction(engine) as writer:
        # what an append does: lock (update) the session row, taking the next position,
        # then insert its item there
        position = await raw_rows.next_position(writer, names, "u")
        sealed = NEW.encrypt(encode_item({"n": "new"}))
        await writer.execute(
            insert(m).values(session_id="u", position=position, message_data=sealed)
        )
        task = asyncio.ensure_future(clearing.session("u").clear_session())
        await _until_waiting(engine, server, names.sessions, task)
    with pytest.raises(MissingKeyError) as caught:
        await task
    assert caught.value.key_id == "b"
    rows = await _rows(engine, names)
    assert len(rows) == 4
    assert rows[-1] == sealed
    async with store_on(engine, names, NEW) as reader:
        assert len(await reader.session("u").get_items()) == 4
    await clearing.close()


@pytest.mark.parametrize("prior", ["plain", "sealed"])
async def test_clear_waits_for_a_rotation_batch_then_refuses(
    server: str, engine: AsyncEngine, names: TableNames, prior: str
) -> None:
    """A rotation batch holds the session row (key share) from before its updates to its commit.

    The batch is held mid-way by a lock on one of its rows; the clear (whose keyring
    lacks the rotation's target) then waits on the session row, and once the batch
    commits it sees the re-sealed rows and refuses.
    """
    clearing = store_on(engine, names, OLD)
    await _seed(clearing, prior)
    rotating = store_on(engine, names, NEW)
    m = get_models(names).Message.__table__
    async with engine.connect() as holder:
        await holder.begin()
        last = (
            select(m.c.position).where(m.c.session_id == "u").order_by(m.c.position.desc()).limit(1)
        )
        await holder.execute(last.with_for_update())
        rotation = asyncio.ensure_future(rotating.rotate_keys("b"))
        await _until_waiting(engine, server, names.messages, rotation)
        clear = asyncio.ensure_future(clearing.session("u").clear_session())
        await _until_waiting(engine, server, names.sessions, clear)
        await holder.rollback()
    report = await rotation
    assert report.rotated == 3
    with pytest.raises(MissingKeyError) as caught:
        await clear
    assert caught.value.key_id == "b"
    rows = await _rows(engine, names)
    assert len(rows) == 3
    assert all(r.startswith(NEW.header("b") + ":") for r in rows)
    assert await rotating.session("u").get_items() == [{"n": n} for n in range(3)]
    await rotating.close()
    await clearing.close()


async def test_rotation_waits_for_a_clear_holding_the_session_row(
    server: str, engine: AsyncEngine, names: TableNames
) -> None:
    """The other order: the session row is held FOR UPDATE (as a clear holds it) first.

    The rotation queues on it; the holder deletes the session and commits; the
    rotation then finds nothing left to re-seal (nothing written, nothing revived).
    """
    clearing = store_on(engine, names, OLD)
    await _seed(clearing, "sealed")
    rotating = store_on(engine, names, NEW)
    models = get_models(names)
    s, m = models.Session.__table__, models.Message.__table__
    async with _open_transaction(engine) as holder:
        row = select(s.c.session_id).where(s.c.session_id == "u").with_for_update()
        await holder.execute(row)
        rotation = asyncio.ensure_future(rotating.rotate_keys("b"))
        await _until_waiting(engine, server, names.sessions, rotation)
        await holder.execute(m.delete().where(m.c.session_id == "u"))
        await holder.execute(s.delete().where(s.c.session_id == "u"))
    report = await rotation
    assert (report.rotated, report.changed, report.remaining) == (0, 3, 0)
    assert await _rows(engine, names) == []
    await rotating.close()
    await clearing.close()
