"""sweep_cells.mirrored: whether the Optuna mirror is done with a cell (flctl.study), and the index a mirror reads the
finished cells not mirrored through (mirrored, sweep_id, run_id), instead of every cell of the sweep and every trial
of its study.

A database that was mirrored before has its trials already: each cell whose run has a trial in its sweep's study
``flctl-<sweep id>`` (the trial's user attribute run_id) is marked here, so that the first mirror after the upgrade
adds no trial twice. Optuna's tables are read as Optuna 4 and 5 write them; a database without them has no study.

Revision ID: 0009
Revises: 0008
"""

import json

import sqlalchemy as sa
from alembic import op

from flctl.migrations import PAGE

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# What a study's name is: flctl.study's ``flctl-<sweep id>``.
STUDY_PREFIX = "flctl-"


def upgrade() -> None:
    conn = op.get_bind()
    have = sa.inspect(conn)
    # A database whose tables were made by this flctl and its version stamp set back (tests of older revisions'
    # data) has the column and the index already.
    if "mirrored" not in {c["name"] for c in have.get_columns("sweep_cells")}:
        op.add_column("sweep_cells", sa.Column("mirrored", sa.Boolean(), server_default=sa.false(), nullable=False))
    if "ix_sweep_cells_mirror" not in {i["name"] for i in have.get_indexes("sweep_cells")}:
        op.create_index("ix_sweep_cells_mirror", "sweep_cells", ["mirrored", "sweep_id", "run_id"])
    if {"studies", "trials", "trial_user_attributes"} <= set(have.get_table_names()):
        _mark_mirrored(conn)


def _mark_mirrored(conn: sa.Connection) -> None:
    """Mark the cells whose runs have a trial in their sweep's study, reading the trials' run ids a page at a time."""
    studies = sa.table("studies", sa.column("study_id", sa.Integer), sa.column("study_name", sa.String))
    trials = sa.table("trials", sa.column("trial_id", sa.Integer), sa.column("study_id", sa.Integer))
    attrs = sa.table("trial_user_attributes", sa.column("trial_user_attribute_id", sa.Integer),
                     sa.column("trial_id", sa.Integer), sa.column("key", sa.String), sa.column("value_json", sa.Text))
    cells = sa.table("sweep_cells", sa.column("sweep_id", sa.String), sa.column("run_id", sa.String),
                     sa.column("mirrored", sa.Boolean))
    mark = cells.update().where(cells.c.sweep_id == sa.bindparam("sid"), cells.c.run_id == sa.bindparam("rid")) \
        .values(mirrored=True)
    read = (sa.select(attrs.c.trial_user_attribute_id, studies.c.study_name, attrs.c.value_json)
            .select_from(attrs.join(trials, trials.c.trial_id == attrs.c.trial_id)
                         .join(studies, studies.c.study_id == trials.c.study_id))
            .where(attrs.c.key == "run_id", studies.c.study_name.startswith(STUDY_PREFIX, autoescape=True))
            .order_by(attrs.c.trial_user_attribute_id).limit(PAGE))
    last = -1
    while rows := conn.execute(read.where(attrs.c.trial_user_attribute_id > last)).all():
        found = []
        for _, name, value in rows:
            try:
                run_id = json.loads(value)
            except ValueError:     # not a run id flctl wrote: no cell of its
                continue
            if isinstance(run_id, str):
                found.append({"sid": name.removeprefix(STUDY_PREFIX), "rid": run_id})
        if found:
            conn.execute(mark, found)
        last = rows[-1][0]
