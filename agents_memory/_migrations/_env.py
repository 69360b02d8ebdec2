"""The body of the repository's ``env.py``: plain ``alembic`` from the repository root.

URL and table names come from ``-x`` arguments, else the environment, else the
defaults; async URLs work (the migration runs through the async engine, on one connection, as the
``agents_memory.migrations`` functions do).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping

from alembic.operations import Operations
from alembic.runtime.environment import EnvironmentContext
from alembic.util import CommandError
from sqlalchemy.engine import Connection

from agents_memory._migrations._layout import Layout, resolve_layout
from agents_memory._migrations._lock import LockMode, resolve_mode
from agents_memory._migrations._preflight import check_tables
from agents_memory._migrations._runner import (
    carry_on_legacy_lineage,
    check_layout,
    drop_lock_table,
    lock,
    migration_opts,
    sqlite_foreign_keys_off,
    wanted_partitions,
)
from agents_memory._tables import TableNames, resolve_names
from agents_memory._urls import mask_url, resolve_url
from agents_memory.migrations import _is_upgrading as is_upgrading
from agents_memory.migrations import _on_connection as on_connection

X_KEYS = ("url", "sessions_table", "messages_table", "lock", "partitions")
"""The ``-x key=value`` arguments this environment reads."""

_log = logging.getLogger("alembic.agents_memory")


def _run_on(
    context: EnvironmentContext,
    connection: Connection,
    *,
    names: TableNames,
    url: str,
    mode: LockMode,
    layout: Layout,
) -> None:
    upgrading = is_upgrading(context)
    partitions = wanted_partitions(connection, layout) if upgrading else None
    with sqlite_foreign_keys_off(connection):
        context.configure(connection=connection, **migration_opts(names, partitions))
        with context.begin_transaction(), lock(connection, names, mode):
            check_tables(connection, names)  # before the first DDL statement
            carry_on_legacy_lineage(Operations(context.get_context()), names)
            before = context.get_context().get_current_revision()
            context.run_migrations()
            after = context.get_context().get_current_revision()
            if upgrading:
                check_layout(context.get_context(), names, partitions, explicit=layout.explicit)
    if after is None and before is not None:  # downgraded to base: the lock table goes too
        drop_lock_table(connection, names)  # (committed with the rest: commit=True below)
    moved = (
        f"at {after or 'none'}" if before == after else f"{before or 'none'} -> {after or 'none'}"
    )
    _log.info("agents_memory tables %s/%s in %s: %s", names.sessions, names.messages, url, moved)


def _check_x_keys(x_args: Mapping[str, str | None]) -> None:
    """A misspelled ``-x`` key (``ur=…``) must not fall back to the default database."""
    unknown = sorted(set(x_args) - set(X_KEYS))
    if unknown:
        msg = (
            f"unknown -x argument {', '.join(unknown)}; this environment accepts "
            f"{', '.join(f'-x {k}=…' for k in X_KEYS)} (before the command: "
            "alembic -x url=… upgrade head)"
        )
        raise CommandError(msg)


def _layout(given: str | None) -> Layout:
    """``-x partitions=N`` (else ``$AGENTS_MEMORY_PARTITIONS``), checked before connecting."""
    try:
        number = None if given is None else int(given)
    except ValueError:
        msg = f"-x partitions=…: a whole number of hash partitions (2 to 1024), got {given!r}"
        raise CommandError(msg) from None
    try:
        return resolve_layout(number)
    except ValueError as exc:
        raise CommandError(f"-x partitions=…: {exc}") from None


def run(context: EnvironmentContext) -> None:
    """Entry point of ``env.py``, online or offline (``--sql``)."""
    x_args = context.get_x_argument(as_dictionary=True)
    _check_x_keys(x_args)
    names = resolve_names(x_args)
    if context.is_offline_mode():
        context.configure(url=resolve_url(x_args), literal_binds=True, **migration_opts(names))
        with context.begin_transaction():
            context.run_migrations()
    else:
        url = resolve_url(x_args)
        try:
            mode = resolve_mode(x_args.get("lock"))
        except ValueError as exc:
            raise CommandError(f"-x lock=…: {exc}") from None
        layout = _layout(x_args.get("partitions"))
        run_on = functools.partial(
            _run_on, context, names=names, url=mask_url(url), mode=mode, layout=layout
        )
        asyncio.run(on_connection(url, run_on, commit=True))
