"""The grid mirror's trials written in one transaction (flctl.study.add_trials) are the trials Optuna's own
study.add_trial writes, field for field: on the newest Optuna here and on the lowest the bounds allow (.ci/run's
notorch leg runs this module there)."""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta
from pathlib import Path

import pytest

pytestmark = pytest.mark.notorch


def _trials() -> list:
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState, create_trial

    dists = {"eps": CategoricalDistribution([None, 0.05, 0.1]), "method": CategoricalDistribution(["erm", "fl"]),
             "seed": CategoricalDistribution([0, 1, 2])}
    made = []
    for i, (eps, method, seed, value) in enumerate([(None, "erm", 0, 0.25), (0.05, "fl", 1, math.inf),
                                                    (0.1, "fl", 2, None), (0.05, "fl", 0, -1e-9)]):
        ok = value is not None
        trial = create_trial(params={"eps": eps, "method": method, "seed": seed}, distributions=dists, value=value,
                             state=TrialState.COMPLETE if ok else TrialState.FAIL,
                             user_attrs={"run_id": f"{i:016x}", "status": "completed" if ok else "diverged"})
        trial.datetime_complete = datetime(2026, 11, 28, 12, 0, i)
        trial.datetime_start = trial.datetime_complete - timedelta(seconds=3.5 * i)
        made.append(trial)
    return made


def _seen(study) -> list[tuple]:
    return [(t.number, t.state, t.value, t.params, t.distributions, t.user_attrs, t.system_attrs,
             t.intermediate_values, t.datetime_start, t.datetime_complete) for t in study.get_trials(deepcopy=False)]


@pytest.mark.parametrize("tables", [True, False], ids=["tables", "add_trial"])
def test_trials_added_in_one_transaction_are_those_add_trial_adds(tmp_path: Path, tables: bool,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import optuna
    from sqlalchemy import event

    import flctl.study_rdb
    from flctl.study import add_trials

    if not tables:      # an Optuna major the fast path was not checked on: add_trial, a trial at a time
        monkeypatch.setattr(flctl.study_rdb, "FIELD_CHECKED_MAJORS", ())
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'optuna.db'}")
    theirs = optuna.create_study(storage=storage, study_name="theirs")
    ours = optuna.create_study(storage=storage, study_name="ours")
    for trial in _trials():
        theirs.add_trial(trial)
    commits: list[int] = []
    event.listen(storage.engine, "commit", lambda conn: commits.append(1))
    add_trials(storage, ours, _trials()[:1])           # a later sync numbers its trials after those there
    add_trials(storage, ours, _trials()[1:])
    add_trials(storage, ours, [])
    assert len(commits) == (2 if tables else len(_trials()))
    assert _seen(optuna.load_study(study_name="ours", storage=storage)) == \
        _seen(optuna.load_study(study_name="theirs", storage=storage))
    assert [t.number for t in ours.get_trials()] == [0, 1, 2, 3]


def test_the_installed_optuna_is_a_major_the_tables_were_checked_on() -> None:
    """add_trials writes Optuna's private tables only on the majors the test above held equal to add_trial's: a new
    major fails here (and goes through add_trial) until that test has run on it and its major is added."""
    import optuna

    from flctl.study_rdb import FIELD_CHECKED_MAJORS, writes_tables

    assert writes_tables(optuna.__version__), (
        f"Optuna {optuna.__version__} is of no major in flctl.study_rdb.FIELD_CHECKED_MAJORS {FIELD_CHECKED_MAJORS}: "
        "run test_trials_added_in_one_transaction_are_those_add_trial_adds on it, then add its major")
    assert not writes_tables(f"{max(FIELD_CHECKED_MAJORS) + 1}.0.0") and not writes_tables("dev")


# ---- the mirror of a grid sweep (flctl.study.sync_sweep) ----

BACKENDS = ["sqlite", "postgresql", "pgbouncer"]       # tests.test_concurrency.database_url's


def _url(backend: str, tmp_path: Path) -> str:
    from tests.test_concurrency import database_url

    return database_url(backend, tmp_path)


def _grid(url: str, cells: int) -> tuple:
    """A store on ``url`` holding the grid sweep "grid" of ``cells`` queued cells (seeds x two learning rates)."""
    from flctl.db import Store
    from tests.helpers import config

    store = Store.open(url)
    configs = [config("two-moons", "fl", seed=s, lr=lr) for s in range(cells // 2) for lr in (1e-3, 1e-2)]
    store.create_sweep("grid", "grid", "two-moons", {}, configs)
    return store, configs


def _finish(store, configs: list, status: str = "completed") -> None:
    """The cells of ``configs`` claimed and finished as workers finish them, train.avg_loss = seed + lr."""
    from flctl.db import RunQueue
    from flctl.db.queue import Ended

    queue = RunQueue(store)
    tokens = {c.run_id: queue.claim_run(c.run_id) for c in configs}
    assert all(tokens.values())
    diverged = {"epoch": 1} if status == "diverged" else None
    assert not queue.finish_runs({c.run_id: Ended(tokens[c.run_id], status, 1, {"train.avg_loss": c.seed + c.lr},
                                                  diverged, 0, {}, 2.5) for c in configs})


def _mirrored(url: str) -> list:
    """The trials of the study of the sweep "grid"."""
    import optuna

    from flctl.db import existing_storage

    storage = existing_storage(url)
    try:
        return optuna.load_study(study_name="flctl-grid", storage=storage).get_trials(deepcopy=False)
    finally:
        storage.engine.dispose()


def _marked(store) -> set[str]:
    from sqlalchemy import select

    from flctl.db.schema import SweepCell

    with store.session() as s:
        return set(s.scalars(select(SweepCell.run_id).where(SweepCell.mirrored)).all())


def _limit(context) -> int | None:
    """The LIMIT an executed statement was sent with (None: none), read from the values it was sent with: the
    compiled statement is cached, with the LIMIT of the first one compiled."""
    compiled = getattr(context, "compiled", None)
    clause = getattr(getattr(compiled, "statement", None), "_limit_clause", None)
    if clause is None:
        return None
    return context.compiled_parameters[0][compiled.bind_names[clause]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sync_reads_and_adds_only_the_cells_finished_since_the_last(tmp_path: Path, backend: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import optuna
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    from flctl import study
    from flctl.study import sync_sweep

    url = _url(backend, tmp_path)
    store, configs = _grid(url, 40)
    assert sync_sweep(store, url, "grid", direction="max") == 0        # the launcher's: the study, before any cell
    _finish(store, configs[:30])
    assert sync_sweep(store, url, "grid", wait=False) == 30
    _finish(store, configs[30:36])
    _finish(store, configs[36:37], status="diverged")
    monkeypatch.setattr(study, "PAGE", 3)
    seen: list[tuple[str, int | None]] = []

    def note(conn, cursor, statement, parameters, context, executemany) -> None:
        seen.append((statement, _limit(context)))

    event.listen(Engine, "before_cursor_execute", note)          # every engine: flctl's and Optuna's
    try:
        assert sync_sweep(store, url, "grid", wait=False) == 7
    finally:
        event.remove(Engine, "before_cursor_execute", note)
    selects = [(text, limit) for text, limit in seen if text.lstrip().upper().startswith("SELECT")]
    limits = [limit for text, limit in selects if re.search(r"\bruns\b", text)]
    # the 7 in pages of 3 (3, 3, 1), each page's runs once more as its trials are written (a run claimed since is
    # left for later), and one look after the lock: at most 19 rows of the 40 cells' runs
    assert limits and None not in limits and sum(limits) <= 2 * 3 * 3 + 1, limits
    assert not [text for text, _ in selects if re.search(r"\btrial_(user_attributes|params|values)\b", text)]

    trials = _mirrored(url)
    assert sorted(t.user_attrs["run_id"] for t in trials) == sorted(c.run_id for c in configs[:37])  # each once
    assert [t.number for t in trials] == list(range(37))
    failed = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    assert [t.user_attrs["run_id"] for t in failed] == [configs[36].run_id] and failed[0].value is None
    best = optuna.load_study(study_name="flctl-grid", storage=url.replace("postgresql://", "postgresql+psycopg://"))
    assert best.direction == optuna.study.StudyDirection.MAXIMIZE
    top = max(configs[:36], key=lambda c: c.seed + c.lr)
    assert (best.best_trial.value, best.best_trial.params) == (top.seed + top.lr, {"lr": top.lr, "seed": top.seed})
    assert {k: sorted(v) for k, v in best.user_attrs["grid"].items()} == {"lr": [1e-3, 1e-2], "seed": list(range(20))}
    assert _marked(store) == {c.run_id for c in configs[:37]}
    assert sync_sweep(store, url, "grid", wait=False) == 0
    store.close()


def test_the_launch_makes_the_study_from_its_configs_with_its_direction(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """make_study (the launch's, before any worker) reads no config back; a worker's sync after it finds the study
    with the launch's direction and grid, however the cells are listed."""
    import optuna

    from flctl import study
    from flctl.study import make_study, sync_sweep

    url = _url("sqlite", tmp_path)
    store, configs = _grid(url, 6)
    monkeypatch.setattr(study, "_grid_of", lambda *a: pytest.fail("a config read back"))
    make_study(store, url, "grid", list(reversed(configs)), "train.avg_loss", "max")
    _finish(store, configs)
    assert sync_sweep(store, url, "grid", wait=False) == 6          # a worker's: it makes no study of its own
    best = optuna.load_study(study_name="flctl-grid", storage=f"sqlite:///{tmp_path / 'flctl.db'}")
    assert best.direction == optuna.study.StudyDirection.MAXIMIZE
    grid = best.user_attrs["grid"]
    assert grid == study._space(configs) and {k: sorted(v) for k, v in grid.items()} == {"lr": [1e-3, 1e-2],
                                                                                        "seed": [0, 1, 2]}
    top = max(configs, key=lambda c: c.seed + c.lr)
    assert best.best_trial.user_attrs["run_id"] == top.run_id
    make_study(store, url, "grid", configs, "train.avg_loss", "min")    # a study there is kept as it is
    assert optuna.load_study(study_name="flctl-grid", storage=f"sqlite:///{tmp_path / 'flctl.db'}").direction == \
        optuna.study.StudyDirection.MAXIMIZE
    store.close()


# A worker's exit sync in a process of its own: prints what it added and how long it took.
WORKER_SYNC = r"""
import sys, time
from flctl.db import Store
from flctl.study import sync_sweep
url, start_at = sys.argv[1], float(sys.argv[2])
store = Store.open(url)
while time.time() < start_at:      # every process is connected and past its imports: they sync at once
    time.sleep(0.001)
began = time.monotonic()
added = sync_sweep(store, url, "grid", wait=False)
print(added, time.monotonic() - began)
"""


def _worker_syncs(url: str, n: int, start_at: float = 0.0) -> list[tuple[int, float]]:
    import sys

    from tests import warm

    procs = [warm.Popen([sys.executable, "-c", WORKER_SYNC, url, str(start_at)], stdout=warm.PIPE, stderr=warm.PIPE)
             for _ in range(n)]
    done = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        added, took = out.split()
        done.append((int(added), float(took)))
    return done


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_worker_that_finds_a_mirror_running_returns_at_once_and_nothing_is_mirrored_twice(tmp_path: Path,
                                                                                           backend: str) -> None:
    import time

    from flctl.study import MIRROR_LOCK, sync_sweep

    url = _url(backend, tmp_path)
    store, configs = _grid(url, 24)
    sync_sweep(store, url, "grid")
    _finish(store, configs[:8])
    with store.exclusive(MIRROR_LOCK):        # a mirror running: a worker waiting for it would wait here for good
        [(added, took)] = _worker_syncs(url, 1)
    assert added == 0 and took < 5 and _mirrored(url) == [] and not _marked(store)
    _finish(store, configs[8:])
    # three workers at the same moment: the one that takes the lock mirrors every finished cell, the others leave
    done = _worker_syncs(url, 3, start_at=time.time() + 3)
    assert sorted(added for added, _ in done) == [0, 0, 24], done
    assert sorted(t.user_attrs["run_id"] for t in _mirrored(url)) == sorted(c.run_id for c in configs)
    assert _marked(store) == {c.run_id for c in configs}
    store.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cell_finished_while_a_mirror_held_the_lock_is_mirrored_by_that_mirror(
        tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from flctl import study
    from flctl.db import Store
    from flctl.study import sync_sweep

    url = _url(backend, tmp_path)
    store, configs = _grid(url, 6)
    sync_sweep(store, url, "grid")
    _finish(store, configs[:2])
    drained, go_on, added = threading.Event(), threading.Event(), []
    real_drain = study._drain

    def drain_then_hold(*args) -> int:        # the holder, between its last read and letting the lock go
        found = real_drain(*args)
        if not drained.is_set():
            drained.set()
            assert go_on.wait(120)
        return found

    monkeypatch.setattr(study, "_drain", drain_then_hold)
    holder = threading.Thread(target=lambda: added.append(sync_sweep(Store.open(url), url, "grid", wait=False)))
    holder.start()
    assert drained.wait(120)
    _finish(store, configs[2:3])                       # a worker finishes a cell, and its exit sync finds the lock held
    assert sync_sweep(store, url, "grid", wait=False) == 0
    go_on.set()
    holder.join(120)
    assert added == [3]                                # the holder looked again after letting go, and took it
    assert sorted(t.user_attrs["run_id"] for t in _mirrored(url)) == sorted(c.run_id for c in configs[:3])
    store.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_study_mirrored_before_the_upgrade_gets_no_trial_twice(tmp_path: Path, backend: str) -> None:
    import sqlalchemy as sa

    from flctl.db import Store
    from flctl.study import sync_sweep

    url = _url(backend, tmp_path)
    store, configs = _grid(url, 8)
    _finish(store, configs[:5])
    assert sync_sweep(store, url, "grid") == 5
    grid = _study_attrs(url)["grid"]
    store.close()
    # The database as a flctl before revision 0009 left it: the trials there, no mark on their cells, no grid kept.
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as conn:
        conn.execute(sa.text("DROP INDEX ix_sweep_cells_mirror"))
        conn.execute(sa.text("ALTER TABLE sweep_cells DROP COLUMN mirrored"))
        conn.execute(sa.text("DELETE FROM study_user_attributes WHERE key = 'grid'"))
        conn.execute(sa.text("UPDATE flctl_alembic_version SET version_num = '0008'"))
    engine.dispose()

    store = Store.open(url)                            # upgraded: the cells with a trial marked (revision 0009)
    assert _marked(store) == {c.run_id for c in configs[:5]}
    _finish(store, configs[5:7])
    assert sync_sweep(store, url, "grid", wait=False) == 2
    assert sorted(t.user_attrs["run_id"] for t in _mirrored(url)) == sorted(c.run_id for c in configs[:7])
    assert _study_attrs(url)["grid"] == grid           # kept again, read from every cell once
    store.close()


def _study_attrs(url: str) -> dict:
    import optuna

    from flctl.db import existing_storage

    storage = existing_storage(url)
    try:
        return optuna.load_study(study_name="flctl-grid", storage=storage).user_attrs
    finally:
        storage.engine.dispose()


def _rerun(store, configs: list, loss: float) -> None:
    """The (diverged) cells of ``configs`` trained again, as a rerun or a later sweep trains them: completed."""
    from flctl.db import RunQueue
    from flctl.status import Status

    queue = RunQueue(store)
    for c in configs:
        token = queue.claim_run(c.run_id, allow=(Status.DIVERGED, Status.COMPLETED))
        assert token
        queue.finish_run(c.run_id, token, status="completed", epochs_done=1, metrics={"train.avg_loss": loss},
                         diverged_at=None, lambda_capped=0, artifacts={}, duration_s=1.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cell_completed_after_it_diverged_replaces_its_trial(tmp_path: Path, backend: str) -> None:
    """A FAIL trial (the cell diverged) becomes the cell's COMPLETE one when it is trained again: one trial a cell,
    its number kept, and best_trial the cell's new value (Optuna's best_trial raised or named another cell)."""
    import optuna

    from flctl.study import sync_sweep

    url = _url(backend, tmp_path)
    store, configs = _grid(url, 6)
    sync_sweep(store, url, "grid")
    _finish(store, configs[:4])
    _finish(store, configs[4:], status="diverged")
    assert sync_sweep(store, url, "grid", wait=False) == 6
    numbers = {t.user_attrs["run_id"]: t.number for t in _mirrored(url)}
    _rerun(store, configs[4:5], -1.0)
    assert sync_sweep(store, url, "grid", wait=False) == 1
    trials = _mirrored(url)
    assert {t.user_attrs["run_id"]: t.number for t in trials} == numbers and len(trials) == 6
    [again] = [t for t in trials if t.user_attrs["run_id"] == configs[4].run_id]
    assert (again.state, again.value, again.user_attrs["status"]) == (optuna.trial.TrialState.COMPLETE, -1.0,
                                                                      "completed")
    assert again.datetime_complete > again.datetime_start
    storage = url.replace("postgresql://", "postgresql+psycopg://")
    assert optuna.load_study(study_name="flctl-grid", storage=storage).best_trial.user_attrs["run_id"] == \
        configs[4].run_id
    _rerun(store, configs[4:5], 7.0)                   # a completed cell trained again: its value replaced again
    assert sync_sweep(store, url, "grid", wait=False) == 1
    assert [t.value for t in _mirrored(url) if t.user_attrs["run_id"] == configs[4].run_id] == [7.0]
    assert sync_sweep(store, url, "grid", wait=False) == 0
    store.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cell_claimed_again_while_a_mirror_read_it_is_mirrored_when_it_finishes(
        tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mirror read a diverged cell, and before it wrote the trial the cell was claimed again: the cell is left
    unmarked without a trial, and mirrored (completed) by the sync after it finished."""
    from flctl import study
    from flctl.db import RunQueue
    from flctl.status import Status
    from flctl.study import sync_sweep

    url = _url(backend, tmp_path)
    store, configs = _grid(url, 4)
    sync_sweep(store, url, "grid")
    _finish(store, configs[:3])
    _finish(store, configs[3:], status="diverged")
    real, token = study.add_trials, []

    def claimed_meanwhile(*args, **kwargs) -> None:
        if not token:
            token.append(RunQueue(store).claim_run(configs[3].run_id, allow=(Status.DIVERGED,)))
        real(*args, **kwargs)

    monkeypatch.setattr(study, "add_trials", claimed_meanwhile)
    assert sync_sweep(store, url, "grid", wait=False) == 3
    assert configs[3].run_id not in {t.user_attrs["run_id"] for t in _mirrored(url)} | _marked(store)
    RunQueue(store).finish_run(configs[3].run_id, token[0], status="completed", epochs_done=1,
                               metrics={"train.avg_loss": 0.5}, diverged_at=None, lambda_capped=0, artifacts={},
                               duration_s=1.0)
    assert sync_sweep(store, url, "grid", wait=False) == 1
    assert sorted((t.user_attrs["run_id"], t.value) for t in _mirrored(url)) == \
        sorted([(c.run_id, c.seed + c.lr) for c in configs[:3]] + [(configs[3].run_id, 0.5)])
    assert _marked(store) == {c.run_id for c in configs}
    store.close()


def test_a_study_that_cannot_be_read_is_skipped_with_a_warning_and_the_others_mirrored(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A study whose stored attribute is not JSON (damaged by hand): its sweep is left out of the sync in one warning
    line, its cells left for a sync after it is mended; the sweeps after it in the mirror's order are mirrored."""
    import sqlalchemy as sa

    from flctl.study import sync_sweep
    from tests.helpers import config

    url = _url("sqlite", tmp_path)
    store, configs = _grid(url, 4)
    sync_sweep(store, url, "grid")
    other = [config("two-moons", "erm", seed=seed) for seed in range(7, 9)]
    store.create_sweep("zzother", "zzother", "two-moons", {}, other)
    with store.session() as s:
        s.execute(sa.text("UPDATE study_user_attributes SET value_json = '{not json' WHERE key = 'grid'"))
        s.commit()
    _finish(store, configs + other)
    assert sync_sweep(store, url, "zzother") == 2
    warned = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(warned) == 1 and warned[0].startswith("flctl: warning: the Optuna study flctl-grid is damaged"), warned
    assert _marked(store) == {c.run_id for c in other}
    store.close()
