"""runs.trained_with: how a run was trained (engine, cells trained together, device name), as JSON.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("trained_with", sa.JSON(), nullable=True))
