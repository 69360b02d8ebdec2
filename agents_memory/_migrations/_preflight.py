"""Before the first DDL statement: the tables that exist must be ours, in the roles given.

Revision ``0001`` adopts existing tables in place, which is right for the
seed's or the Agents SDK's tables and wrong for anything else: swapped names
(``--sessions-table agent_messages --messages-table agent_sessions``) once made
MariaDB add ``updated_at`` to the real messages table before failing, and MySQL
has no transactional DDL to undo it. So the tables are looked at first, and a
mismatch changes nothing and says which tables exist and what is wrong.
"""

from __future__ import annotations

import difflib

from sqlalchemy import inspect
from sqlalchemy.engine import Connection, Inspector
from sqlalchemy.exc import NoSuchTableError

from agents_memory._errors import AgentsMemoryError
from agents_memory._tables import TableNames

SESSIONS_COLUMNS = frozenset({"session_id"})
"""The columns every sessions table we adopt or made has (the seed's included)."""
MESSAGES_COLUMNS = frozenset({"session_id", "message_data"})
"""The columns every messages table we adopt or made has (the seed's included), with one of
:data:`ITEM_KEYS`."""
ITEM_KEYS = frozenset({"id", "position"})
"""What orders a messages table's items: ``id`` (the SDK's, ours before 0006) or ``position``."""


class TableMismatchError(AgentsMemoryError, ValueError):
    """A table exists under a given name but is not ours in that role; nothing was changed."""


def shape_of(columns: set[str]) -> str | None:
    """``"sessions"``, ``"messages"`` or ``None``: which of our tables these columns make."""
    if columns >= MESSAGES_COLUMNS and columns & ITEM_KEYS:
        return "messages"
    if columns >= SESSIONS_COLUMNS and "message_data" not in columns:
        return "sessions"
    return None


def table_sets(insp: Inspector, near: TableNames | None = None) -> list[tuple[str, str]]:
    """The (sessions, messages) pairs in the database: a messages table and the table it refers to.

    Those most like ``near`` first (a misspelled name finds its set at the top of
    a long list). Read on the error path only (it looks at every table).
    """
    found: list[tuple[str, str]] = []
    for table in sorted(insp.get_table_names()):
        try:
            if shape_of({c["name"] for c in insp.get_columns(table)}) != "messages":
                continue
            keys = insp.get_foreign_keys(table)
        except NoSuchTableError:  # dropped meanwhile by someone else
            continue
        found.extend(
            (str(fk["referred_table"]), table)
            for fk in keys
            if fk["constrained_columns"] == ["session_id"] and fk.get("referred_table")
        )
    if near is not None:
        given = f"{near.sessions}/{near.messages}"
        found.sort(key=lambda pair: -difflib.SequenceMatcher(None, given, "/".join(pair)).ratio())
    return found


def mismatches(insp: Inspector, names: TableNames) -> list[str]:
    """One sentence per table that exists under a given name but is not ours in that role."""
    out = []
    for table, role in ((names.sessions, "sessions"), (names.messages, "messages")):
        if not insp.has_table(table):
            continue
        columns = {c["name"] for c in insp.get_columns(table)}
        shape = shape_of(columns)
        if shape == role:
            continue
        if shape is None:
            what = f"is not an agents_memory table (its columns: {', '.join(sorted(columns))})"
        else:
            what = f"is a {shape} table (it has {', '.join(sorted(columns))})"
        out.append(f"{table}, given as the {role} table, {what}")
    return out


def explain(insp: Inspector, names: TableNames, problems: list[str]) -> str:
    """The whole message: what is wrong, the likely fix, the table-name sets that do exist."""
    parts = [f"cannot use {names.sessions}/{names.messages}: " + "; ".join(problems)]
    existing = table_sets(insp, near=names)
    if (names.messages, names.sessions) in existing:
        parts.append(
            f"the names look swapped: use --sessions-table {names.messages} "
            f"--messages-table {names.sessions}"
        )
    if existing:
        parts.append(f"table-name sets in this database: {list_sets(existing)}")
    parts.append("nothing was changed")
    return "; ".join(parts)


MAX_LISTED = 10


def list_sets(sets: list[tuple[str, str]]) -> str:
    """``a/b, c/d`` (the first ten, and how many more)."""
    shown = ", ".join(f"{s}/{m}" for s, m in sets[:MAX_LISTED])
    more = len(sets) - MAX_LISTED
    return f"{shown} and {more} more" if more > 0 else shown


def check_tables(connection: Connection, names: TableNames) -> None:
    """Raise :class:`TableMismatchError` if a table of ``names`` exists in the wrong shape."""
    insp = inspect(connection)
    problems = mismatches(insp, names)
    if problems:
        raise TableMismatchError(explain(insp, names, problems))
