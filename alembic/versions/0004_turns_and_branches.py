"""Turns, branches and token usage for the advanced sessions; adopt the Agents SDK's rows.

Three tables named after the pair (``TableNames.structure``, ``.turn_usage``,
``.branches``), each with a foreign key (``ON DELETE CASCADE``) to the sessions
table, and the structure rows also to the messages table, so clearing or
deleting a session removes them. Plain sessions never write to them.

A database written by the Agents SDK's ``AdvancedSQLiteSession`` holds its own
``message_structure``, ``turn_usage`` and ``branch_reservations`` tables; when
their foreign keys point at this set's tables, their rows are copied into ours
(branches, turn numbers and usage kept). The SDK's tables are left in place.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# Frozen copies of the types at this revision (never import the live models here).
MYSQL = ("mysql", "mariadb")
ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
SESSION_ID = sa.String(255)
BRANCH_ID = sa.String(255)
TIMESTAMP = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), *MYSQL)
MYSQL_COLLATIONS = ("utf8mb4_0900_bin", "utf8mb4_nopad_bin", "utf8mb4_bin")

SDK_STRUCTURE = "message_structure"
SDK_USAGE = "turn_usage"
SDK_RESERVATIONS = "branch_reservations"
STRUCTURE_COLUMNS = (
    "session_id",
    "message_id",
    "branch_id",
    "message_type",
    "sequence_number",
    "user_turn_number",
    "branch_turn_number",
    "tool_name",
)
USAGE_COUNTS = ("requests", "input_tokens", "output_tokens", "total_tokens")
USAGE_DETAILS = ("input_tokens_details", "output_tokens_details")


def _names() -> Any:  # noqa: ANN401
    return op.get_context().opts["agents_memory_tables"]


def _is_mysql() -> bool:
    return op.get_context().dialect.name in MYSQL


def _now() -> Any:  # noqa: ANN401
    return sa.text("CURRENT_TIMESTAMP(6)") if _is_mysql() else sa.func.current_timestamp()


def _created_at() -> sa.Column[Any]:
    return sa.Column("created_at", TIMESTAMP, server_default=_now(), nullable=False)


def _mysql_collation() -> str:
    if op.get_context().as_sql:
        return MYSQL_COLLATIONS[-1]
    name = sa.column("COLLATION_NAME", sa.String())
    query = (
        sa.select(name)
        .select_from(sa.table("COLLATIONS", name, schema="information_schema"))
        .where(name.in_(MYSQL_COLLATIONS))
    )
    present = set(op.get_bind().execute(query).scalars())
    return next((c for c in MYSQL_COLLATIONS if c in present), MYSQL_COLLATIONS[-1])


def _table_options() -> dict[str, str]:
    if not _is_mysql():
        return {}
    options = {"engine": "InnoDB", "charset": "utf8mb4", "collate": _mysql_collation()}
    return {f"{d}_{k}": v for d in MYSQL for k, v in options.items()}


def _session_fk(names: Any) -> sa.Column[Any]:  # noqa: ANN401
    return sa.Column(
        "session_id",
        SESSION_ID,
        sa.ForeignKey(f"{names.sessions}.session_id", ondelete="CASCADE"),
        nullable=False,
    )


def _create(names: Any) -> None:  # noqa: ANN401
    options = _table_options()
    op.create_table(
        names.structure,
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        _session_fk(names),
        sa.Column(
            "message_id",
            ID,
            sa.ForeignKey(f"{names.messages}.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("branch_id", BRANCH_ID, nullable=False),
        sa.Column("message_type", sa.Text(), nullable=False),
        sa.Column("sequence_number", sa.BigInteger(), nullable=False),
        sa.Column("user_turn_number", sa.Integer(), nullable=True),
        sa.Column("branch_turn_number", sa.Integer(), nullable=True),
        sa.Column("tool_name", sa.Text(), nullable=True),
        _created_at(),
        sqlite_autoincrement=True,
        **options,
    )
    op.create_index(None, names.structure, ["session_id", "branch_id", "sequence_number"])  # type: ignore[arg-type]
    op.create_index(None, names.structure, ["branch_id", "session_id", "user_turn_number"])  # type: ignore[arg-type]
    op.create_index(None, names.structure, ["message_id"])  # type: ignore[arg-type]
    op.create_table(
        names.turn_usage,
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        _session_fk(names),
        sa.Column("branch_id", BRANCH_ID, nullable=False),
        sa.Column("user_turn_number", sa.Integer(), nullable=False),
        *(sa.Column(c, sa.BigInteger(), nullable=False) for c in USAGE_COUNTS),
        *(sa.Column(c, sa.Text(), nullable=True) for c in USAGE_DETAILS),
        _created_at(),
        sa.UniqueConstraint("session_id", "branch_id", "user_turn_number"),
        sqlite_autoincrement=True,
        **options,
    )
    op.create_table(
        names.branches,
        sa.Column(
            "session_id",
            SESSION_ID,
            sa.ForeignKey(f"{names.sessions}.session_id", ondelete="CASCADE"),
        ),
        sa.Column("branch_id", BRANCH_ID),
        _created_at(),
        sa.PrimaryKeyConstraint("session_id", "branch_id"),
        **options,
    )


def _table(name: str, *columns: str) -> sa.TableClause:
    return sa.table(name, *(sa.column(c) for c in columns))


def _owned_by(insp: sa.Inspector, table: str, names: Any) -> bool:  # noqa: ANN401
    """Whether the SDK's ``table`` exists and its session key points at this set's sessions."""
    if not insp.has_table(table):
        return False
    return any(
        fk["referred_table"] == names.sessions and fk["constrained_columns"] == ["session_id"]
        for fk in insp.get_foreign_keys(table)
    )


def _adopt_sdk(names: Any) -> None:  # noqa: ANN401
    """Copy the SDK's ``AdvancedSQLiteSession`` rows of this set into our tables."""
    insp = sa.inspect(op.get_bind())
    sessions = sa.table(names.sessions, sa.column("session_id"))
    messages = sa.table(names.messages, sa.column("id"))
    if _owned_by(insp, SDK_STRUCTURE, names):
        source = _table(SDK_STRUCTURE, "id", "created_at", *STRUCTURE_COLUMNS)
        target = _table(names.structure, "created_at", *STRUCTURE_COLUMNS)
        rows = (
            sa.select(
                *(source.c[c] for c in STRUCTURE_COLUMNS),
                sa.func.coalesce(source.c.created_at, sa.func.current_timestamp()),
            )
            .where(
                source.c.session_id.in_(sa.select(sessions.c.session_id)),
                source.c.message_id.in_(sa.select(messages.c.id)),
                source.c.message_type.is_not(None),
                source.c.sequence_number.is_not(None),
            )
            .order_by(source.c.id)
        )
        op.execute(target.insert().from_select([*STRUCTURE_COLUMNS, "created_at"], rows))
    if _owned_by(insp, SDK_USAGE, names):
        keys = ("session_id", "branch_id", "user_turn_number")
        source = _table(SDK_USAGE, "id", "created_at", *keys, *USAGE_COUNTS, *USAGE_DETAILS)
        target = _table(names.turn_usage, "created_at", *keys, *USAGE_COUNTS, *USAGE_DETAILS)
        rows = (
            sa.select(
                *(source.c[c] for c in keys),
                *(sa.func.coalesce(source.c[c], 0) for c in USAGE_COUNTS),
                *(source.c[c] for c in USAGE_DETAILS),
                sa.func.coalesce(source.c.created_at, sa.func.current_timestamp()),
            )
            .where(source.c.session_id.in_(sa.select(sessions.c.session_id)))
            .order_by(source.c.id)
        )
        columns = [*keys, *USAGE_COUNTS, *USAGE_DETAILS, "created_at"]
        op.execute(target.insert().from_select(columns, rows))
    if insp.has_table(SDK_RESERVATIONS) and _owned_by(insp, SDK_STRUCTURE, names):
        source = sa.table(SDK_RESERVATIONS, sa.column("session_id"), sa.column("branch_id"))
        target = sa.table(names.branches, sa.column("session_id"), sa.column("branch_id"))
        rows = (
            sa.select(source.c.session_id, source.c.branch_id)
            .distinct()
            .where(source.c.session_id.in_(sa.select(sessions.c.session_id)))
        )
        op.execute(target.insert().from_select(["session_id", "branch_id"], rows))


def upgrade() -> None:
    names = _names()
    _create(names)
    if not op.get_context().as_sql:
        _adopt_sdk(names)


def downgrade() -> None:
    names = _names()
    op.drop_table(names.branches)
    op.drop_table(names.turn_usage)
    op.drop_table(names.structure)
