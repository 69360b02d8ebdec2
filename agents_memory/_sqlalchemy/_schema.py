"""Schema readiness: creating tables on request, and turning "no such table" into a next step."""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Iterator

from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from agents_memory._errors import SchemaNotReadyError
from agents_memory._tables import TableNames
from agents_memory._urls import mask_url
from agents_memory.models import get_models

_MISSING_MARKERS = ("no such table", "does not exist", "doesn't exist", "no such column")
_MISSING_SQLSTATES = {"42P01", "42703"}  # undefined table / column (Postgres)


def upgrade_command(engine: AsyncEngine, names: TableNames) -> str:
    """The exact shell command that brings this database's schema up to date."""
    parts = ["agents-memory", "db", "upgrade", "--url", f"'{mask_url(engine.url)}'"]
    if names != TableNames():
        parts += ["--sessions-table", names.sessions, "--messages-table", names.messages]
    return " ".join(parts)


def _is_missing_schema(exc: DBAPIError) -> bool:
    orig = exc.orig
    if getattr(orig, "sqlstate", None) in _MISSING_SQLSTATES:
        return True
    text = str(orig).lower()
    return any(marker in text for marker in _MISSING_MARKERS)


@contextlib.contextmanager
def schema_errors(engine: AsyncEngine, names: TableNames) -> Iterator[None]:
    """Re-raise a missing-table/column error as :class:`SchemaNotReadyError` with the fix."""
    try:
        yield
    except DBAPIError as exc:
        if not _is_missing_schema(exc):
            raise
        msg = (
            f"the agents_memory tables ({names.sessions}, {names.messages}) are missing or out "
            f"of date in {mask_url(engine.url)}; run `{upgrade_command(engine, names)}` "
            "(or pass create_tables=True during development)"
        )
        raise SchemaNotReadyError(msg) from exc


_ready: weakref.WeakKeyDictionary[Engine, set[TableNames]] = weakref.WeakKeyDictionary()
_locks: weakref.WeakKeyDictionary[Engine, asyncio.Lock] = weakref.WeakKeyDictionary()


async def ensure_schema(engine: AsyncEngine, names: TableNames) -> None:
    """Create the tables for ``names`` once per engine; concurrent callers wait for the first."""
    sync_engine = engine.sync_engine
    if names in _ready.get(sync_engine, ()):
        return
    lock = _locks.setdefault(sync_engine, asyncio.Lock())
    async with lock:
        if names in _ready.get(sync_engine, ()):
            return
        metadata = get_models(names).metadata
        async with engine.begin() as conn:
            await conn.run_sync(metadata.create_all)
        _ready.setdefault(sync_engine, set()).add(names)
