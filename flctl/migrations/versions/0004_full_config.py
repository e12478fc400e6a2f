"""runs.config holds every field of the run: the later fields (flctl.config FieldSpec.later) that configs stored
before left out while at their default are filled in, at that default. (``engine`` is filled as eager also where
a run asked for captured, which the identity never told apart: ``trained_with`` says how the run trained.)

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# Rows read and written at a time: a database of many runs is not held in memory at once.
PAGE = 1000

# The later fields as this revision knew them, with the defaults the stored rows were hashed under: written out,
# not read from flctl.config, so the revision does the same to every database whatever fields flctl gains later (a
# field added with later=True after it needs a revision of its own that fills it in).
LATER = {"warmup_steps": 0, "micro_batch": 0, "precision": "auto", "engine": "eager", "dual_optimizer": "gd",
         "kp": 0.0, "ki": 1.0, "nu": 0.0, "prune_after": 0, "prune_patience": 5}


def upgrade() -> None:
    runs = sa.table("runs", sa.column("id", sa.String), sa.column("config", sa.JSON))
    fill = runs.update().where(runs.c.id == sa.bindparam("run_id")).values(config=sa.bindparam("full"))
    conn = op.get_bind()
    last = ""
    while rows := conn.execute(sa.select(runs.c.id, runs.c.config).where(runs.c.id > last)
                               .order_by(runs.c.id).limit(PAGE)).all():
        # A config that is not a JSON object is left as it is: reading that run names the damage (Run.record).
        changed = [{"run_id": run_id, "full": {**LATER, **config}} for run_id, config in rows
                   if isinstance(config, dict) and not LATER.keys() <= config.keys()]
        if changed:
            conn.execute(fill, changed)
        last = rows[-1].id
