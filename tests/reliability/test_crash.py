"""Crash: a writer process is SIGKILLed at a random moment; acknowledged batches survive whole.

The child acknowledges each ``add_items`` on a pipe right after it returned. After
the kill (and after every kill, over many restarts on one database) each acknowledged
batch must be present and whole; a batch in flight at the kill may be present
(committed, not yet acknowledged) but never partially.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import signal
import time
from typing import Any

import _crash_child
import pytest
from _support import Ledger, batch_check, scaled

from agents_memory import SessionStore

pytestmark = pytest.mark.reliability

PRELOAD = ["agents_memory", "sqlalchemy.ext.asyncio", "aiosqlite", "asyncpg", "_crash_child"]


def _context() -> Any:
    """A forkserver with the library preloaded: a fresh child in milliseconds."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


async def _kill_one(ctx: Any, url: str, tables: tuple[str, str], run: int) -> set[Any]:
    """Start a child, let it write for a random time, SIGKILL it; return what it acknowledged."""
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_crash_child.main, args=(url, tables, run, writer), daemon=True)
    proc.start()
    writer.close()
    try:
        first = await asyncio.to_thread(reader.recv_bytes)
        assert first == b"ready", first
        await asyncio.sleep(random.uniform(0.02, 0.4))
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        await asyncio.to_thread(proc.join, 30)
    acked = set()
    while True:
        try:
            message = reader.recv_bytes()
        except EOFError:
            break
        acked.add(tuple(map(int, message.split())))
    reader.close()
    return acked


async def test_sigkill_during_appends_loses_no_acknowledged_batch(
    file_backend: Any, store: SessionStore, ledger: Ledger
) -> None:
    """Kill -9 a writer at random moments, many times: every acknowledged batch is whole."""
    kills = scaled(12, minimum=3)
    await store.session("warmup").add_items([{"x": 0}])  # schema in place before children start
    names = store.table_names
    ctx = _context()
    acked: set[Any] = set()
    lost = torn = in_flight = 0
    started = time.monotonic()
    for run in range(kills):
        new = await _kill_one(ctx, file_backend.url, (names.sessions, names.messages), run)
        acked |= new
        items = await store.session("crash").get_items()
        whole, torn = batch_check(items)
        lost = len(acked - set(whole))
        in_flight = len(set(whole) - acked)
        if lost or torn:
            break
    ledger.add(
        "Crash",
        f"SIGKILL a process appending with {_crash_child.TASKS} tasks (grouped commits on "
        "SQLite), at a random moment, then reopen and check",
        times=run + 1,
        lost=lost + torn,
        unit="kills",
        note=(
            f"{len(acked)} acknowledged batches checked, {torn} torn; {in_flight} batches "
            f"committed but unacknowledged at a kill (allowed); {time.monotonic() - started:.0f}s"
        ),
    )
    assert (lost, torn) == (0, 0)
    # at most one batch per writer task was in flight per kill
    assert in_flight <= _crash_child.TASKS * kills
