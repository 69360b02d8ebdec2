"""Process-wide locks that async code on any event loop, in any thread, can wait for.

An ``asyncio.Lock`` belongs to the loop that first waits on it: used from a
second loop (a Django or Flask worker thread calling ``asyncio.run``, a loop per
test) it raises ``RuntimeError: ... is bound to a different event loop``, and
it does not exclude a task of another thread at all. The few locks that must hold
across the whole process (one migration at a time, one schema check per engine)
are therefore instances of :class:`LoopSpanningLock`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import AsyncIterator

_FIRST_WAIT = 0.0005
_LONGEST_WAIT = 0.02


class LoopSpanningLock:
    """A lock for tasks of any event loop in any thread, taken without blocking the loop.

    Waiters poll (from 0.5 ms up to 20 ms), so the loop stays free while another
    thread or task holds the lock, and a cancel while waiting leaves it untaken.
    The holder is recorded by its event loop: a loop closed while one of its tasks
    held the lock (a task abandoned mid-migration when ``asyncio.run`` or a test's
    loop ended) cannot hold it any more, so the lock is free again instead of
    stalling every later caller in the process.
    """

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._owner: weakref.ref[asyncio.AbstractEventLoop] | None = None

    def _try_take(self, loop: asyncio.AbstractEventLoop) -> bool:
        with self._guard:
            owner = self._owner() if self._owner is not None else None
            if owner is not None and not owner.is_closed():
                return False
            self._owner = weakref.ref(loop)
            return True

    def _release(self) -> None:
        with self._guard:
            self._owner = None

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """Hold the lock for the ``async with`` block."""
        loop = asyncio.get_running_loop()
        wait = _FIRST_WAIT
        while not self._try_take(loop):
            await asyncio.sleep(wait)
            wait = min(wait * 2, _LONGEST_WAIT)
        try:
            yield
        finally:
            self._release()
