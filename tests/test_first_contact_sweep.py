"""First contact with `flctl sweep` (issue 22): the README's --tune line finishes, an α sweep plans the methods that
read α, and the environment (an empty FLCTL_RESULTS, an ASCII-only stdout) does not get in the way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from flctl.cli import app
from flctl.db import Store
from flctl.sweep import resolve_cell, spec_from_values
from flctl.tpe_search import tune
from tests import warm
from tests.helpers import bound

# Slow (pyproject.toml's markers; `pytest -m "not slow"` is the fast loop): the README's --tune line and sweeps
# through local workers: 14 s of the suite's 904 s of test time (2 cores, xdist -n 2).
pytestmark = pytest.mark.slow

FLCTL = [sys.executable, "-m", "flctl"]
runner = CliRunner()


def flctl(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """`flctl *args` as a process forked warm (tests/warm.py: PYTHONIOENCODING and the environment as a new
    interpreter takes them); the sweep workers it starts are new interpreters."""
    return warm.run([*FLCTL, *args], capture_output=True, timeout=240, cwd=cwd, errors="replace",
                    env={**os.environ, "COLUMNS": "200", **env})


def studies(url: str) -> dict[str, optuna.Study]:
    return {s.study_name: optuna.load_study(study_name=s.study_name, storage=url)
            for s in optuna.get_all_study_summaries(url)}


@pytest.mark.timeout(120)
def test_the_readmes_tune_line_finishes_every_trial_through_local_workers(tmp_path: Path) -> None:
    # The README's line with 3 epochs: it used to hang after a few trials (a queued trial no worker would take).
    results = tmp_path / "results"
    started = time.monotonic()
    out = flctl(tmp_path, "sweep", "diabetes", "-m", "rfl", "--alpha", "1e-3..10", "--tune", "20", "--objective",
                "test.max_loss", "--epochs", "3", "--results-dir", str(results))
    assert out.returncode == 0, out.stdout + out.stderr
    assert time.monotonic() - started < bound(90), "one worker should serve trial after trial"
    assert "best test.max_loss" in out.stdout
    url = f"sqlite:///{results / 'flctl.db'}"
    found = studies(url)
    # The TPE study is the sweep's one study: no grid mirror whose fixed categorical space breaks as trials grow.
    (name,) = found
    assert name.startswith("flctl-t")
    trials = found[name].get_trials()
    assert len(trials) == 20 and all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    # One line per trial, not the launch's cell counts every time a trial is added.
    assert out.stdout.count("trial ") == 20 and "trial 20/20: alpha=" in out.stdout
    assert "already on it" not in out.stdout
    # The worker job a trial's launch started is named (a trial a live worker takes starts none).
    assert 1 <= out.stdout.count("worker job(s) through local: ") < 20
    runs = {r["id"]: r for r in json.loads(flctl(tmp_path, "runs", "--json", "--limit", "100",
                                                 "--results-dir", str(results)).stdout)}
    assert {t.user_attrs["run_id"] for t in trials} <= set(runs)
    for t in trials:
        assert t.value == runs[t.user_attrs["run_id"]]["metrics"]["test.max_loss"]
    logs = "".join(p.read_text() for p in (results / "jobs").rglob("*_log.err"))
    assert "could not sync the Optuna study" not in logs
    # More trials of the same search: the same sweep and study, two trials more.
    more = flctl(tmp_path, "sweep", "diabetes", "-m", "rfl", "--alpha", "1e-3..10", "--tune", "22", "--objective",
                 "test.max_loss", "--epochs", "3", "--results-dir", str(results))
    assert more.returncode == 0, more.stdout + more.stderr
    assert "trial 22/22" in more.stdout and "trial 20/" not in more.stdout
    assert list(studies(url)) == [name] and len(studies(url)[name].get_trials()) == 22


def _fake_workers(results: Path, spec):
    """launch/fetch/revive for tune(): launched runs stay queued (their worker exited before they were added)
    until revive is asked to start one, which 'trains' them at once."""
    rows: dict[str, dict] = {}
    polls = []

    def launch(configs) -> None:
        for c in configs:
            rows.setdefault(c.run_id, {"status": "queued"})

    def revive(configs) -> None:
        for c in configs:
            rows[c.run_id] = {"status": "completed", "metrics": {"test.max_loss": c.alpha}}

    def fetch(ids):
        polls.append(1)
        assert len(polls) < 1000, "tune waited on a queued run that no worker holds"
        return {i: rows[i] for i in ids}

    return rows, launch, revive, fetch


def _tune_setup(tmp_path: Path):
    """A fresh results folder and database, an α search spec on diabetes, and the fake workers around it."""
    results = tmp_path / "results"
    results.mkdir()
    url = f"sqlite:///{results / 'flctl.db'}"
    spec = spec_from_values("diabetes", {"method": "rfl", "alpha": "1e-3..10", "epochs": "1"})
    return results, url, Store.open(url), spec, _fake_workers(results, spec)


def test_tune_starts_a_worker_for_a_trial_no_worker_holds(tmp_path: Path) -> None:
    results, url, store, spec, (rows, launch, revive, fetch) = _tune_setup(tmp_path)
    study = tune(spec, "tx", 4, "test.max_loss", "min", store=store, url=url, resolve_cell=lambda p: resolve_cell(spec, p),
                 launch=launch, fetch=fetch, revive=revive, parallel=2, poll_s=0.01)
    trials = study.get_trials()
    assert len(trials) == 4 and all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    assert all(t.value == t.params["alpha"] for t in trials)


def test_tune_finishes_the_trials_an_interrupted_tune_left_running(tmp_path: Path) -> None:
    results, url, store, spec, (rows, launch, revive, fetch) = _tune_setup(tmp_path)
    # A first --tune asked a trial, launched its run, and was stopped (Ctrl-C) before telling it.
    from flctl.study import search_space

    first = optuna.create_study(storage=url, study_name="flctl-tx")
    asked = first.ask(search_space(spec))
    asked.set_user_attr("run_id", resolve_cell(spec, asked.params).run_id)
    lost = first.ask(search_space(spec))          # asked, but stopped before its run was named
    study = tune(spec, "tx", 3, "test.max_loss", "min", store=store, url=url, resolve_cell=lambda p: resolve_cell(spec, p),
                 launch=launch, fetch=fetch, revive=revive, poll_s=0.01)
    states = {t.number: t.state for t in study.get_trials()}
    assert states[asked.number] == optuna.trial.TrialState.COMPLETE           # its run was waited on and told
    assert states[lost.number] == optuna.trial.TrialState.FAIL
    assert optuna.trial.TrialState.RUNNING not in states.values()
    assert study.trials[asked.number].value == asked.params["alpha"]
    assert sum(s == optuna.trial.TrialState.COMPLETE for s in states.values()) == 2   # 3 finished in all


@pytest.mark.parametrize("args,runs,methods", [
    (["utkface", "--alpha", "1e-4..1"], 5, "rfl"),       # the tool's own usage line
    (["two-moons", "--alpha", "1e-2..1"], 3, "rfl"),
    (["two-moons", "--alpha", "1e-2..1", "-m", "cserm"], 3, None),     # CSERM when asked
    (["two-moons", "--alpha", "1e-2..1", "-m", "fl,rfl"], 4, None),    # fl once, rfl per α
])
def test_an_alpha_sweep_plans_the_methods_that_read_alpha(results: Path, args: list[str], runs: int,
                                                          methods: str | None) -> None:
    res = runner.invoke(app, ["sweep", *args, "--dry-run"], env={"COLUMNS": "300"})
    assert res.exit_code == 0, res.output
    assert f"{runs} runs; nothing was written" in res.output
    if methods is None:
        assert "no --method given" not in res.output
    else:
        assert f"no --method given: --alpha is read by {methods}, not by fl, so the sweep trains {methods}" \
            in " ".join(res.output.split())
    assert not results.exists()


def test_a_spec_with_alpha_and_no_method_trains_rfl(tmp_path: Path) -> None:
    from flctl.sweep import load_spec, plan

    spec = tmp_path / "alpha.toml"
    spec.write_text('task = "two-moons"\nalpha = "1e-2..1"\nepochs = 1\n')
    configs = plan(load_spec(spec))
    assert sorted((c.method, c.alpha) for c in configs) == [("rfl", 0.01), ("rfl", 0.1), ("rfl", 1.0)]


def test_an_empty_flctl_results_is_unset(tmp_path: Path) -> None:
    out = flctl(tmp_path, "run", "polyfit", "-m", "erm", FLCTL_RESULTS="")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "results" / "flctl.db").exists() and not (tmp_path / "flctl.db").exists()
    assert not (tmp_path / "records").exists()


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_output_to_a_narrow_encoding_does_not_crash(tmp_path: Path, encoding: str) -> None:
    first = flctl(tmp_path, "run", "two-moons", "-m", "rfl", "--epochs", "1", PYTHONIOENCODING=encoding)
    assert first.returncode == 0, first.stderr
    for args in (["runs"], ["methods"], ["sweep", "two-moons", "--alpha", "1e-2..1", "--dry-run"]):
        out = flctl(tmp_path, *args, PYTHONIOENCODING=encoding)
        assert out.returncode == 0 and "Traceback" not in out.stderr, (args, out.stderr)
    assert "?" in flctl(tmp_path, "runs", PYTHONIOENCODING="ascii").stdout       # ε, α as '?', columns kept
