"""runs.config holds every field of the run: the later fields (flctl.config FieldSpec.later) that configs stored
before left out while at their default are filled in, at that default.

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


def upgrade() -> None:
    from flctl.config import FIELDS

    # The fields' own defaults, not a copy of them: a later field's default is the value every run stored without it
    # used, and it cannot change without changing those runs' ids.
    later = {name: f.default for name, f in FIELDS.items() if f.later}
    runs = sa.table("runs", sa.column("id", sa.String), sa.column("config", sa.JSON))
    fill = runs.update().where(runs.c.id == sa.bindparam("run_id")).values(config=sa.bindparam("full"))
    conn = op.get_bind()
    last = ""
    while rows := conn.execute(sa.select(runs.c.id, runs.c.config).where(runs.c.id > last)
                               .order_by(runs.c.id).limit(PAGE)).all():
        # A config that is not a JSON object is left as it is: reading that run names the damage (Run.record).
        changed = [{"run_id": run_id, "full": {**later, **config}} for run_id, config in rows
                   if isinstance(config, dict) and not later.keys() <= config.keys()]
        if changed:
            conn.execute(fill, changed)
        last = rows[-1].id
