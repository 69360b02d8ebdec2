"""Branch names outlive ``clear_session``, as in the Agents SDK: no cascade from the sessions row.

Revision 0004 gave ``TableNames.branches`` a foreign key (``ON DELETE CASCADE``)
to the sessions table, so a clear, which deletes the session row, also freed
every branch name the session had used. The SDK's ``AdvancedSQLiteSession``
keeps them reserved after a clear (a stale session object must never write into
a later branch that reused a name); this revision drops that foreign key.
Deleting a session for good (``SessionStore.delete_session``, ``prune()``,
``agents-memory sessions delete``) deletes its names explicitly.

A file the SDK's class wrote may hold reservations of sessions it cleared (no
session row, so 0004 did not adopt them); they are adopted here, when the SDK's
tables point at this set's, as 0004 decides.

The downgrade deletes the names of sessions that no longer exist (0004's shape
cannot hold them) and restores the foreign key.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# Frozen copies of the types at this revision (never import the live models here).
MYSQL = ("mysql", "mariadb")
SESSION_ID = sa.String(255)
BRANCH_ID = sa.String(255)
TIMESTAMP = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), *MYSQL)
FK = "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s"
SDK_STRUCTURE = "message_structure"
SDK_RESERVATIONS = "branch_reservations"


def _names() -> Any:  # noqa: ANN401
    return op.get_context().opts["agents_memory_tables"]


def _dialect() -> str:
    return str(op.get_context().dialect.name)


def _fk_name(names: Any) -> Any:  # noqa: ANN401
    """0004's foreign key name, as the naming convention made it (shortened per database)."""
    name = FK % {
        "table_name": names.branches,
        "column_0_name": "session_id",
        "referred_table_name": names.sessions,
    }
    return op.f(name)


def _now() -> Any:  # noqa: ANN401
    if _dialect() in MYSQL:
        return sa.text("CURRENT_TIMESTAMP(6)")
    return sa.func.current_timestamp()


def _sqlite_shape(names: Any, *, with_fk: bool) -> sa.Table:  # noqa: ANN401
    """The branches table as SQLite's batch mode rebuilds it (with or without 0004's key)."""
    metadata = sa.MetaData()
    sa.Table(names.sessions, metadata, sa.Column("session_id", SESSION_ID, primary_key=True))
    fk = (
        [sa.ForeignKey(f"{names.sessions}.session_id", ondelete="CASCADE", name=_fk_name(names))]
        if with_fk
        else []
    )
    return sa.Table(
        names.branches,
        metadata,
        sa.Column("session_id", SESSION_ID, *fk, nullable=False),
        sa.Column("branch_id", BRANCH_ID, nullable=False),
        sa.Column("created_at", TIMESTAMP, server_default=_now(), nullable=False),
        sa.PrimaryKeyConstraint("session_id", "branch_id", name=op.f(f"pk_{names.branches}")),
    )


def _owned_by_set(insp: sa.Inspector, names: Any) -> bool:  # noqa: ANN401
    """0004's test: the SDK's structure table's session key points at this set's sessions."""
    if not insp.has_table(SDK_STRUCTURE) or not insp.has_table(SDK_RESERVATIONS):
        return False
    return any(
        fk["referred_table"] == names.sessions and fk["constrained_columns"] == ["session_id"]
        for fk in insp.get_foreign_keys(SDK_STRUCTURE)
    )


def _adopt_cleared(names: Any) -> None:  # noqa: ANN401
    """The SDK's reservations 0004 left (sessions it had cleared), into ours."""
    if not _owned_by_set(sa.inspect(op.get_bind()), names):
        return
    source = sa.table(SDK_RESERVATIONS, sa.column("session_id"), sa.column("branch_id"))
    target = sa.table(names.branches, sa.column("session_id"), sa.column("branch_id"))
    ours = sa.select(target.c.branch_id).where(
        target.c.session_id == source.c.session_id, target.c.branch_id == source.c.branch_id
    )
    rows = (
        sa.select(source.c.session_id, source.c.branch_id)
        .distinct()
        .where(
            source.c.session_id.is_not(None),
            source.c.branch_id.is_not(None),
            sa.func.length(source.c.branch_id) <= BRANCH_ID.length,
            sa.func.length(source.c.session_id) <= SESSION_ID.length,
            ~sa.exists(ours),
        )
    )
    op.execute(target.insert().from_select(["session_id", "branch_id"], rows))


def upgrade() -> None:
    names = _names()
    if _dialect() == "sqlite":
        with op.batch_alter_table(
            names.branches, copy_from=_sqlite_shape(names, with_fk=False), recreate="always"
        ):
            pass
    else:
        op.drop_constraint(_fk_name(names), names.branches, type_="foreignkey")
    if not op.get_context().as_sql:
        _adopt_cleared(names)


def downgrade() -> None:
    names = _names()
    branches = sa.table(names.branches, sa.column("session_id"))
    sessions = sa.table(names.sessions, sa.column("session_id"))
    op.execute(
        branches.delete().where(
            ~sa.exists(
                sa.select(sessions.c.session_id).where(
                    sessions.c.session_id == branches.c.session_id
                )
            )
        )
    )
    if _dialect() == "sqlite":
        with op.batch_alter_table(
            names.branches, copy_from=_sqlite_shape(names, with_fk=True), recreate="always"
        ):
            pass
    else:
        op.create_foreign_key(
            _fk_name(names),
            names.branches,
            names.sessions,
            ["session_id"],
            ["session_id"],
            ondelete="CASCADE",
        )
