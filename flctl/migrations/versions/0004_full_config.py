"""runs.config holds every field of the run: the later fields (flctl.config FieldSpec.later) that configs stored
before left out while at their default are filled in, at that default. (``engine`` is filled as eager also where
a run asked for captured, which the identity never told apart: ``trained_with`` says how the run trained.)

Revision ID: 0004
Revises: 0003
"""

from alembic import op

from flctl.migrations import fill_configs

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# The later fields as this revision knew them, with the defaults the stored rows were hashed under: written out,
# not read from flctl.config, so the revision does the same to every database whatever fields flctl gains later (a
# field added with later=True after it needs a revision of its own that fills it in).
LATER = {"warmup_steps": 0, "micro_batch": 0, "precision": "auto", "engine": "eager", "dual_optimizer": "gd",
         "kp": 0.0, "ki": 1.0, "nu": 0.0, "prune_after": 0, "prune_patience": 5}


def upgrade() -> None:
    fill_configs(op.get_bind(), LATER)
