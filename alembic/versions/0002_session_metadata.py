"""Session metadata (JSON) to tag and find conversations, and an index for recent-first listing.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

METADATA = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _names() -> Any:  # noqa: ANN401
    return op.get_context().opts["agents_memory_tables"]


def upgrade() -> None:
    names = _names()
    with op.batch_alter_table(names.sessions) as b:
        b.add_column(sa.Column("metadata", METADATA, nullable=True))
    op.create_index(None, names.sessions, ["updated_at"])  # type: ignore[arg-type]


def downgrade() -> None:
    names = _names()
    insp = sa.inspect(op.get_bind())
    for index in insp.get_indexes(names.sessions):
        if index["column_names"] == ["updated_at"]:
            op.drop_index(index["name"], table_name=names.sessions)  # type: ignore[arg-type]
    with op.batch_alter_table(names.sessions) as b:
        b.drop_column("metadata")
