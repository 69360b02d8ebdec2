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
import random
from collections.abc import Iterator
from typing import ParamSpec, TypeVar

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from agents_memory._databases import Database, database_for
from agents_memory._errors import AgentsMemoryError, DatabaseBusyError, DatabaseConnectionError

DEADLOCK_RETRIES = 5
"""How many times an operation chosen as a deadlock victim is run again before giving up."""
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
    return database_for(engine.dialect.name).describe(engine.url)


def on_other_loop(exc: BaseException) -> bool:
    """True for a driver's complaint that its connection belongs to another event loop."""
    return isinstance(exc, RuntimeError) and "attached to a different loop" in str(exc)


def _classify(exc: BaseException, db: type[Database]) -> str | None:
    """``"lost"``, ``"connect"``, ``"busy"`` or ``None`` (not a connection problem).

    What a driver's error code means is its database module's rule (``classify``).
    """
    if not isinstance(exc, DBAPIError):
        return "connect" if isinstance(exc, OSError) else None  # raised unwrapped at connect
    if exc.connection_invalidated:
        return "lost"
    kind = db.classify(exc.orig) if exc.orig is not None else None
    return None if kind == "deadlock" else kind


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
        if isinstance(exc, AgentsMemoryError):
            raise  # typed already (DatabaseConnectionError is an OSError): never wrapped twice
        db = database_for(engine.dialect.name)
        kind = _classify(exc, db)
        if kind is None:
            raise
        raise _typed(exc, kind, engine, db) from exc


def _typed(
    exc: BaseException, kind: str, engine: AsyncEngine, db: type[Database]
) -> DatabaseBusyError | DatabaseConnectionError:
    """The typed error for a driver error of ``kind``, its message naming the next step."""
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
        return DatabaseBusyError(msg)
    if kind == "lost":
        msg = (
            f"lost the connection to {where} during the operation ({reason}); it was "
            "applied completely or not at all, so check with get_items() before retrying "
            "a write. The next call uses a fresh connection."
        )
    elif (advice := db.cannot_open_advice(engine.url.database, kind)) is not None:
        msg = f"cannot open {where} ({reason}); {advice}"
    else:
        msg = (
            f"cannot connect to {where}: {reason}. Check that the server is running and "
            "reachable, and the URL's host, port, database name and credentials"
        )
    return DatabaseConnectionError(msg)


def _deadlocked(exc: DBAPIError, db: type[Database]) -> bool:
    """True when the database rolled this operation back whole (deadlock, serialization)."""
    return exc.orig is not None and db.classify(exc.orig) == "deadlock"


def retry_delay(exc: BaseException, attempt: int, db: type[Database]) -> float | None:
    """How long to wait before running a failed operation again, or ``None``: do not.

    ``attempt`` counts the failures so far (1 for the first). Two cases are safe:
    a statement the driver never sent (run again once), and an operation the server
    rolled back whole to resolve a conflict — a deadlock victim or a serialization
    failure (up to ``DEADLOCK_RETRIES`` times, then :class:`DatabaseBusyError`).
    """
    if not isinstance(exc, DBAPIError):
        return None
    if _deadlocked(exc, db):
        if attempt > DEADLOCK_RETRIES:
            msg = (
                f"the database rolled this operation back to resolve a conflict (a deadlock "
                f"victim or a serialization failure) on {attempt} attempts in a row; each "
                "time nothing was written, so it can be retried (many writers contend for "
                "the same session's rows)"
            )
            raise DatabaseBusyError(msg) from exc
        # Jitter, not a schedule: the other party should get through first.
        return random.uniform(0, 0.004 * 2**attempt)  # noqa: S311
    if attempt == 1 and exc.connection_invalidated:
        text = str(exc.orig)
        if any(marker in text for marker in _UNSENT_MARKERS):
            return 0.0
    return None
