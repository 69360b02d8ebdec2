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
        # Reentrant: a collection inside the guarded lines may finalise an abandoned
        # holder on this very thread, and its release takes the guard again.
        self._guard = threading.RLock()
        self._holder: object | None = None
        self._loop: weakref.ref[asyncio.AbstractEventLoop] | None = None

    def _try_take(self, token: object, loop: weakref.ref[asyncio.AbstractEventLoop]) -> bool:
        with self._guard:
            if self._holder is not None:
                owner = self._loop() if self._loop is not None else None
                if owner is not None and not owner.is_closed():
                    return False
            self._holder, self._loop = token, loop
            return True

    def _release(self, token: object) -> None:
        with self._guard:
            if self._holder is token:  # not a holder whose lock was since taken over
                self._holder = self._loop = None

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """Hold the lock for the ``async with`` block."""
        token = object()
        loop = weakref.ref(asyncio.get_running_loop())
        wait = _FIRST_WAIT
        while not self._try_take(token, loop):
            await asyncio.sleep(wait)
            wait = min(wait * 2, _LONGEST_WAIT)
        try:
            yield
        finally:
            self._release(token)
