"""runs.claim_token: the fencing token of a run's current claim (new at every claim).

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("claim_token", sa.String(32), nullable=True))
