"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}


def upgrade() -> None:
    names = op.get_context().opts["agents_memory_tables"]  # never a literal table name
    ${upgrades if upgrades else "pass"}


def downgrade() -> None:
    names = op.get_context().opts["agents_memory_tables"]
    ${downgrades if downgrades else "pass"}
