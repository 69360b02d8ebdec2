"""The rules for values every backend shares: session ids, listing pages, SQL counts."""

from __future__ import annotations

SESSION_ID_MAX_LENGTH = 255
"""Longest ``session_id`` accepted: it is a primary key, and index entries are bounded
(Postgres btree rows, MySQL's 3072-byte key limit)."""


MAX_PAGE_SIZE = 1000
"""Most sessions one listing page returns (``SessionStore.list_sessions``, ``sessions list``)."""


MAX_SQL_INT = 2**63 - 1
"""The largest count a SQL ``LIMIT`` takes (a signed 64-bit integer on every database)."""


def check_sql_int(name: str, value: int) -> None:
    """Refuse a count no database can bind, instead of a raw ``OverflowError``/``DBAPIError``."""
    if value > MAX_SQL_INT:
        msg = f"{name} must be at most {MAX_SQL_INT} (a 64-bit SQL integer), got {value}"
        raise ValueError(msg)


def validate_session_id(session_id: object) -> str:
    """Return ``session_id`` if it can be stored and found again exactly; raise otherwise."""
    if not isinstance(session_id, str):
        msg = f"session_id must be a str, got {type(session_id).__name__}"
        raise TypeError(msg)
    if not session_id:
        msg = "session_id must not be empty"
        raise ValueError(msg)
    if len(session_id) > SESSION_ID_MAX_LENGTH:
        msg = f"session_id is {len(session_id)} characters long; at most {SESSION_ID_MAX_LENGTH}"
        raise ValueError(msg)
    if "\x00" in session_id:
        msg = "session_id must not contain NUL characters"
        raise ValueError(msg)
    try:
        session_id.encode("utf-8")
    except UnicodeEncodeError:
        msg = "session_id must be valid Unicode text (it holds a lone surrogate)"
        raise ValueError(msg) from None
    return session_id
