"""Expiry on every database: a store's ``ttl``, per-session deadlines, expired reads as empty.

A store's ``ttl`` is renewed by every write; an expired session reads as empty
before any prune runs.
"""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from agents_memory import SessionStore, TableNames

TTL = dt.timedelta(milliseconds=600)


def ttl_store(
    engine: AsyncEngine, names: TableNames, ttl: dt.timedelta | None = TTL
) -> SessionStore:
    return SessionStore(
        engine,
        sessions_table=names.sessions,
        messages_table=names.messages,
        ttl=ttl,
        create_tables=True,
    )


async def test_store_ttl_is_renewed_by_every_write(
    store: SessionStore, engine: AsyncEngine, names: TableNames
) -> None:
    """Each add_items moves the deadline to now + ttl; a session left alone expires."""
    timed = ttl_store(engine, names)
    busy, idle = timed.session("busy"), timed.session("idle")
    await idle.add_items([{"n": 0}])
    first = await busy.expires_at()
    assert first is None  # no row yet
    await busy.add_items([{"n": 0}])
    first = await busy.expires_at()
    assert first is not None
    for n in range(1, 4):
        await asyncio.sleep(TTL.total_seconds() / 3)
        await busy.add_items([{"n": n}])
    renewed = await busy.expires_at()
    assert renewed is not None
    assert renewed > first + TTL / 2
    assert await busy.get_items() == [{"n": n} for n in range(4)]
    assert await idle.get_items() == []  # idle expired (600 ms without a write)
    assert {i.session_id for i in (await timed.list_sessions()).sessions} == {"busy"}
    report = await timed.prune()
    assert (report.sessions_deleted, report.items_deleted) == (1, 1)


async def test_expired_session_reads_empty_and_a_write_starts_it_afresh(
    store: SessionStore,
) -> None:
    """get_items, iter_items and pop_item see nothing once expired; a later write starts afresh.

    The write sees only itself (the hidden items are gone, not resurrected) and has no deadline.
    """
    s = store.session("brief")
    await s.add_items([{"n": n} for n in range(5)])
    await s.set_ttl(dt.timedelta(milliseconds=200))
    assert len(await s.get_items()) == 5
    await asyncio.sleep(0.3)
    assert await s.get_items() == []
    assert await s.get_items(limit=2) == []
    assert [i async for i in s.iter_items(batch_size=2)] == []
    assert await s.pop_item() is None
    await s.add_items([{"n": "new"}])
    assert await s.get_items() == [{"n": "new"}]
    assert await s.expires_at() is None
    info = await store.get_session("brief")
    assert info is not None
    assert info.item_count == 1
    assert await store.prune() == type(await store.prune())(0, 0, 0, 0, dry_run=False)


async def test_without_ttl_nothing_expires(store: SessionStore) -> None:
    """A store without ttl writes no deadline, and set_ttl(None) clears one."""
    s = store.session("plain")
    await s.add_items([{"n": 1}])
    assert await s.expires_at() is None
    await s.set_ttl(dt.timedelta(hours=1))
    await s.add_items([{"n": 2}])  # a write keeps a deadline that has not passed
    assert await s.expires_at() is not None
    await s.set_ttl(None)
    assert await s.expires_at() is None
    assert await s.get_items() == [{"n": 1}, {"n": 2}]


@pytest.mark.parametrize("bad", [dt.timedelta(0), dt.timedelta(seconds=-1), 30])
async def test_bad_ttl_is_refused(engine: AsyncEngine, names: TableNames, bad: object) -> None:
    with pytest.raises(ValueError, match="ttl"):
        ttl_store(engine, names, bad)  # type: ignore[arg-type]
