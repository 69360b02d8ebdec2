"""Process-wide locks that async code on any event loop, in any thread, can wait for.

An ``asyncio.Lock`` belongs to the loop that first waits on it: used from a
second loop (a Django or Flask worker thread calling ``asyncio.run``, a loop per
test) it raises ``RuntimeError: ... is bound to a different event loop``, and
it does not exclude a task of another thread at all. The few locks that must hold
across the whole process (one migration at a time, one schema check per engine)
are therefore ``threading.Lock``s, taken without blocking the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator

_FIRST_WAIT = 0.0005
_LONGEST_WAIT = 0.02


@contextlib.asynccontextmanager
async def hold(lock: threading.Lock) -> AsyncIterator[None]:
    """Hold ``lock`` for the ``async with`` block, polling for it with short sleeps.

    Polling (from 0.5 ms up to 20 ms) keeps the loop free while another thread or
    task holds the lock, and a cancel while waiting leaves it untaken. The locks
    guarded this way are held for a migration or a schema check, once per engine.
    """
    wait = _FIRST_WAIT
    while not lock.acquire(blocking=False):
        await asyncio.sleep(wait)
        wait = min(wait * 2, _LONGEST_WAIT)
    try:
        yield
    finally:
        lock.release()
