"""Baseline: the schema flctl created before migrations existed (flctl_meta schema_version 1).

Revision ID: 0001
Revises:
"""

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Databases at this revision were created with the tables as they were: nothing to change.
    pass
