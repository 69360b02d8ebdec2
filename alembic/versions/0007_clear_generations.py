"""Clear generations: a stale advanced-session object finds out that another one cleared.

One table named after the pair (``TableNames.clear_generations``): per session,
how many times an advanced session's ``clear_session`` has run. An object
whose current branch is not ``main`` remembers the count it chose that branch
at; once another object (or process) has cleared the session the count differs
and the object's next operation acts on ``main``, as the Agents SDK's
``AdvancedSQLiteSession`` does with its ``session_clear_generations`` table.
Keyed by ``session_id`` alone, with no foreign key: it outlives the clear, which
deletes the session row. Plain sessions never touch it.

A file written by the SDK's class holds ``session_clear_generations``; when its
tables point at this set's (0004's and 0005's test), its counts are adopted, the
sessions cleared meanwhile included (they have no session row).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# Frozen copies of the types at this revision (never import the live models here).
MYSQL = ("mysql", "mariadb")
SESSION_ID = sa.String(255)
MYSQL_COLLATIONS = ("utf8mb4_0900_bin", "utf8mb4_nopad_bin", "utf8mb4_bin")
SDK_STRUCTURE = "message_structure"
SDK_GENERATIONS = "session_clear_generations"


def _names() -> Any:  # noqa: ANN401
    return op.get_context().opts["agents_memory_tables"]


def _is_mysql() -> bool:
    return op.get_context().dialect.name in MYSQL


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


def _owned_by_set(insp: sa.Inspector, names: Any) -> bool:  # noqa: ANN401
    """0004's test: the SDK's structure table's session key points at this set's sessions."""
    if not insp.has_table(SDK_STRUCTURE) or not insp.has_table(SDK_GENERATIONS):
        return False
    return any(
        fk["referred_table"] == names.sessions and fk["constrained_columns"] == ["session_id"]
        for fk in insp.get_foreign_keys(SDK_STRUCTURE)
    )


def _adopt_sdk(names: Any) -> None:  # noqa: ANN401
    """The SDK's clear counts, into ours (0 is no row: nothing to adopt)."""
    if not _owned_by_set(sa.inspect(op.get_bind()), names):
        return
    source = sa.table(SDK_GENERATIONS, sa.column("session_id"), sa.column("generation"))
    target = sa.table(names.clear_generations, sa.column("session_id"), sa.column("generation"))
    rows = sa.select(source.c.session_id, source.c.generation).where(
        source.c.session_id.is_not(None),
        sa.func.length(source.c.session_id) <= SESSION_ID.length,
        source.c.generation > 0,
    )
    op.execute(target.insert().from_select(["session_id", "generation"], rows))


def upgrade() -> None:
    names = _names()
    op.create_table(
        names.clear_generations,
        sa.Column("session_id", SESSION_ID, primary_key=True),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        **_table_options(),
    )
    if not op.get_context().as_sql:
        _adopt_sdk(names)


def downgrade() -> None:
    op.drop_table(_names().clear_generations)
