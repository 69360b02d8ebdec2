"""Retention: a per-session expiry time, and an index for the sweeps that remove expired sessions.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TIMESTAMP = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def _names() -> Any:  # noqa: ANN401
    return op.get_context().opts["agents_memory_tables"]


def upgrade() -> None:
    names = _names()
    with op.batch_alter_table(names.sessions) as b:
        b.add_column(sa.Column("expires_at", TIMESTAMP, nullable=True))
    op.create_index(None, names.sessions, ["expires_at"])  # type: ignore[arg-type]


def downgrade() -> None:
    names = _names()
    insp = sa.inspect(op.get_bind())
    for index in insp.get_indexes(names.sessions):
        if index["column_names"] == ["expires_at"]:
            op.drop_index(index["name"], table_name=names.sessions)  # type: ignore[arg-type]
    with op.batch_alter_table(names.sessions) as b:
        b.drop_column("expires_at")
