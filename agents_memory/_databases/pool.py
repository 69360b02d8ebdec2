"""Driver connections for the hot path of a server database, taken from the engine's pool.

A connection is checked out of the engine's pool once (``AsyncEngine.raw_connection()``,
so the engine's connect arguments, events and pre-ping apply) and *detached*
from it (``PoolProxiedConnection.detach()``): from then on this pool lends it to
one operation at a time and no per-operation checkout, checkin or
reset-on-return work is paid. All public SQLAlchemy API.

* A fixed number of connections per event loop (``size``): a burst larger than
  that waits for a free connection instead of opening and closing extra ones
  (the engine pool's overflow churn), and a loop of its own (a thread running
  ``asyncio.run``) gets connections of its own.
* A connection that failed, or was cancelled mid-operation, is closed rather
  than lent again; a closed one found idle is replaced before use.
* ``engine.dispose()`` closes them; so does collecting the engine.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

C = TypeVar("C")

DEFAULT_SIZE = 10
"""Connections per event loop when the engine's pool does not say (``pool.size()``)."""


class Lease(Generic[C]):
    """One connection as the pool lends it, with per-connection state kept by its database."""

    __slots__ = ("driver", "extra")

    def __init__(self, driver: C) -> None:
        self.driver = driver
        self.extra: dict[str, Any] = {}
        """Per-connection state of the database module (prepared statements, for instance)."""


class DriverPool(Generic[C]):
    """Detached driver connections of one engine on one event loop."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        size: int,
        adopt: Callable[[C], Any],
        is_closed: Callable[[C], bool],
        abort: Callable[[C], None],
    ) -> None:
        self._engine = engine
        self._size = size
        self._adopt = adopt
        self._is_closed = is_closed
        self._abort = abort
        self._idle: collections.deque[Lease[C]] = collections.deque()
        self._open = 0
        self._waiters: collections.deque[asyncio.Future[Lease[C] | None]] = collections.deque()
        self._closed = False

    async def _new(self) -> Lease[C]:
        fairy = await self._engine.raw_connection()
        driver: C = fairy.driver_connection  # type: ignore[assignment]
        fairy.detach()
        try:
            await self._adopt(driver)
        except BaseException:
            self._abort(driver)
            raise
        return Lease(driver)

    async def acquire(self) -> Lease[C]:
        """A free connection, a new one (below ``size``), or the next one released (FIFO)."""
        while self._idle:
            lease = self._idle.pop()  # the warm one
            if not self._is_closed(lease.driver):
                return lease
            self._open -= 1
            self._abort(lease.driver)
        if self._open < self._size:
            self._open += 1
            return await self._connect()
        waiter: asyncio.Future[Lease[C] | None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            handed = await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                passed = waiter.result()  # handed over just as we were cancelled: pass it on
                if passed is not None:
                    self.release(passed)
                else:
                    self._hand_over(None)
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise
        if handed is not None:
            return handed
        return await self.acquire()  # a slot was freed (a connection closed): open one

    async def _connect(self) -> Lease[C]:
        """A new connection for a slot already counted in ``_open``.

        A connect is never cancelled half-way: asyncpg's TLS negotiation then
        leaves a future failing with nobody to retrieve it ("Future exception was
        never retrieved ... connection_lost", once per cancelled operation). A
        caller cancelled meanwhile leaves; the connection, once made, is released.
        """
        connecting = asyncio.ensure_future(self._new())
        try:
            return await asyncio.shield(connecting)
        except asyncio.CancelledError:
            connecting.add_done_callback(self._connected_for_nobody)
            raise
        except BaseException:
            self._open -= 1
            self._hand_over(None)
            raise

    def _connected_for_nobody(self, connecting: asyncio.Future[Lease[C]]) -> None:
        """Keep a connection whose caller was cancelled while it was being made."""
        if connecting.cancelled() or connecting.exception() is not None:
            self._open -= 1  # (the failure is retrieved here, so asyncio logs nothing)
            self._hand_over(None)
        else:
            self.release(connecting.result())  # to a waiter, the idle ones, or closed

    def _hand_over(self, lease: Lease[C] | None) -> bool:
        """Give ``lease`` (or, ``None``, a free slot) to the longest waiter; False if none waits.

        Handing the connection over, rather than parking it for whoever asks
        next, keeps a burst fair: no newcomer barges past a waiter.
        """
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(lease)
                return True
        return False

    def release(self, lease: Lease[C], *, broken: bool = False, gone: bool = False) -> None:
        """Give a connection back; a broken one (or any, once closed) is aborted instead.

        ``gone``: the server ended it. Whatever ended it (a restart, a failover,
        ``pg_terminate_backend``, an idle timeout) has most likely ended the idle
        ones too, so they are aborted as well and the next operation connects
        afresh, as SQLAlchemy's pool invalidation does.
        """
        if broken or gone or self._closed:
            self._open -= 1
            self._abort(lease.driver)
            self._hand_over(None)
        elif not self._hand_over(lease):
            self._idle.append(lease)
        if gone:
            idle, self._idle = list(self._idle), collections.deque()
            for stale in idle:
                self._open -= 1
                with contextlib.suppress(Exception):
                    self._abort(stale.driver)
                self._hand_over(None)

    def abort(self) -> None:
        """Close every idle connection at once, from any thread or loop (no I/O awaited)."""
        self._closed = True
        idle, self._idle = list(self._idle), collections.deque()
        for lease in idle:
            with contextlib.suppress(Exception):
                self._abort(lease.driver)


class Pools(Generic[C]):
    """The :class:`DriverPool` of each event loop for one engine."""

    def __init__(self, factory: Callable[[], DriverPool[C]]) -> None:
        self._factory = factory
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, DriverPool[C]] = (
            weakref.WeakKeyDictionary()
        )
        self._guard = threading.Lock()

    def current(self) -> DriverPool[C]:
        """The pool of the running event loop (made on first use)."""
        loop = asyncio.get_running_loop()
        pool = self._by_loop.get(loop)
        if pool is None:
            with self._guard:
                pool = self._by_loop.get(loop)
                if pool is None:
                    pool = self._by_loop[loop] = self._factory()
        return pool

    def drop_all(self) -> None:
        """Forget every loop's pool, closing idle connections without awaiting (dispose, GC)."""
        with self._guard:
            pools = list(self._by_loop.values())
            self._by_loop = weakref.WeakKeyDictionary()
        for pool in pools:
            pool.abort()


_registry: weakref.WeakKeyDictionary[Engine, Pools[Any]] = weakref.WeakKeyDictionary()
_registry_guard = threading.Lock()


def _on_dispose(sync_engine: Engine) -> None:
    """``engine.dispose()``: close every loop's connections; the next operation opens new ones."""
    with _registry_guard:
        pools = _registry.get(sync_engine)
    if pools is not None:
        pools.drop_all()


def pools_for(engine: AsyncEngine, factory: Callable[[], DriverPool[C]]) -> Pools[C]:
    """The pools of ``engine`` (one per loop), dropped on ``engine.dispose()``."""
    sync_engine = engine.sync_engine
    with _registry_guard:
        found = _registry.get(sync_engine)
        if found is None:
            found = _registry[sync_engine] = Pools(factory)
            if not event.contains(sync_engine, "engine_disposed", _on_dispose):
                event.listen(sync_engine, "engine_disposed", _on_dispose)
        return found


def release_pools(sync_engine: Engine) -> None:
    """Abort the driver connections of an engine being abandoned (collected without close)."""
    _on_dispose(sync_engine)


def engine_pool_size(engine: AsyncEngine) -> int:
    """How many connections the hot path may hold per loop: the engine pool's size."""
    size = getattr(engine.sync_engine.pool, "size", None)
    value = size() if callable(size) else None
    return value if isinstance(value, int) and value > 0 else DEFAULT_SIZE
