"""Cancelled operations on a server log nothing: no "Future exception was never retrieved"."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import random

import pytest

from agents_memory import SessionStore


async def test_cancelled_operations_leave_no_unretrieved_futures(
    store: SessionStore, backend, caplog: pytest.LogCaptureFixture
) -> None:
    """Hundreds of reads and writes cancelled at random moments: asyncio reports no lost error."""
    if backend.kind == "sqlite":
        pytest.skip("about server connections (asyncpg, asyncmy)")
    session = store.session("a")
    await session.add_items([{"n": -1}])
    rng = random.Random(13)
    caplog.set_level(logging.WARNING)
    for i in range(300):
        op = session.add_items([{"n": i}]) if i % 2 else session.get_items()
        task = asyncio.ensure_future(op)
        await asyncio.sleep(rng.random() * 0.003)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await asyncio.sleep(0.2)
    gc.collect()
    await asyncio.sleep(0)
    lost = [r for r in caplog.records if "never retrieved" in r.getMessage()]
    assert lost == [], f"{len(lost)} lines like: {lost[0].getMessage()}" if lost else ""
    # and the store still works, every write whole or absent
    items = await session.get_items()
    assert items[0] == {"n": -1}
    assert len({item["n"] for item in items}) == len(items)
