"""Cells a sweep worker trains together (--batch-runs) fail cell by cell: a sibling's own error fails that sibling only,
and the others train on; and a disk that fills under a grouped `sweep --wait` is told at once, in one line, though
the worker could write nothing more (its database on that disk too). Real `flctl sweep` processes over a task file
this test writes (docs/extending.md), as a user runs them."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from flctl import plugins
from flctl.db import Store
from tests import warm
from tests.helpers import bound

pytestmark = pytest.mark.slow

FLCTL = [sys.executable, "-m", "flctl"]

# Three blobs (each run takes about a second), whose model fails for seed 2 as FAULT says: its build raises, or its
# forward does (a fault of its own that shows only once cells step together); FAULT=disk: the disk fills up as the
# first model is built, for every file of the process (RLIMIT_FSIZE: no file grows past 1 KiB, the database's
# included, where SQLite writes whole pages), as a disk that filled up under it.
TASK = textwrap.dedent('''
    import os
    import resource

    import torch

    from flctl.tasks import Task

    def load(options, data_dir):
        from sklearn.datasets import make_blobs
        from flctl.data import Dataset, Split
        x, y = make_blobs(n_samples=120, centers=3, random_state=0)
        x, y = torch.tensor(x, dtype=torch.float32), torch.tensor(y)
        return Dataset(Split(x[:90], y[:90]), Split(x[90:], y[90:]))

    class Faulty(torch.nn.Sequential):
        def forward(self, x):
            raise RuntimeError("seed 2's forward fails")

    def build_model(options, data):
        from flctl.models import mlp
        fault, seed = os.environ.get("FAULT"), torch.initial_seed()     # Cell.build seeds torch with the run's seed
        if fault == "build" and seed == 2:
            raise ValueError("seed 2's model cannot be built")
        if fault == "disk":
            resource.setrlimit(resource.RLIMIT_FSIZE, (1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        model = mlp([2, 8, 3])
        return Faulty(*model) if fault == "forward" and seed == 2 else model

    def data_source(options, data_dir):      # recorded with each run as its training begins (its provenance)
        if os.environ.get("FAULT") == "source":
            raise OSError("the blobs' catalogue cannot be read")
        return "made by make_blobs"

    TASK = Task(name="faulty-blobs", kind="classification", description="three blobs, seed 2 faulty",
                defaults=dict(epochs=2, batch_size=30, optimizer="adamw", lr=1e-2, eps=0.1, alpha=1.0, dual_lr=0.5),
                options={}, load=load, build_model=build_model, data_source=data_source)
''')


def sweep_args(results: Path) -> list[str]:
    return ["sweep", "faulty-blobs", "-m", "fl", "--seeds", "4", "--batch-runs", "4", "--workers", "1", "--threads",
            "1", "--executor", "local", "--checkpoint-every", "0", "--wait", "--results-dir", str(results)]


def env_for(task_file: Path, fault: str | None) -> dict[str, str]:
    env = {**os.environ, "COLUMNS": "250", plugins.ENV: str(task_file)}
    env.pop("FAULT", None)
    return env if fault is None else {**env, "FAULT": fault}


def by_seed(results: Path) -> dict[int, object]:
    store = Store.open(f"sqlite:///{results / 'flctl.db'}", readonly=True)
    try:
        return {r.seed: r for r in store.list_runs()}
    finally:
        store.close()


@pytest.fixture
def task_file(tmp_path: Path) -> Path:
    path = tmp_path / "faulty_blobs.py"
    path.write_text(TASK)
    return path


@pytest.mark.parametrize("fault,together", [("build", 3), ("forward", 1)])
def test_a_cells_own_error_fails_that_cell_and_its_siblings_complete(tmp_path: Path, task_file: Path, fault: str,
                                                                    together: int) -> None:
    """Four seeds claimed as one group, seed 2's model faulty. Its build raises (the error is seed 2's own): seed 2
    fails, and the other three go back to the queue and train together at the next claim. Its forward raises (the
    group's step fails, no one cell to blame): each cell goes back to train alone, so that seed 2 fails with its own
    error and the others complete. A rerun tries seed 2 again and leaves the others completed. Before, all four
    failed with seed 2's error, and again at every rerun."""
    results = tmp_path / "results"
    env = env_for(task_file, fault)
    first = warm.run([*FLCTL, *sweep_args(results)], capture_output=True, text=True, timeout=300, env=env)
    assert first.returncode == 3, first.stdout + first.stderr          # CELLS_FAILED_EXIT: a cell failed for good
    assert "Traceback" not in first.stdout + first.stderr
    runs = by_seed(results)
    assert {s: r.status for s, r in runs.items()} == {0: "completed", 1: "completed", 2: "failed", 3: "completed"}
    own = "ValueError: seed 2's model cannot be built" if fault == "build" else "RuntimeError: seed 2's forward fails"
    assert own in runs[2].error, runs[2].error
    # seed 2 alone was charged an attempt; the others' first claim was handed back, not counted
    assert {s: r.attempts for s, r in runs.items()} == {0: 1, 1: 1, 2: 1, 3: 1}
    for seed in (0, 1, 3):       # one claim more each: together without seed 2, or alone
        assert runs[seed].trained_with["cells_together"] == together, runs[seed].trained_with
    finished = {s: r.finished_at for s, r in runs.items()}

    again = warm.run([*FLCTL, *sweep_args(results)], capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 3, again.stdout + again.stderr
    runs = by_seed(results)
    assert {s: r.status for s, r in runs.items()} == {0: "completed", 1: "completed", 2: "failed", 3: "completed"}
    assert own in runs[2].error and runs[2].attempts == 2
    assert all(runs[s].finished_at == finished[s] for s in (0, 1, 3))          # not trained again, not failed


def test_cells_whose_training_fails_before_it_begins_fail_at_once_not_after_the_stale_bound(
        tmp_path: Path, task_file: Path) -> None:
    """A group whose training fails before its first step (here the task's data_source raises as the runs' provenance
    is recorded; an import would alike): its cells fail with that error at once and the wait ends. Before, they stayed
    running under the worker's claims, with no heartbeat, until the 300 s stale bound, while the wait waited."""
    results = tmp_path / "results"
    started = time.monotonic()
    out = warm.run([*FLCTL, *sweep_args(results)], capture_output=True, text=True, timeout=300,
                   env=env_for(task_file, "source"))
    took = time.monotonic() - started
    assert out.returncode == 3 and "Traceback" not in out.stdout + out.stderr, out.stdout + out.stderr
    runs = by_seed(results)
    assert {s: r.status for s, r in runs.items()} == dict.fromkeys(range(4), "failed")
    assert all("OSError: the blobs' catalogue cannot be read" in r.error for r in runs.values())
    assert took < bound(60), took


def test_a_disk_that_fills_under_a_grouped_wait_is_told_at_once_in_one_line(tmp_path: Path,
                                                                             task_file: Path) -> None:
    """The disk fills up as the group trains, under the database as well: the worker cannot hand its cells back, so
    they stay marked running under the waiting command's own pid. The wait learns it from the worker's disk note (a
    file given its room when the worker started), not from the database: one `error:` line naming the file that could
    not be written, exit 1, within seconds (before, it waited out the 300 s stale bound and then said that no worker
    was left). With room again, `flctl sweep` resumes the four cells and completes them."""
    import signal

    results = tmp_path / "results"

    def no_kill() -> None:      # a write past the limit fails with EFBIG instead of killing the process
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    started = time.monotonic()
    full = subprocess.run([*FLCTL, *sweep_args(results)], capture_output=True, text=True, timeout=300,
                          preexec_fn=no_kill, env=env_for(task_file, "disk"))
    took = time.monotonic() - started
    assert full.returncode == 1, full.stdout + full.stderr
    assert "Traceback" not in full.stdout + full.stderr
    errors = [line for line in full.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, full.stderr
    assert errors[0].startswith("error: the disk filled up under sweep ") and "cannot write " in errors[0] \
        and "File too large" in errors[0] and "4 cell(s) to do" in errors[0], errors[0]
    assert took < bound(60), took                                 # not the stale bound (300 s)
    runs = by_seed(results)
    assert {r.status for r in runs.values()} == {"running"}       # its database could not be written

    again = warm.run([*FLCTL, *sweep_args(results)], capture_output=True, text=True, timeout=300,
                     env=env_for(task_file, None))
    assert again.returncode == 0, again.stdout + again.stderr
    assert {r.status for r in by_seed(results).values()} == {"completed"}
    assert not list((results / "jobs").rglob("*.disk"))         # the note was read and is gone with its worker


@pytest.mark.parametrize("raised, status", [(KeyboardInterrupt, "interrupted"), (RuntimeError, "failed"),
                                            (OSError, "failed")])
def test_a_group_stopped_before_it_trains_goes_back_on_a_signal_and_fails_on_an_error(tmp_path: Path, monkeypatch,
                                                                                    raised, status) -> None:
    """As a claimed group starts (provenance recorded, heartbeat, logs opened): a second Ctrl-C hands its runs back
    to the queue, resumable; an error fails each with it. None is left running without a heartbeat."""
    import flctl.claimed
    from flctl.claimed import ClaimedRuns
    from flctl.db import RunQueue
    from flctl.layout import Layout
    from flctl.loggers import Logging
    from tests.helpers import config

    store = Store.open(f"sqlite:///{tmp_path / 'flctl.db'}")
    cfgs = [config("two-moons", "fl", seed=s) for s in range(2)]
    store.add_runs(cfgs)
    tokens = {c.run_id: RunQueue(store).claim_run(c.run_id) for c in cfgs}

    def provenance(cfg):
        raise raised("stopped as the group started")

    monkeypatch.setattr(flctl.claimed, "provenance", provenance)
    claimed = ClaimedRuns(cfgs, tokens, store, Layout(tmp_path), Logging((), tmp_path))
    with pytest.raises(raised) if status == "interrupted" else contextlib.nullcontext():   # a signal goes on up
        with claimed:
            claimed.start()
            pytest.fail("the group trained")
    # an error is the ending, classified once (flctl.outcomes): the same for each cell, before training began
    assert claimed.ending is not None and isinstance(claimed.ending.error, raised)
    assert claimed.ending.outcome.name == ("signal" if status == "interrupted" else "before training")
    assert [store.get_run(c.run_id).status for c in cfgs] == [status] * 2
    assert not claimed.beat.is_alive()
    if status == "interrupted":         # claimable again, the attempt not counted
        assert RunQueue(store).claim_run(cfgs[0].run_id, max_attempts=1)
