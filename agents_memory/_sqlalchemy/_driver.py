"""Running the hot path on the pooled driver connection, beneath SQLAlchemy's execution layer.

Profiling showed that for our short statements SQLAlchemy's per-statement work
(connection wrapper, cursor adapter, result processing, and with aiosqlite one
thread hop per cursor call plus one for the pool's rollback-on-return) costs
several times the statement itself. So the protocol's operations take a DBAPI
connection from the engine's pool and run plain SQL (``DriverSQL``) on the driver.

What stays SQLAlchemy's: connections come from the engine's pool (its connect
events, pragmas and ``connect_args`` apply; pre-ping still runs on checkout),
and a driver error is raised as the same ``sqlalchemy.exc`` type SQLAlchemy would
raise, with the pool invalidated on a disconnect. An engine that logs or
intercepts statements (``echo``, execution events) keeps the SQLAlchemy path, so
what it observes still sees every statement.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from sqlalchemy import util
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from agents_memory._sqlalchemy._faults import on_other_loop

Row = Sequence[Any]
"""``(id, message_data)`` as the driver returns it."""

await_in_greenlet: Callable[[Awaitable[Any]], Any] = (
    getattr(util, "await_", None) or util.await_only
)
"""Await from sync code running in ``greenlet_spawn`` (SQLAlchemy 2.1 renamed await_only)."""


def observed(engine: AsyncEngine) -> bool:
    """Whether ``engine`` logs or intercepts statements, so they must run through SQLAlchemy.

    Checked per operation (listeners may be added at any time); a few attribute reads.
    """
    sync_engine = engine.sync_engine
    events = sync_engine.dispatch
    dialect_events = sync_engine.dialect.dispatch
    return bool(
        sync_engine.echo
        or events.before_execute
        or events.after_execute
        or events.before_cursor_execute
        or events.after_cursor_execute
        or dialect_events.handle_error
        or dialect_events.do_execute
        or dialect_events.do_executemany
    )


def wrap_error(
    exc: Exception,
    engine: AsyncEngine,
    dbapi_connection: object,
    statement: str,
    params: Any,  # noqa: ANN401
) -> tuple[Exception, bool]:
    """``exc`` as SQLAlchemy's own execution would raise it, and whether the connection is gone.

    The adapter translates the driver's exception into its DBAPI class (the step
    SQLAlchemy's cursor adapter performs); it is then wrapped in the matching
    ``sqlalchemy.exc`` class, hiding the parameters if the engine says so.
    Anything that is not a database error (a bad argument, say) is returned as is;
    of those, only a connection of another event loop counts as gone.
    """
    translated: Exception = exc
    translate = getattr(dbapi_connection, "_handle_exception", None)
    if translate is not None:
        try:
            translate(exc)
        except Exception as err:  # noqa: BLE001 - translate() raises the translation
            translated = err
    dialect = engine.dialect
    base = dialect.loaded_dbapi.Error
    if not isinstance(translated, base):
        return exc, on_other_loop(exc)  # a connection of another loop is of no use to anyone
    gone = bool(dialect.is_disconnect(translated, dbapi_connection, None))  # type: ignore[arg-type]
    wrapped = DBAPIError.instance(
        statement,
        params,
        translated,
        base,
        hide_parameters=engine.sync_engine.hide_parameters,
        connection_invalidated=gone,
        dialect=dialect,
    )
    return wrapped, gone


class Reads(Protocol):
    """The reads behind ``get_items`` and ``iter_items``, whichever path runs them."""

    async def latest(self, session_id: str, n: int) -> Sequence[Row]:
        """The newest ``n`` rows, newest first."""

    async def everything(self, session_id: str) -> Sequence[Row]:
        """Every row, oldest first."""

    async def after(self, session_id: str, after: int, n: int) -> Sequence[Row]:
        """Up to ``n`` rows with an id above ``after``, oldest first."""

    async def older(self, session_id: str, before: int, n: int) -> Sequence[Row]:
        """Up to ``n`` rows with an id below ``before``, newest first."""


class DriverPath(Reads, Protocol):
    """The protocol's operations on one engine's driver (SQLite or Postgres)."""

    async def add(self, session_id: str, data: Sequence[str]) -> None:
        """Append encoded items in one transaction."""

    async def pop(self, session_id: str) -> dict[str, Any] | None:
        """Remove and return the newest valid item."""

    async def clear(self, session_id: str) -> bool:
        """Delete the session and its items; whether the session existed."""
