"""The one place where a failed or lost database connection becomes a typed, readable error.

Drivers report the same few situations in many shapes: a refused port is a bare
``ConnectionRefusedError``, an unknown host a ``socket.gaierror`` that names no
host, a connection the server dropped an ``InterfaceError`` mid-statement, a bad
password an authentication error. Callers get :class:`DatabaseConnectionError`
instead, naming the database by its masked URL (never the password) and the next
thing to check.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
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
# A deadlock victim's work was rolled back whole: Postgres' deadlock_detected, InnoDB's
# ER_LOCK_DEADLOCK (which rolls back the whole transaction, not just the statement).
_DEADLOCK_SQLSTATES = {"40P01"}
_MYSQL_DEADLOCK = 1213
DEADLOCK_RETRIES = 5
"""How many times an operation chosen as a deadlock victim is run again before giving up."""
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


def on_other_loop(exc: BaseException) -> bool:
    """True for a driver's complaint that its connection belongs to another event loop."""
    return isinstance(exc, RuntimeError) and "attached to a different loop" in str(exc)


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
    except RuntimeError as exc:
        if not on_other_loop(exc):
            raise
        msg = (
            f"a pooled connection to {_where(engine)} was opened on another event loop (this "
            "engine was used under an earlier asyncio.run() or another loop) and cannot be "
            "used here; the operation may or may not have been applied, so check with "
            "get_items() before retrying a write. Call `await engine.dispose()` when moving "
            "an engine to a new event loop, or create it inside the loop that uses it "
            "(stores made with from_url() do this themselves)"
        )
        raise DatabaseConnectionError(msg) from exc
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


def _deadlocked(exc: DBAPIError) -> bool:
    """True when the database rolled this operation back to break a deadlock."""
    orig = exc.orig
    if str(getattr(orig, "sqlstate", None) or "") in _DEADLOCK_SQLSTATES:
        return True
    args: tuple[object, ...] = getattr(orig, "args", ())
    return bool(args) and args[0] == _MYSQL_DEADLOCK


def retry_delay(exc: BaseException, attempt: int) -> float | None:
    """How long to wait before running a failed operation again, or ``None``: do not.

    ``attempt`` counts the failures so far (1 for the first). The same two cases
    as :func:`retry_when_safe`: a statement the driver never sent (once), and a
    deadlock victim (up to ``DEADLOCK_RETRIES`` times, then
    :class:`DatabaseBusyError`).
    """
    if not isinstance(exc, DBAPIError):
        return None
    if _deadlocked(exc):
        if attempt > DEADLOCK_RETRIES:
            msg = (
                f"the database chose this operation as a deadlock victim on {attempt} "
                "attempts in a row; each time it was rolled back whole, so nothing was "
                "written and it can be retried (many writers contend for the same "
                "session's rows)"
            )
            raise DatabaseBusyError(msg) from exc
        # Jitter, not a schedule: the other party should get through first.
        return random.uniform(0, 0.004 * 2**attempt)  # noqa: S311
    if attempt == 1 and exc.connection_invalidated:
        text = str(exc.orig)
        if any(marker in text for marker in _UNSENT_MARKERS):
            return 0.0
    return None


def retry_when_safe(
    method: Callable[Concatenate[S, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, T]]:
    """Run an operation again when the database guarantees none of it was applied.

    Two such cases:

    * its connection turned out dead before anything was sent (retried once). A
      pooled connection whose server went away is usually caught at checkout
      (``_engine``); this covers the moment between the server's goodbye and the
      socket closing. The pool has been invalidated by then, so the second attempt
      runs on a fresh connection;
    * it was chosen as a deadlock victim (concurrent pops on MySQL/MariaDB meet
      InnoDB's next-key locks): its transaction was rolled back whole. It is run
      again after a short random pause, up to ``DEADLOCK_RETRIES`` times, then
      :class:`DatabaseBusyError`.

    Any other failure is raised as it is: a statement that may have taken effect
    is never sent twice.
    """

    @functools.wraps(method)
    async def wrapper(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        resent = False
        deadlocks = 0
        while True:
            try:
                return await method(self, *args, **kwargs)
            except DatabaseConnectionError as exc:
                if resent or not _unsent(exc):
                    raise
                resent = True
            except DBAPIError as exc:
                if not _deadlocked(exc):
                    raise
                deadlocks += 1
                if deadlocks > DEADLOCK_RETRIES:
                    msg = (
                        f"the database chose this operation as a deadlock victim on {deadlocks} "
                        "attempts in a row; each time it was rolled back whole, so nothing was "
                        "written and it can be retried (many writers contend for the same "
                        "session's rows)"
                    )
                    raise DatabaseBusyError(msg) from exc
                # Jitter, not a schedule: the other party should get through first.
                await asyncio.sleep(random.uniform(0, 0.004 * 2**deadlocks))  # noqa: S311

    return wrapper
