"""runs.provenance: where the task's and the method's code came from (flctl.plugins), as JSON.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A database whose tables were made by this flctl and its version stamp set back (tests of older revisions'
    # data) has the column already.
    if "provenance" not in {c["name"] for c in sa.inspect(op.get_bind()).get_columns("runs")}:
        op.add_column("runs", sa.Column("provenance", sa.JSON(), nullable=True))
