"""A sweep planned and recorded in bulk: its runs and cells written in one transaction (flctl.db.bulk), each new run
with its together key; a launch that reads back only the cells that were there and re-queues the lost and failed
ones as it did when it read the whole sweep; and validation that checks a field's value once per process yet refuses
every bad value as before. SQLite and PostgreSQL alike."""

from __future__ import annotations

import dataclasses
import os
import socket
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select, update

from flctl.config import RunConfig, validate
from flctl.db import Store
from flctl.db.liveness import db_now
from flctl.db.schema import Run, SweepCell
from flctl.errors import ConfigError
from flctl.launch.plan import _requeued
from flctl.status import Status
from tests.helpers import config
from tests.test_concurrency import database_url

pytestmark = pytest.mark.notorch


def cells(n: int, start: int = 0) -> list[RunConfig]:
    base = config("two-moons", "fl", epochs=1)
    return [dataclasses.replace(base, lr=1e-4 * (1 + i)) for i in range(start, start + n)]


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path):
    opened = Store.open(database_url(request.param, tmp_path))
    yield opened
    opened.close()


def test_a_sweep_is_recorded_in_bulk_once_each_new_run_with_its_together_key(store: Store) -> None:
    first = cells(6000)                # more than one chunk of rows (flctl.db.bulk.ROWS)
    added = store.create_sweep("bulk", "bulk", "two-moons", {}, first + first[:10])    # a cell given twice: one row
    assert sorted(added) == sorted(c.run_id for c in first)
    with store.session() as s:
        rows = {r.id: r for r in s.execute(select(Run.id, Run.together, Run.status, Run.attempts, Run.config_hash))}
        held = s.scalar(select(func.count()).select_from(SweepCell).where(SweepCell.sweep_id == "bulk"))
    assert held == len(rows) == 6000
    for c in first[::500]:
        r = rows[c.run_id]
        assert (r.together, r.status, r.attempts, r.config_hash) == (c.together_id, Status.QUEUED, 0, c.config_hash)
        assert store.get_run(c.run_id).cfg == c            # the config read back is the one planned
    # again, and with more: only what is new is written, the sweep keeps one cell a run
    assert store.create_sweep("bulk", "bulk", "two-moons", {}, first) == []
    more = cells(5, start=6000)
    assert sorted(store.create_sweep("bulk", "bulk", "two-moons", {}, first + more)) == sorted(c.run_id for c in more)
    with store.session() as s:
        assert s.scalar(select(func.count()).select_from(SweepCell).where(SweepCell.sweep_id == "bulk")) == 6005


def test_a_launch_requeues_lost_and_failed_cells_of_what_it_reads_back_by_id(store: Store) -> None:
    planned = cells(9)
    ids = [c.run_id for c in planned]
    store.create_sweep("relaunch", None, "two-moons", {}, planned[:8])
    with store.session() as s:
        old = db_now(s) - timedelta(hours=1)
        fresh = db_now(s)
    kinds = {                                   # (status, attempts, heartbeat, host, pid) as a worker left them
        "queued": (Status.QUEUED, 0, None, None, None), "done": (Status.COMPLETED, 1, old, "h", 1),
        "failed once": (Status.FAILED, 1, old, "h", 1), "failed out": (Status.FAILED, 3, old, "h", 1),
        "lost once": (Status.RUNNING, 1, old, "elsewhere", 1), "lost out": (Status.RUNNING, 3, old, "elsewhere", 1),
        "live": (Status.RUNNING, 1, fresh, socket.gethostname(), os.getpid()),
        "interrupted": (Status.INTERRUPTED, 1, old, "h", 1)}
    for run_id, (status, attempts, beat, host, pid) in zip(ids, kinds.values()):
        store.write(lambda s, r=run_id, v=dict(status=status, attempts=attempts, heartbeat_at=beat, host=host,
                                               pid=pid): s.execute(update(Run).where(Run.id == r).values(**v)))
    added = store.create_sweep("relaunch", None, "two-moons", {}, planned)
    assert added == [ids[8]]
    states, requeued, gave_up = _requeued(store, ids, set(added), max_attempts=3)
    by_kind = dict(zip([*kinds, "new"], ids))
    assert requeued == [by_kind["lost once"]] and gave_up == [by_kind["lost out"]]
    expected = {"queued": Status.QUEUED, "done": Status.COMPLETED, "failed once": Status.QUEUED,
                "failed out": Status.FAILED, "lost once": Status.QUEUED, "lost out": Status.FAILED,
                "live": Status.RUNNING, "interrupted": Status.INTERRUPTED, "new": Status.QUEUED}
    assert {k: states[i][0] for k, i in by_kind.items()} == expected
    # what it says is what the database holds
    assert {k: store.get_run(i).status for k, i in by_kind.items()} == expected


def test_validation_checks_a_value_once_yet_refuses_every_bad_value_as_before() -> None:
    """validate keeps the values that passed their field's checks (flctl.config._GOOD); a bad value, one of another
    type equal to a good one (True and 1), and a knob its method reads but that was left out (None, seen where the
    method ignores it) are refused all the same, with the same message."""
    fl = config("two-moons", "fl", epochs=1, seed=1)
    erm = config("two-moons", "erm", epochs=1, seed=1)
    for c in (fl, erm, *cells(50)):
        validate(c)
    bad = [("seed", True), ("lr", -1.0), ("epochs", 1.0), ("eps", float("nan")), ("optimizer", "adam"), ("lr", [1])]
    for field, value in bad:
        with pytest.raises(ConfigError, match=field):
            validate(dataclasses.replace(fl, **{field: value}))
    assert erm.eps is None
    with pytest.raises(ConfigError, match="needs a constraint level"):
        validate(dataclasses.replace(fl, eps=None))
    with pytest.raises(ConfigError, match="--dual-lr must be"):
        validate(dataclasses.replace(fl, dual_lr=None))
