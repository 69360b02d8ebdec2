"""Baseline: the seed-compatible schema, or adopt the tables an earlier store created.

A database written by the seed's ``SQLiteSession``, by the Agents SDK's
``SQLAlchemySession`` or by ``create_tables=True`` before migrations existed
already holds these tables; they are brought to this shape in place, keeping
every row (ids included).

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# Frozen copies of the types at this revision (never import the live models here).
ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
SESSION_ID = sa.String(255)


def _names() -> Any:  # noqa: ANN401
    return op.get_context().opts["agents_memory_tables"]


def _timestamp(name: str) -> sa.Column[Any]:
    return sa.Column(
        name, sa.DateTime(), server_default=sa.func.current_timestamp(), nullable=False
    )


def _create_sessions(table: str) -> None:
    op.create_table(
        table,
        sa.Column("session_id", SESSION_ID, primary_key=True),
        _timestamp("created_at"),
        _timestamp("updated_at"),
    )


def _create_messages(table: str, sessions: str) -> None:
    op.create_table(
        table,
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column(
            "session_id",
            SESSION_ID,
            sa.ForeignKey(f"{sessions}.session_id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("message_data", sa.Text(), nullable=False),
        _timestamp("created_at"),
        sqlite_autoincrement=True,
    )
    op.create_index(None, table, ["session_id", "id"])  # type: ignore[arg-type]


def _fill_null_times(table: str, columns: list[str]) -> None:
    for column in columns:
        op.execute(
            sa.text(f"UPDATE {table} SET {column} = CURRENT_TIMESTAMP WHERE {column} IS NULL")
        )


def _adopt(insp: sa.Inspector, names: Any) -> None:  # noqa: ANN401
    """Bring existing seed/SDK/early tables to the baseline shape without losing a row."""
    dialect = op.get_bind().dialect.name
    s_cols = {c["name"]: c for c in insp.get_columns(names.sessions)}
    m_cols = {c["name"]: c for c in insp.get_columns(names.messages)}
    _fill_null_times(names.sessions, [c for c in ("created_at", "updated_at") if c in s_cols])
    _fill_null_times(names.messages, ["created_at"] if "created_at" in m_cols else [])

    with op.batch_alter_table(
        names.sessions, recreate="always" if dialect == "sqlite" else "auto"
    ) as b:
        # SQLite reports a PRIMARY KEY column without NOT NULL as nullable (seed tables).
        b.alter_column("session_id", type_=SESSION_ID, nullable=False)
        for column in ("created_at", "updated_at"):
            if column in s_cols:
                b.alter_column(
                    column,
                    type_=sa.DateTime(),
                    nullable=False,
                    server_default=sa.func.current_timestamp(),
                )
            else:
                b.add_column(_timestamp(column))

    seed_index_names = {f"idx_{names.messages}_session_time"}
    with op.batch_alter_table(
        names.messages,
        recreate="always" if dialect == "sqlite" else "auto",
        table_kwargs={"sqlite_autoincrement": True},
    ) as b:
        b.alter_column("id", type_=ID, nullable=False)
        b.alter_column("session_id", type_=SESSION_ID, nullable=False)
        b.alter_column(
            "created_at",
            type_=sa.DateTime(),
            nullable=False,
            server_default=sa.func.current_timestamp(),
        )
        for index in insp.get_indexes(names.messages):
            if index["name"] in seed_index_names or index["column_names"] == ["session_id", "id"]:
                b.drop_index(index["name"])  # type: ignore[arg-type]
    if dialect == "postgresql":
        # A SERIAL column's sequence is int4 too: widen it with the column.
        op.execute(
            sa.text(
                f"DO $$ DECLARE seq text := pg_get_serial_sequence('{names.messages}', 'id'); "
                "BEGIN "
                "IF seq IS NOT NULL THEN EXECUTE format('ALTER SEQUENCE %s AS BIGINT', seq); "
                "END IF; END $$"
            )
        )
    op.create_index(None, names.messages, ["session_id", "id"])  # type: ignore[arg-type]


def upgrade() -> None:
    names = _names()
    if op.get_context().as_sql:  # offline: nothing to inspect, emit the plain DDL
        _create_sessions(names.sessions)
        _create_messages(names.messages, names.sessions)
        return
    insp = sa.inspect(op.get_bind())
    has_sessions = insp.has_table(names.sessions)
    has_messages = insp.has_table(names.messages)
    if has_sessions and has_messages:
        _adopt(insp, names)
        return
    if has_sessions or has_messages:
        missing = names.messages if has_sessions else names.sessions
        msg = (
            f"only one of the agents_memory tables exists ({missing} is missing); "
            "restore it or drop the other before migrating"
        )
        raise RuntimeError(msg)
    _create_sessions(names.sessions)
    _create_messages(names.messages, names.sessions)


def downgrade() -> None:
    names = _names()
    op.drop_table(names.messages)
    op.drop_table(names.sessions)
