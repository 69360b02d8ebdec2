"""Run the schema migrations from Python: the same scripts as ``alembic`` and the CLI.

Every function takes a URL (plain or async; it is normalised) or an
``AsyncEngine``, and the table names of the lineage to act on. Each table-name
set has its own version table, so sets in one database (and the application's
own ``alembic_version``) never interfere.

For an application with its own Alembic environment, its ``env.py`` calls
:func:`upgrade_in_env` and hands :func:`include_name` to ``context.configure`` (see
README, "Migrations").
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TypeVar

from alembic.autogenerate import compare_metadata
from alembic.runtime.environment import EnvironmentContext
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect
from sqlalchemy.engine import URL, Connection
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import NullPool

from agents_memory._locking import LoopSpanningLock
from agents_memory._migrations._describe import describe_difference
from agents_memory._migrations._layout import partition_names, resolve_layout
from agents_memory._migrations._lock import resolve_mode
from agents_memory._migrations._preflight import TableMismatchError, explain, mismatches
from agents_memory._migrations._runner import migration_opts, run_lineage
from agents_memory._migrations._scripts import head_revision, script_directory
from agents_memory._sqlalchemy._engine import create_engine
from agents_memory._tables import DEFAULT_MESSAGES_TABLE, DEFAULT_SESSIONS_TABLE, TableNames
from agents_memory.models import get_models
from alembic import command as alembic_command

__all__ = [
    "Revision",
    "check",
    "current",
    "downgrade",
    "head",
    "history",
    "include_name",
    "upgrade",
    "upgrade_connection",
    "upgrade_in_env",
]

T = TypeVar("T")

_log = logging.getLogger("alembic.agents_memory")
"""Under ``alembic`` so an application's ``alembic.ini`` logging shows our lines with its own."""


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
    lock: str | None = None,
    partitions: int | None = None,
) -> None:
    """Upgrade on an open *sync* connection: for an application's own ``env.py``.

    Call it before the application's ``context.begin_transaction()`` block (on
    SQLite, table rebuilds need a connection with no write in progress). It does
    not touch the application's Alembic context or its version table. ``lock``
    and ``partitions`` as for :func:`upgrade`.
    """
    mode = resolve_mode(lock)
    layout = resolve_layout(partitions)
    names = TableNames(sessions_table, messages_table)
    run_lineage(connection, names, revision, lock_mode=mode, layout=layout)


def include_name(
    *,
    sessions_table: str = DEFAULT_SESSIONS_TABLE,
    messages_table: str = DEFAULT_MESSAGES_TABLE,
) -> Callable[[str | None, str, Mapping[str, str | None]], bool]:
    """A filter for ``context.configure(include_name=…)`` that hides our tables from the app.

    An application's autogenerate compares its own models with everything in
    the database: without this filter it proposes ``drop_table`` for our
    sessions, messages and version tables, and ``alembic check`` fails on them.
    Our lineage migrates them (:func:`upgrade_in_env`). To combine it with a
    filter of your own, call both: ``ours(name, type_, parents) and mine(...)``.
    """
    names = TableNames(sessions_table, messages_table)
    hidden = {*names.tables, names.version_table, names.migration_lock_table}
    hidden |= partition_names(names)  # a partitioned layout's
    if names.legacy_version_table is not None:
        hidden.add(names.legacy_version_table)

    def include(name: str | None, type_: str, _parent_names: Mapping[str, str | None]) -> bool:
        return not (type_ == "table" and name in hidden)

    return include


def _is_upgrading(context: EnvironmentContext) -> bool:
    """Whether the host's Alembic is running ``upgrade`` (not check, autogenerate, current…).

    From the ``alembic`` command line the command itself is known. Called through
    ``alembic.command`` from Python, only commands that move to a revision
    (``upgrade``, ``downgrade``, ``stamp``) carry a destination; ``check``,
    ``revision --autogenerate``, ``current`` and ``history`` do not.
    """
    cmd = getattr(context.config.cmd_opts, "cmd", None)
    if isinstance(cmd, tuple) and cmd:
        return cmd[0] is alembic_command.upgrade
    try:
        context.get_revision_argument()
    except KeyError:
        return False
    return True


def upgrade_in_env(
    context: EnvironmentContext,
    connection: Connection | None = None,
    *,
    sessions_table: str = DEFAULT_SESSIONS_TABLE,
    messages_table: str = DEFAULT_MESSAGES_TABLE,
) -> bool:
    """Bring our tables to head from an application's ``env.py``, only under ``alembic upgrade``.

    ``alembic check``, ``revision --autogenerate``, ``current``, ``downgrade`` and
    ``stamp`` leave our tables alone: a command that only compares must not
    change the database. Online, call it with the connection before the
    application's ``context.configure`` (our lineage commits on its own, so on
    SQLite its table rebuilds never run inside the application's transaction).
    Offline (``--sql``), call it inside ``context.begin_transaction()``: our
    revisions inspect the live tables, so they cannot be rendered as a script;
    it writes a comment into the script saying so and naming the command to run.
    Returns whether it upgraded.
    """
    names = TableNames(sessions_table, messages_table)
    command = (
        f"agents-memory db upgrade --url URL --sessions-table {names.sessions}"
        f" --messages-table {names.messages}"
    )
    if context.is_offline_mode():
        note = (
            f"agents_memory tables {names.sessions}/{names.messages} are NOT in this script;"
            f" migrate them with: {command}"
        )
        context.static_output(f"-- {note}\n")
        _log.warning(note)
        return False
    if not _is_upgrading(context):
        return False
    if connection is None:
        msg = "upgrade_in_env needs the connection online: upgrade_in_env(context, connection)"
        raise TypeError(msg)
    ours_to_commit = not connection.in_transaction()
    run_lineage(
        connection, names, "head", lock_mode=resolve_mode(None), layout=resolve_layout(None)
    )
    if ours_to_commit and connection.in_transaction():
        # SQLite (non-transactional DDL in Alembic's eyes) leaves the autobegun
        # transaction open, and the async template closes its connection without
        # a commit: ours would be rolled back with it.
        connection.commit()
    # (Alembic's own log names each revision applied; reading the version here would
    # open a transaction the application's context would then mistake for its caller's.)
    _log.info("agents_memory tables %s/%s are at head %s", names.sessions, names.messages, head())
    return True


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
    lock: str | None = None,
    partitions: int | None = None,
) -> None:
    """Bring the schema of one table-name set up to ``revision`` (default: the newest).

    ``lock`` says how migrators of this lineage exclude each other: ``"advisory"``
    (the server's advisory lock), ``"row"`` (a row of ``<sessions>_migration_lock``,
    for servers and poolers whose advisory locks do not exclude) or ``"auto"``
    (probe once per URL, row where advisory locks fail); ``None``:
    ``$AGENTS_MEMORY_MIGRATION_LOCK``, else ``auto``. Anything else is a
    ``ValueError`` before any connection.

    ``partitions`` (Postgres): build the messages table hash-partitioned by session
    id into that many partitions (2 to 1,024) when revision 0006 builds it; ``None``:
    ``$AGENTS_MEMORY_PARTITIONS`` (which other databases ignore), else plain. A
    database already past 0006 keeps its layout: asking it for another is a
    ``ValueError`` that says how to rebuild, and changes nothing.
    """
    names = TableNames(sessions_table, messages_table)
    mode = resolve_mode(lock)
    layout = resolve_layout(partitions)
    await _run_locked(
        url_or_engine,
        lambda c: run_lineage(c, names, revision, lock_mode=mode, layout=layout),
    )


async def downgrade(
    url_or_engine: str | URL | AsyncEngine,
    *,
    revision: str,
    sessions_table: str = DEFAULT_SESSIONS_TABLE,
    messages_table: str = DEFAULT_MESSAGES_TABLE,
    lock: str | None = None,
) -> None:
    """Step the schema back to ``revision`` (``"base"`` removes the tables and their data).

    ``lock`` as for :func:`upgrade`; at ``base`` the migration lock table goes too.
    """
    names = TableNames(sessions_table, messages_table)
    mode = resolve_mode(lock)
    await _run_locked(
        url_or_engine,
        lambda c: run_lineage(c, names, revision, downgrade=True, lock_mode=mode),
    )


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
    insp = inspect(connection)
    problems = mismatches(insp, names)
    if problems:  # what `upgrade` refuses, said the same way (never "run upgrade")
        raise TableMismatchError(explain(insp, names, problems))
    context = MigrationContext.configure(connection, opts=migration_opts(names))
    at = context.get_current_revision()
    newest = head_revision()
    if at != newest:
        return [f"database is at revision {at or 'none (never migrated)'}, not at head {newest}"]
    diffs = compare_metadata(context, get_models(names).metadata)
    return [describe_difference(d, connection.dialect) for d in diffs]


async def check(
    url_or_engine: str | URL | AsyncEngine,
    *,
    sessions_table: str = DEFAULT_SESSIONS_TABLE,
    messages_table: str = DEFAULT_MESSAGES_TABLE,
) -> list[str]:
    """Differences between the database and the models; empty when it is at head with no drift.

    Tables of these names that are not ours in those roles (swapped names, another
    application's table) raise the ``ValueError`` ``upgrade`` raises for them.
    """
    names = TableNames(sessions_table, messages_table)
    return await _on_connection(url_or_engine, lambda c: _check(c, names), commit=False)
