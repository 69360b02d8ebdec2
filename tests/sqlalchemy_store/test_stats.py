"""SessionStore.stats: the totals an operator asks for first."""

from __future__ import annotations

import datetime as dt

import pytest

from agents_memory import SessionStore, StoreStats
from agents_memory._sqlalchemy._bulk import SessionRecord, SessionWrite, bulk_for


async def test_empty_store(store: SessionStore) -> None:
    """An empty store has zero of everything and no times."""
    assert await store.stats() == StoreStats(0, 0, None, None, [])


async def test_counts_span_and_largest(store: SessionStore) -> None:
    """Sessions and items are counted; the largest come biggest first, ties by id."""
    for sid, n in [("a", 2), ("b", 5), ("c", 2), ("d", 1)]:
        await store.session(sid).add_items([{"i": i} for i in range(n)])
    old = dt.datetime.fromisoformat("2020-01-01 00:00:00.000005")
    await bulk_for(store).write([SessionWrite(SessionRecord("empty", old, old))])
    stats = await store.stats(largest=3)
    assert (stats.sessions, stats.items) == (5, 10)
    assert stats.largest == [("b", 5), ("a", 2), ("c", 2)]
    assert stats.oldest_created_at == old
    assert stats.newest_updated_at is not None
    assert stats.newest_updated_at > old
    assert (await store.stats(largest=0)).largest == []


async def test_largest_must_be_a_count(store: SessionStore) -> None:
    """A negative or non-int ``largest`` is a ValueError."""
    with pytest.raises(ValueError, match="largest"):
        await store.stats(largest=-1)
