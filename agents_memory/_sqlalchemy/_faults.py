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
from collections.abc import Iterator

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from agents_memory._errors import DatabaseConnectionError
from agents_memory._urls import mask_url

# Postgres SQLSTATEs that mean "could not connect" rather than "this statement failed".
_CONNECT_SQLSTATES = {"28000", "28P01", "3D000", "57P03", "53300"}
# ... and those that mean "the server ended this connection".
_LOST_SQLSTATES = {"57P01", "57P02"}
_SQLITE_CANTOPEN = 14


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
    """``"lost"``, ``"connect"`` or ``None`` (not a connection problem)."""
    if not isinstance(exc, DBAPIError):
        return "connect" if isinstance(exc, OSError) else None  # asyncpg raises these unwrapped
    orig = exc.orig
    sqlstate = str(getattr(orig, "sqlstate", None) or "")
    kind: str | None = None
    if exc.connection_invalidated or sqlstate in _LOST_SQLSTATES or sqlstate.startswith("08"):
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
    """Re-raise connection failures inside the block as :class:`DatabaseConnectionError`."""
    try:
        yield
    except (DBAPIError, OSError) as exc:
        kind = _classify(exc)
        if kind is None:
            raise
        cause = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
        reason = _reason(cause, engine.url.password)
        where = _where(engine)
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
