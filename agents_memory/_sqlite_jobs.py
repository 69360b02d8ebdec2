"""The write transactions on a plain ``sqlite3`` connection, shared by both SQLite front ends.

``SQLAlchemySession`` runs each as one job on aiosqlite's thread
(``_sqlalchemy/_lite.py``), the stdlib ``SQLiteSession`` on its worker thread.
Written once, the two write the same rows the same way: the statements of
``DriverSQL``, ``BEGIN IMMEDIATE`` to ``COMMIT``, and a pop that removes corrupt
rows on its way to the newest valid item.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any

from agents_memory._codec import OnCorrupt, decode_row
from agents_memory._sqlalchemy._statements import DriverSQL


@contextlib.contextmanager
def write_transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """One write transaction: committed on success, rolled back on any error.

    ``BEGIN IMMEDIATE`` takes the file's write lock (waiting up to the busy
    timeout) before anything is read, so the transaction never meets the
    unretryable busy error of a reader that later tries to write.
    """
    if conn.in_transaction:  # someone else's leftover: never commit their work with ours
        conn.rollback()
    if not conn.in_transaction:  # (with sqlite3's autocommit=False one is always open)
        conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.commit()
    except BaseException:
        conn.rollback()
        raise


def add(conn: sqlite3.Connection, sql: DriverSQL, sid: str, data: Sequence[str]) -> None:
    """Upsert the session and insert every item, in one transaction."""
    with write_transaction(conn):
        conn.execute(sql.upsert_session, {"sid": sid})
        conn.executemany(sql.insert_message, [{"sid": sid, "data": d} for d in data])


def pop(
    conn: sqlite3.Connection, sql: DriverSQL, sid: str, on_corrupt: OnCorrupt
) -> dict[str, Any] | None:
    """Pop the newest valid item; corrupt rows on the way are removed (or, raising, kept)."""
    with write_transaction(conn):
        while True:
            # fetchall, not fetchone: the statement must be finished before COMMIT.
            rows = conn.execute(sql.pop, {"sid": sid}).fetchall()
            if not rows:
                return None
            item = decode_row(rows[0][1], row_id=rows[0][0], on_corrupt=on_corrupt)
            if item is not None:
                return item


def clear(conn: sqlite3.Connection, sql: DriverSQL, sid: str) -> bool:
    """Delete the items and the session row, in one transaction; whether the session existed."""
    with write_transaction(conn):
        conn.execute(sql.delete_messages, {"sid": sid})
        return conn.execute(sql.delete_session, {"sid": sid}).rowcount > 0
