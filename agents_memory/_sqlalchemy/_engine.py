"""Engine creation and the per-engine state every session on that engine shares.

What differs between databases (pool defaults, connect arguments, connection
set-up events) is asked of the engine's database module once, here; the state
keeps that module and, for SQLite's SQLAlchemy runner, the asyncio lock its
writers queue on (readers run in parallel under WAL).
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator
from typing import Any

from sqlalchemy.engine import URL, Engine
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import QueuePool

from agents_memory._databases import Database, database_for
from agents_memory._urls import normalize_url

DEFAULT_POOL_SIZE = 10
"""Connections a server engine keeps (and the hot path holds per event loop), with no overflow.

Overflow connections are opened and closed on every burst above the pool size:
32 sessions appending at once ran at 0.17-0.28 of raw asyncpg with SQLAlchemy's
5 + 10 overflow and at 0.93-0.98 with 10 and none. A burst waits for a
connection instead.
"""


class EngineState:
    """What all sessions and stores on one engine share: its database module and lock."""

    __slots__ = ("__weakref__", "_lock", "_lock_loop", "db", "readers_queue")

    def __init__(self, engine: AsyncEngine) -> None:
        self.db: type[Database] = database_for(engine.dialect.name)
        """The engine's database module: statements, rules, runner."""
        self.readers_queue = self.db.one_connection(engine.url)
        """Readers share the writers' one connection (in-memory SQLite): they queue too."""
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None

    def lock(self) -> asyncio.Lock:
        """The engine's one write lock for this event loop (SQLite's SQLAlchemy runner)."""
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock_loop is not loop:
            self._lock = asyncio.Lock()
            self._lock_loop = loop
        return self._lock

    @contextlib.asynccontextmanager
    async def writing(self) -> AsyncIterator[None]:
        """Hold the engine's write lock where the database needs one (SQLite)."""
        if not self.db.serialize_writes:
            yield
            return
        async with self.lock():
            yield

    @contextlib.asynccontextmanager
    async def reading(self) -> AsyncIterator[None]:
        """Readers only queue when they would share the one connection with a writer."""
        if not self.readers_queue:
            yield
            return
        async with self.lock():
            yield


_states: weakref.WeakKeyDictionary[Engine, EngineState] = weakref.WeakKeyDictionary()


def engine_state(engine: AsyncEngine) -> EngineState:
    """Return the shared state of ``engine``, installing its database's events on first sight."""
    sync_engine = engine.sync_engine
    state = _states.get(sync_engine)
    if state is None:
        state = EngineState(engine)
        state.db.configure_engine(sync_engine)
        _states[sync_engine] = state
    return state


def _queue_pool_by_default(url: URL) -> bool:
    """Whether SQLAlchemy pools this URL in a queue (server databases)."""
    dialect: Any = url.get_dialect()  # (get_pool_class is not in the Dialect interface)
    return issubclass(dialect.get_pool_class(url), QueuePool)


def create_engine(url: str | URL, **engine_kwargs: Any) -> AsyncEngine:  # noqa: ANN401
    """Create an async engine for ``url`` (normalised to our async drivers) with safe defaults.

    Each database module fills in its own defaults (see ``engine_defaults``);
    a pooled server engine gets :data:`DEFAULT_POOL_SIZE` connections, no
    overflow, most recently used first. Anything passed explicitly wins.
    """
    normalized = normalize_url(url)
    db = database_for(normalized.get_dialect().name)  # names the extra if a driver is missing
    db.engine_defaults(normalized, engine_kwargs)
    if "poolclass" not in engine_kwargs and _queue_pool_by_default(normalized):
        engine_kwargs.setdefault("pool_size", DEFAULT_POOL_SIZE)
        engine_kwargs.setdefault("max_overflow", 0)
        # The most recently used connection is the warm one (measured 1.5x faster per
        # operation than cycling through the pool), and idle ones may time out.
        engine_kwargs.setdefault("pool_use_lifo", True)
    cache_off = (engine_kwargs.get("connect_args") or {}).get("statement_cache_size") == 0
    engine = create_async_engine(normalized, **engine_kwargs)
    # Only the Postgres module has a statement cache to mark (imported only for Postgres).
    mark_cache_off = getattr(db, "mark_cache_off", None)
    if cache_off and mark_cache_off is not None:
        mark_cache_off(engine.sync_engine)
    engine_state(engine)
    return engine
