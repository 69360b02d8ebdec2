"""The one place where a failed or lost database connection becomes a typed, readable error.

Drivers report the same few situations in many shapes: a refused port is a bare
``ConnectionRefusedError``, an unknown host a ``socket.gaierror`` that names no
host, a connection the server dropped an ``InterfaceError`` mid-statement, a bad
password an authentication error. Callers get :class:`DatabaseConnectionError`
instead, naming the database by its masked URL (never the password) and the next
thing to check.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, Concatenate, ParamSpec, TypeVar

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from agents_memory._errors import DatabaseBusyError, DatabaseConnectionError
from agents_memory._urls import mask_url

# Postgres SQLSTATEs that mean "could not connect" rather than "this statement failed".
_CONNECT_SQLSTATES = {"28000", "28P01", "3D000", "57P03", "53300"}
# ... and those that mean "the server ended this connection".
_LOST_SQLSTATES = {"57P01", "57P02"}
_SQLITE_CANTOPEN = 14
_SQLITE_BUSY = 5  # extended codes (busy recovery/snapshot/timeout) share the low byte
# asyncpg refuses to *start* a statement on a connection the server has already ended
# (its FATAL message arrived, the socket close not yet): nothing was sent, so retrying is safe.
_UNSENT_MARKERS = ("another operation", "underlying connection is closed")

P = ParamSpec("P")
S = TypeVar("S")
T = TypeVar("T")


def _reason(exc: BaseException, password: str | None) -> str:
    """The driver's own one-line explanation, with the password scrubbed if it ever appears."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if password:
        text = text.replace(password, "***")
    return text or type(exc).__name__


def _where(engine: AsyncEngine) -> str:
    url = engine.url
    if url.get_backend_name() == "sqlite":
        return f"the SQLite database {url.database or ':memory:'!r}"
    host = f"{url.host or 'localhost'}:{url.port}" if url.port else (url.host or "localhost")
    return f"{host} ({mask_url(url)})"


def _classify(exc: BaseException) -> str | None:
    """``"lost"``, ``"connect"``, ``"busy"`` or ``None`` (not a connection problem)."""
    if not isinstance(exc, DBAPIError):
        return "connect" if isinstance(exc, OSError) else None  # asyncpg raises these unwrapped
    orig = exc.orig
    sqlstate = str(getattr(orig, "sqlstate", None) or "")
    kind: str | None = None
    if (getattr(orig, "sqlite_errorcode", None) or 0) & 0xFF == _SQLITE_BUSY:
        kind = "busy"
    elif exc.connection_invalidated or sqlstate in _LOST_SQLSTATES or sqlstate.startswith("08"):
        kind = "lost"
    elif (
        sqlstate in _CONNECT_SQLSTATES
        or getattr(orig, "sqlite_errorcode", None) == _SQLITE_CANTOPEN
        or isinstance(orig, OSError)
    ):
        kind = "connect"
    return kind


@contextlib.contextmanager
def connection_errors(engine: AsyncEngine) -> Iterator[None]:
    """Re-raise connection failures inside the block as :class:`DatabaseConnectionError`.

    A SQLite database locked past its busy timeout becomes :class:`DatabaseBusyError`.
    """
    try:
        yield
    except (DBAPIError, OSError) as exc:
        kind = _classify(exc)
        if kind is None:
            raise
        cause = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
        reason = _reason(cause, engine.url.password)
        where = _where(engine)
        if kind == "busy":
            msg = (
                f"{where} stayed locked by another connection or process for longer than its "
                f"busy timeout ({reason}); nothing was written, so the operation can be retried. "
                "Many processes writing one SQLite file at full speed starve each other; use "
                "one process per file, or Postgres"
            )
            raise DatabaseBusyError(msg) from exc
        if kind == "lost":
            msg = (
                f"lost the connection to {where} during the operation ({reason}); it was "
                "applied completely or not at all, so check with get_items() before retrying "
                "a write. The next call uses a fresh connection."
            )
        elif engine.url.get_backend_name() == "sqlite":
            msg = (
                f"cannot open {where} ({reason}); check that its directory exists and is "
                "writable by this process"
            )
        else:
            msg = (
                f"cannot connect to {where}: {reason}. Check that the server is running and "
                "reachable, and the URL's host, port, database name and credentials"
            )
        raise DatabaseConnectionError(msg) from exc


def _unsent(exc: DatabaseConnectionError) -> bool:
    """True when the driver refused to send the statement at all (a dead pooled connection)."""
    cause = exc.__cause__
    if not isinstance(cause, DBAPIError) or not cause.connection_invalidated:
        return False
    text = str(cause.orig)
    return any(marker in text for marker in _UNSENT_MARKERS)


def retry_unsent(
    method: Callable[Concatenate[S, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, T]]:
    """Run an operation again, once, if its connection turned out dead before anything was sent.

    A pooled connection whose server went away is usually caught at checkout
    (``_engine``); this covers the moment between the server's goodbye and the
    socket closing. The pool has been invalidated by then, so the second attempt
    runs on a fresh connection. Any other failure is raised as it is: a statement
    that may have reached the server is never sent twice.
    """

    @functools.wraps(method)
    async def wrapper(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await method(self, *args, **kwargs)
        except DatabaseConnectionError as exc:
            if not _unsent(exc):
                raise
        return await method(self, *args, **kwargs)

    return wrapper
