"""The default engine became ``auto`` (flctl.step.step_engine: captured on CUDA where a replay equals the eager step,
else eager). Every stored row holds its engine since 0004, at the value it trained under; a row without one is
filled with the new default. The identity never held eager, captured or auto (the same numbers), so no id moves.

Revision ID: 0007
Revises: 0006
"""

from alembic import op

from flctl.migrations import fill_configs

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# Written out, not read from flctl.config (see 0004).
LATER = {"engine": "auto"}


def upgrade() -> None:
    fill_configs(op.get_bind(), LATER)
