"""Which keys of our schema lead with ``session_id``: what a sharded engine can route on.

A distributed SQL engine (Citus, Vitess, YugabyteDB, CockroachDB, TiDB) shards a
table by a column; a primary or unique key must contain it (Citus, Vitess) and
a lookup routes to one shard only when the index it uses leads with it. This
test records the truth at head, on every database, from SQLAlchemy's
inspector, so a revision that changes a key has to update it here: any change
fails.

Since revision 0006 (issue 17) items are keyed by ``(session_id, position)``, and
every primary key, unique key and index of our tables leads with ``session_id``,
except the sessions table's two listing indexes (``updated_at``, ``expires_at``):
non-unique, and serving listings that read every shard anyway (docs/scaling.md).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import inspect
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from agents_memory import TableNames, migrations

Key = tuple[str, tuple[str, ...], bool]
"""(kind, columns in order, whether the first column is ``session_id``)."""


def _key(kind: str, columns: list[Any]) -> Key:
    cols = tuple(str(c) for c in columns)
    return kind, cols, bool(cols) and cols[0] == "session_id"


EXPECTED: dict[str, set[Key]] = {
    "sessions": {
        _key("primary key", ["session_id"]),
        _key("index", ["updated_at"]),
        _key("index", ["expires_at"]),
    },
    "messages": {
        _key("primary key", ["session_id", "position"]),
    },
    "structure": {
        _key("primary key", ["session_id", "branch_id", "sequence_number"]),
        _key("index", ["session_id", "branch_id", "user_turn_number"]),
        _key("index", ["session_id", "message_position"]),
    },
    "turn_usage": {
        _key("primary key", ["session_id", "branch_id", "user_turn_number"]),
    },
    "branches": {
        _key("primary key", ["session_id", "branch_id"]),
    },
    "clear_generations": {
        _key("primary key", ["session_id"]),
    },
    "version_table": {
        _key("primary key", ["version_num"]),  # per lineage, not per session: keep it local
    },
}


def _keys(conn: Connection, table: str) -> set[Key]:
    insp = inspect(conn)
    found = {_key("primary key", insp.get_pk_constraint(table)["constrained_columns"])}
    uniques = {tuple(u["column_names"]) for u in insp.get_unique_constraints(table)}
    found |= {_key("unique", list(cols)) for cols in uniques}
    for index in insp.get_indexes(table):
        cols = tuple(index["column_names"])
        if index.get("unique") and cols in uniques:
            continue  # Postgres and MySQL list a unique constraint's index too
        found.add(_key("unique" if index.get("unique") else "index", list(cols)))
    return found


def _schema(conn: Connection, names: TableNames) -> dict[str, set[Key]]:
    tables = {
        "sessions": names.sessions,
        "messages": names.messages,
        "structure": names.structure,
        "turn_usage": names.turn_usage,
        "branches": names.branches,
        "clear_generations": names.clear_generations,
        "version_table": names.version_table,
    }
    return {role: _keys(conn, table) for role, table in tables.items()}


async def test_which_keys_lead_with_session_id(engine: AsyncEngine, names: TableNames) -> None:
    """At head, exactly these keys exist; those starting with session_id are marked True."""
    await migrations.upgrade(engine, sessions_table=names.sessions, messages_table=names.messages)
    async with engine.connect() as conn:
        found = await conn.run_sync(lambda c: _schema(c, names))
    assert found == EXPECTED
    listing = {_key("index", ["updated_at"]), _key("index", ["expires_at"])}
    not_leading = {
        (role, k)
        for role, keys in found.items()
        for k in keys
        if not k[2] and role != "version_table"
    }
    # every key a sharded engine must route on leads with session_id; only the sessions
    # table's primary key is session_id alone, and its listing indexes are the exceptions
    assert not_leading == {("sessions", k) for k in listing}
