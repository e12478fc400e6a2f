"""The Optuna mirror read as its readers read it: optuna.load_study, its trials and best_trial, after every kind of
sweep (a grid with one worker and with two, --tune, a worker killed and the sweep launched again, a cell trained
again), held against flctl's own runs: one trial a cell, each trial's state and value its run's, and best_trial
flctl's best run in the direction asked for. And a direction or objective the study was not made with is refused in
one line before anything is written (flctl.study_rdb.check_study)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from flctl import api
from flctl.errors import ConfigError
from flctl.status import Status
from tests import warm
from tests.helpers import in_process, wait_until


def _study(results: Path, sid: str):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name=f"flctl-{sid}", storage=f"sqlite:///{results / 'flctl.db'}")


def agrees(results: Path, sid: str, objective: str, direction: str):
    """The sweep's study (the only sweep in ``results``), held against flctl's runs; returns it."""
    from optuna.study import StudyDirection
    from optuna.trial import TrialState

    study = _study(results, sid)
    assert study.direction == (StudyDirection.MAXIMIZE if direction == "max" else StudyDirection.MINIMIZE)
    assert study.user_attrs["objective"] == objective
    runs = {r.id: r for r in api.runs(results_dir=results)}
    ids = [t.user_attrs["run_id"] for t in study.trials]
    assert len(ids) == len(set(ids)), ids                                   # one trial a cell
    assert set(ids) == {i for i, r in runs.items() if r.status in (Status.COMPLETED, Status.DIVERGED)}
    for trial in study.trials:
        run = runs[trial.user_attrs["run_id"]]
        value = run.metrics.get(objective) if run.status == Status.COMPLETED else None
        assert (trial.state, trial.value, trial.user_attrs.get("status", run.status)) == \
            ((TrialState.COMPLETE, value) if value is not None else (TrialState.FAIL, None)) + (run.status,)
    values = [r.metrics[objective] for r in runs.values() if r.status == Status.COMPLETED and objective in r.metrics]
    best = max(values) if direction == "max" else min(values)
    assert study.best_trial.value == best
    assert runs[study.best_trial.user_attrs["run_id"]].metrics[objective] == best
    return study


GRID = dict(method="erm", lr=[1e-3, 3e-1], epochs=1)


@pytest.mark.parametrize("objective,direction", [("train.avg_loss", "min"), ("test.accuracy", "max")])
def test_a_grid_with_one_worker(tmp_path: Path, objective: str, direction: str) -> None:
    results = tmp_path / "results"
    done = api.sweep("two-moons", **GRID, results_dir=results, objective=objective, direction=direction,
                     launch={"executor": "debug"})
    assert done["total"][Status.COMPLETED] == 2
    agrees(results, done["sweep"], objective, direction)


def test_a_grid_with_two_workers(tmp_path: Path) -> None:
    results = tmp_path / "results"
    done = api.sweep("two-moons", method="erm", lr=[1e-3, 3e-1], seeds=2, epochs=1, results_dir=results,
                     objective="test.accuracy", direction="max", launch={"workers": 2, "batch_runs": 1})
    assert done["total"][Status.COMPLETED] == 4
    assert len(agrees(results, done["sweep"], "test.accuracy", "max").trials) == 4


def test_a_tune_search_and_its_direction_fixed(tmp_path: Path) -> None:
    results = tmp_path / "results"
    done = api.sweep("two-moons", method="erm", lr="1e-3..3e-1", epochs=1, tune=3, results_dir=results,
                     objective="test.accuracy", direction="max", launch={"executor": "debug"})
    assert len(agrees(results, done["sweep"], "test.accuracy", "max").trials) == 3
    runs = len(api.runs(results_dir=results))
    with pytest.raises(ConfigError, match=r"records the max of test\.accuracy.* --direction max"):
        api.sweep("two-moons", method="erm", lr="1e-3..3e-1", epochs=1, tune=3, results_dir=results,
                  objective="test.accuracy", direction="min", launch={"executor": "debug"})
    assert len(api.runs(results_dir=results)) == runs and len(_study(results, done["sweep"]).trials) == 3


def _sweep_row(results: Path, sid: str) -> dict:
    from flctl.db import Store

    store = Store.open(f"sqlite:///{results / 'flctl.db'}")
    try:
        return dict(store.get_sweep(sid))
    finally:
        store.close()


@pytest.mark.parametrize("other", [["--direction", "max"], ["--objective", "test.accuracy"]], ids=["direction",
                                                                                                    "objective"])
def test_a_grid_launched_again_with_another_direction_or_objective_is_one_line(tmp_path: Path,
                                                                              other: list[str]) -> None:
    """A study there already keeps its direction (Optuna fixes it) and its values are one objective's: a launch that
    asks for another is refused, exit 2, nothing written, rather than told a best_trial it did not ask for."""
    results = tmp_path / "results"
    args = ["sweep", "two-moons", "-m", "erm", "--lr", "1e-3,3e-1", "--epochs", "1", "--executor", "debug",
            "--results-dir", str(results)]
    assert (first := in_process(*args)).returncode == 0, first.stderr
    sid = agrees(results, _sid(results), "train.avg_loss", "min").study_name.removeprefix("flctl-")
    before, runs = _sweep_row(results, sid), [(r.id, r.status, r.finished_at) for r in api.runs(results_dir=results)]
    res = in_process(*args, *other)
    lines = [line for line in res.stderr.strip().splitlines() if line.strip()]
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "records the min of train.avg_loss" in lines[0] and "--direction min" in lines[0], lines[0]
    assert _sweep_row(results, sid) == before
    assert [(r.id, r.status, r.finished_at) for r in api.runs(results_dir=results)] == runs
    agrees(results, sid, "train.avg_loss", "min")


def _sid(results: Path) -> str:
    from flctl.db import Store

    store = Store.open(f"sqlite:///{results / 'flctl.db'}")
    try:
        [row] = store.list_sweeps()
        return row["id"]
    finally:
        store.close()


def _statuses(results: Path) -> set[str]:
    """The states of the runs in ``results`` (none while the sweep is still making its database)."""
    from sqlalchemy.exc import OperationalError

    from flctl.errors import StoreError

    try:
        return {r.status for r in api.runs(results_dir=results)}
    except (StoreError, ConfigError, OperationalError):
        return set()


def test_a_worker_killed_midway_and_the_sweep_launched_again(tmp_path: Path) -> None:
    results = tmp_path / "results"
    args = ["sweep", "two-moons", "-m", "erm", "--lr", "1e-3,1e-2,1e-1", "--epochs", "30", "--workers", "1",
            "--objective", "test.accuracy", "--direction", "max", "--results-dir", str(results)]
    proc = warm.Popen([sys.executable, "-m", "flctl", *args, "--wait"], stdout=warm.PIPE, stderr=warm.PIPE,
                      env={k: v for k, v in os.environ.items() if k not in ("FLCTL_DB", "PYTHONPATH")})
    try:
        wait_until(lambda: Status.RUNNING in _statuses(results), "a cell training", 120, 0.05)
        proc.send_signal(signal.SIGKILL)        # its own worker, mid-cell: the cell left running, nothing synced
    finally:
        proc.wait(30)
    assert Status.RUNNING in _statuses(results)
    again = in_process(*args, "--executor", "debug", "--wait")
    assert again.returncode == 0, again.stderr
    assert {r.status for r in api.runs(results_dir=results)} == {Status.COMPLETED}
    assert len(agrees(results, _sid(results), "test.accuracy", "max").trials) == 3


def test_a_cell_trained_again(tmp_path: Path) -> None:
    """The best cell trained again and diverged (as on a flaky node), then rerun to completion (`flctl run
    --rerun`): after each, the next sweep's sync has its one trial say what flctl says of its run."""
    from flctl.db import RunQueue, Store

    results = tmp_path / "results"
    args = ["two-moons", "-m", "erm", "--epochs", "1", "--results-dir", str(results)]
    assert (first := in_process("sweep", *args, "--lr", "1e-3,3e-1", "--executor", "debug")).returncode == 0, \
        first.stderr
    sid = _sid(results)
    best = agrees(results, sid, "train.avg_loss", "min").best_trial
    store = Store.open(f"sqlite:///{results / 'flctl.db'}")
    queue = RunQueue(store)
    token = queue.claim_run(best.user_attrs["run_id"], allow=(Status.COMPLETED,))
    assert token
    queue.finish_run(best.user_attrs["run_id"], token, status=Status.DIVERGED, epochs_done=1,
                     metrics={"train.avg_loss": float("nan")}, diverged_at={"epoch": 1, "step": 1}, lambda_capped=0,
                     artifacts={}, duration_s=0.5)
    store.close()
    assert (synced := in_process("sweep", *args, "--lr", "1e-3,3e-1", "--executor", "debug")).returncode == 0, \
        synced.stderr
    assert agrees(results, sid, "train.avg_loss", "min").best_trial.user_attrs["run_id"] != best.user_attrs["run_id"]
    rerun = in_process("run", *args, "--lr", str(best.params["lr"]), "--rerun")
    assert rerun.returncode == 0 and best.user_attrs["run_id"] in rerun.stdout, rerun.stdout + rerun.stderr
    assert in_process("sweep", *args, "--lr", "1e-3,3e-1", "--executor", "debug").returncode == 0
    study = agrees(results, sid, "train.avg_loss", "min")
    assert study.best_trial.user_attrs["run_id"] == best.user_attrs["run_id"] and len(study.trials) == 2
