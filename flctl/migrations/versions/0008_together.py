"""runs.together: the key of the cells a run may train together with (RunConfig.together_id), and the index a
worker's claim reads (status, together, id), so that a claim takes the next cells through the index instead of
reading and parsing every cell of its sweep.

The key is derived from the stored config by flctl.config, unlike the defaults of 0004 and 0007, which are written
out: it is a cache of today's rule, and a change of the rule (RunConfig.together_key) needs a revision that fills it
again. A row whose config this flctl cannot read is left without one: it is claimed alone.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

from flctl.migrations import PAGE

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from flctl.config import RunConfig

    conn = op.get_bind()
    have = sa.inspect(conn)
    # A database whose tables were made by this flctl and its version stamp set back (tests of older revisions'
    # data) has the column and the index already.
    if "together" not in {c["name"] for c in have.get_columns("runs")}:
        op.add_column("runs", sa.Column("together", sa.String(16), nullable=True))
    if "ix_runs_claim" not in {i["name"] for i in have.get_indexes("runs")}:
        op.create_index("ix_runs_claim", "runs", ["status", "together", "id"])
    runs = sa.table("runs", sa.column("id", sa.String), sa.column("config", sa.JSON),
                    sa.column("together", sa.String))
    fill = runs.update().where(runs.c.id == sa.bindparam("run_id")).values(together=sa.bindparam("key"))
    last = ""
    while rows := conn.execute(sa.select(runs.c.id, runs.c.config).where(runs.c.id > last)
                               .order_by(runs.c.id).limit(PAGE)).all():
        keys = []
        for run_id, config in rows:
            try:
                keys.append({"run_id": run_id, "key": RunConfig.from_json(config).together_id})
            except Exception:      # a damaged or foreign config: reading that run names the damage (Run.record)
                pass
        if keys:
            conn.execute(fill, keys)
        last = rows[-1].id
