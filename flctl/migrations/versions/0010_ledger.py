"""runs: the index a sweep's ledger counts through (status, method, id; flctl.db.counts), so that `flctl status` over
100,000 cells reads an index of a few MB instead of every cell's row with its config (~1 KB each).

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A database whose tables were made by this flctl and its version stamp set back (tests of older revisions'
    # data) has the index already.
    if "ix_runs_ledger" not in {i["name"] for i in sa.inspect(op.get_bind()).get_indexes("runs")}:
        op.create_index("ix_runs_ledger", "runs", ["status", "method", "id"])

