"""runs.config gains ``subset`` (flctl.config: keep N samples of each split; 0, every sample, in every run before).

Revision ID: 0005
Revises: 0004
"""

from alembic import op

from flctl.migrations import fill_configs

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# Written out, not read from flctl.config (see 0004): the default the stored rows were hashed under.
LATER = {"subset": 0}


def upgrade() -> None:
    fill_configs(op.get_bind(), LATER)
