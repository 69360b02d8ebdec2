"""Run the schema migrations from Python: the same scripts as ``alembic`` and the CLI.

Every function takes a URL (plain or async; it is normalised) or an
``AsyncEngine``, and the table names of the lineage to act on. Each table-name
set has its own version table, so sets in one database (and the application's
own ``alembic_version``) never interfere.

For an application with its own Alembic environment, call
:func:`upgrade_connection` from its ``env.py`` (see README, "Migrations").
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import URL, Connection
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import NullPool

from agents_memory._locking import LoopSpanningLock
from agents_memory._migrations._runner import migration_opts, run_lineage
from agents_memory._migrations._scripts import head_revision, script_directory
from agents_memory._sqlalchemy._engine import create_engine
from agents_memory._tables import DEFAULT_MESSAGES_TABLE, DEFAULT_SESSIONS_TABLE, TableNames
from agents_memory.models import get_models

__all__ = [
    "Revision",
    "check",
    "current",
    "downgrade",
    "head",
    "history",
    "upgrade",
    "upgrade_connection",
]

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, slots=True)
class Revision:
    """One migration script."""

    revision: str
    down_revision: str | None
    message: str


def head() -> str:
    """The newest schema revision this version of agents_memory knows."""
    return head_revision()


def history() -> list[Revision]:
    """Every revision, oldest first."""
    revs = [
        Revision(
            r.revision,
            r.down_revision if isinstance(r.down_revision, str) else None,  # (a merge: None)
            (r.doc or "").strip(),
        )
        for r in script_directory().walk_revisions()
    ]
    return list(reversed(revs))


def upgrade_connection(
    connection: Connection,
    *,
    sessions_table: str = DEFAULT_SESSIONS_TABLE,
    messages_table: str = DEFAULT_MESSAGES_TABLE,
    revision: str = "head",
) -> None:
    """Upgrade on an open *sync* connection: for an application's own ``env.py``.

    Call it before the application's ``context.begin_transaction()`` block (on
    SQLite, table rebuilds need a connection with no write in progress). It does
    not touch the application's Alembic context or its version table.
    """
    run_lineage(connection, TableNames(sessions_table, messages_table), revision)


@contextlib.asynccontextmanager
async def _engine_for(url_or_engine: str | URL | AsyncEngine) -> AsyncIterator[AsyncEngine]:
    if isinstance(url_or_engine, AsyncEngine):
        yield url_or_engine
        return
    engine = create_engine(url_or_engine, poolclass=NullPool)
    try:
        yield engine
    finally:
        await engine.dispose()


_command_lock = LoopSpanningLock()
"""Alembic commands run through module-global proxies (``alembic.op``/``context``).

Two commands interleaved would clobber each other's proxy, so every command in
the process takes turns (they are rare and short) — also across event loops and
threads, which is why this is not an ``asyncio.Lock``.
"""


async def _on_connection(
    url_or_engine: str | URL | AsyncEngine, fn: Callable[[Connection], T], *, commit: bool
) -> T:
    async with _engine_for(url_or_engine) as engine, engine.connect() as conn:
        result = await conn.run_sync(fn)
        if commit:
            await conn.commit()
        return result


async def _run_locked(
    url_or_engine: str | URL | AsyncEngine, fn: Callable[[Connection], None]
) -> None:
    async with _command_lock.hold():
        await _on_connection(url_or_engine, fn, commit=True)


async def upgrade(
    url_or_engine: str | URL | AsyncEngine,
    *,
    sessions_table: str = DEFAULT_SESSIONS_TABLE,
    messages_table: str = DEFAULT_MESSAGES_TABLE,
    revision: str = "head",
) -> None:
    """Bring the schema of one table-name set up to ``revision`` (default: the newest)."""
    names = TableNames(sessions_table, messages_table)
    await _run_locked(url_or_engine, lambda c: run_lineage(c, names, revision))


async def downgrade(
    url_or_engine: str | URL | AsyncEngine,
    *,
    revision: str,
    sessions_table: str = DEFAULT_SESSIONS_TABLE,
    messages_table: str = DEFAULT_MESSAGES_TABLE,
) -> None:
    """Step the schema back to ``revision`` (``"base"`` removes the tables and their data)."""
    names = TableNames(sessions_table, messages_table)
    await _run_locked(url_or_engine, lambda c: run_lineage(c, names, revision, downgrade=True))


def _current(connection: Connection, names: TableNames) -> str | None:
    context = MigrationContext.configure(connection, opts={"version_table": names.version_table})
    return context.get_current_revision()


async def current(
    url_or_engine: str | URL | AsyncEngine,
    *,
    sessions_table: str = DEFAULT_SESSIONS_TABLE,
    messages_table: str = DEFAULT_MESSAGES_TABLE,
) -> str | None:
    """The revision the database is at for this table-name set, or ``None`` if never migrated."""
    names = TableNames(sessions_table, messages_table)
    return await _on_connection(url_or_engine, lambda c: _current(c, names), commit=False)


def _check(connection: Connection, names: TableNames) -> list[str]:
    context = MigrationContext.configure(connection, opts=migration_opts(names))
    at = context.get_current_revision()
    newest = head_revision()
    if at != newest:
        return [f"database is at revision {at or 'none (never migrated)'}, not at head {newest}"]
    diffs = compare_metadata(context, get_models(names).metadata)
    return [str(d) for d in diffs]


async def check(
    url_or_engine: str | URL | AsyncEngine,
    *,
    sessions_table: str = DEFAULT_SESSIONS_TABLE,
    messages_table: str = DEFAULT_MESSAGES_TABLE,
) -> list[str]:
    """Differences between the database and the models; empty when it is at head with no drift."""
    names = TableNames(sessions_table, messages_table)
    return await _on_connection(url_or_engine, lambda c: _check(c, names), commit=False)
