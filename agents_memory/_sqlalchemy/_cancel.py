"""Cancellation safety: a database operation that has started is finished before a cancel lands.

aiosqlite runs every statement on a worker thread that a cancel cannot stop. When
the awaiting task is cancelled mid-statement, SQLAlchemy treats the connection as
broken and discards it while the thread is still using it: on a SQLite file the
half-closed connection keeps the write lock until garbage collection (every other
writer then fails with "database is locked"), and on in-memory SQLite the one
connection *is* the database, so all of it is lost. So on SQLite an operation runs
to completion in its own task, and the caller's ``CancelledError`` is raised after
it: the session is left fully before or fully after the operation.

The SQLite driver runner (``_databases/sqlite.py``) gets the same guarantee more
cheaply: an operation is one job on its own thread, and a cancel is raised once
that job is done; so only the SQLAlchemy runner on SQLite and a backend's first
operation (which checks the schema) are run to completion here.

Postgres needs none of this: a cancelled statement is cancelled on the server and
the connection is dropped, which rolls back anything uncommitted, so cancels there
stay prompt.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


async def run_to_completion(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` in its own task; if the caller is cancelled, wait for it, then re-raise.

    A cancel that arrives while the operation runs is held until the operation
    has finished (and its connection is back in the pool). If the operation task
    itself is cancelled (the loop shutting down), that propagates at once.
    """
    task = asyncio.ensure_future(coro)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():
                raise
            cancelled = True
    if cancelled:
        if not task.cancelled():
            task.exception()  # retrieved: the caller asked to be cancelled, not for the outcome
        raise asyncio.CancelledError
    return task.result()
