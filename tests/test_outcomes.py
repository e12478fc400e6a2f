"""The outcome table (flctl.outcomes.OUTCOMES) is the only place a training's end is classified: each kind of end
meets its row, and a row added to the table reaches the record, a sweep's worker and `flctl run`'s line without a
change anywhere else."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from flctl import outcomes
from flctl.errors import ClaimLost, DiskFull, GroundMoved
from flctl.outcomes import SIGNAL, Cells, End, Next, Outcome, classify
from flctl.status import Status


class _OperationalError(Exception):
    """Named and placed as SQLAlchemy's: the table reads a database error by its class's name and module."""


_OperationalError.__module__ = "sqlalchemy.exc"
_OperationalError.__name__ = "OperationalError"


@pytest.mark.parametrize("end,row,cells,after,code", [
    (End(GroundMoved("the results folder /r was deleted")), "ground moved", Cells.NOTHING, Next.GROUND_GONE, 1),
    (End(KeyboardInterrupt()), "signal", Cells.HAND_BACK, Next.STOP, SIGNAL),
    (End(SystemExit(143)), "signal", Cells.HAND_BACK, Next.STOP, SIGNAL),
    (End(DiskFull(28, "No space left on device", "/r/x")), "disk full", Cells.HAND_BACK_ONCE, Next.DISK_FULL, 1),
    (End(ClaimLost("taken")), "claim lost", Cells.HAND_BACK, Next.GO_ON, 1),
    (End(None, statuses=frozenset({Status.COMPLETED, Status.LOST})), "claim lost", Cells.HAND_BACK, Next.GO_ON, 1),
    (End(_OperationalError("server closed the connection")), "database", Cells.FAIL_ALL, Next.STOP, 1),
    (End(OSError("catalogue unreadable"), began=False), "before training", Cells.FAIL_ALL, Next.GO_ON, 1),
    (End(ValueError("seed 2's model")), "own error", Cells.FAIL_AT_FAULT, Next.GO_ON, 1),
    # where CUDA never ran in this process, the error's text is all there is to go by (flctl.devices.device_works)
    (End(RuntimeError("CUDA error: device-side assert triggered")), "device lost", Cells.DEVICE, Next.DEVICE_LOST, 1),
    (End(None, statuses=frozenset({Status.COMPLETED, Status.STOPPED})), "asked to stop", Cells.NOTHING, Next.STOP, SIGNAL),
    (End(None, statuses=frozenset({Status.COMPLETED, Status.DIVERGED})), "finished", Cells.NOTHING, Next.GO_ON, 0),
])
def test_each_end_meets_its_row(end: End, row: str, cells: Cells, after: Next, code: int) -> None:
    found = classify(end)
    assert (found.name, found.cells, found.next, found.exit_code) == (row, cells, after, code)


def test_a_dead_device_is_asked_once_and_only_for_a_fatal_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import flctl.devices

    asked: list[int] = []
    monkeypatch.setattr(flctl.devices, "device_works", lambda: asked.append(1) or False)
    assert classify(End(RuntimeError("CUDA error: an illegal memory access was encountered"))).name == "device lost"
    assert classify(End(RuntimeError("CUDA out of memory"))).name == "own error"
    assert classify(End(ValueError("no"))).name == "own error"
    assert asked == [1]


def test_every_row_has_a_line_its_fields_can_fill() -> None:
    for row in outcomes.OUTCOMES:
        row.line.format(run="0123456789abcdef", error="E: x", exc="x", epochs=3)
        assert (row.why != "") == (row.cells in (Cells.HAND_BACK, Cells.HAND_BACK_ONCE)), row.name
    assert outcomes.OUTCOMES[-1].matches(End(None))      # the last row takes any end: classify always finds one


# A task whose training raises TimeoutError (a kind of end the table has no row for) for seed 1 only.
TASK = textwrap.dedent('''
    import torch
    from flctl.tasks import Task

    def load(options, data_dir):
        from sklearn.datasets import make_blobs
        from flctl.data import Dataset, Split
        x, y = make_blobs(n_samples=60, centers=2, random_state=0)
        x, y = torch.tensor(x, dtype=torch.float32), torch.tensor(y)
        return Dataset(Split(x[:40], y[:40]), Split(x[40:], y[40:]))

    class Slow(torch.nn.Sequential):
        def forward(self, x):
            raise TimeoutError("the shared filesystem did not answer in 60 s")

    def build_model(options, data):
        from flctl.models import mlp
        model = mlp([2, 4, 2])
        return Slow(*model) if torch.initial_seed() == 1 else model

    TASK = Task(name="slow-blobs", kind="classification", description="two blobs; seed 1 times out",
                defaults=dict(epochs=2, batch_size=20, optimizer="adamw", lr=1e-2, eps=0.1, alpha=1.0, dual_lr=0.5),
                options={}, load=load, build_model=build_model)
''')

TIMED_OUT = Outcome("timed out", lambda e: isinstance(e.error, TimeoutError), Cells.HAND_BACK, Next.STOP, 4,
                    "run {run} timed out ({exc}); it goes back to the queue", why="timed out; resumes")


def test_a_new_row_reaches_the_record_the_worker_and_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             clean_plugins) -> None:
    from flctl import api
    from flctl.db import Store
    from tests.helpers import in_process

    task_file = tmp_path / "slow_blobs.py"
    task_file.write_text(TASK)
    api.use_tasks(task_file)
    monkeypatch.setattr(outcomes, "OUTCOMES", [TIMED_OUT, *outcomes.OUTCOMES])
    results = tmp_path / "results"

    res = in_process("run", "slow-blobs", "-m", "fl", "--seed", "1", "--results-dir", str(results))
    run_id = api.config("slow-blobs", "fl", seed=1).run_id
    assert res.returncode == 4 and f"run {run_id} timed out (the shared filesystem did not answer in 60 s)" in \
        res.stderr and "Traceback" not in res.stderr, res.stderr
    store = Store.open(f"sqlite:///{results / 'flctl.db'}")
    run = store.get_run(run_id)
    assert (run.status, run.attempts, run.error) == (Status.INTERRUPTED, 0, "timed out; resumes")

    # a sweep's worker (in this process: the debug executor) stops after the row's cell, as the row says
    res = in_process("sweep", "slow-blobs", "-m", "fl", "--seed", "1,0", "--batch-runs", "1", "--executor", "debug",
                     "--results-dir", str(results))
    assert f"flctl worker: run {run_id} timed out" in res.stderr and "this worker stops" in res.stderr, res.stderr
    statuses = {r.seed: r.status for r in store.list_runs()}
    assert statuses == {1: Status.INTERRUPTED, 0: Status.QUEUED}, statuses     # it claimed no cell after it
    store.close()


def test_a_dead_device_under_a_group_sends_each_cell_to_train_alone(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, every cell of the group failed, its attempt counted, on every try: the cell that kills the device
    took its siblings with it until all their attempts were spent. Alone, it fails by itself."""
    from flctl.claimed import ClaimedRuns
    from flctl.db import RunQueue, Store
    from flctl.layout import Layout
    from flctl.loggers import Logging
    from flctl.status import TRAIN_ALONE
    from tests.helpers import config

    monkeypatch.setattr("flctl.devices.device_works", lambda: False)
    store = Store.open(f"sqlite:///{tmp_path / 'flctl.db'}")
    cfgs = [config("two-moons", "fl", seed=s) for s in range(3)]
    store.add_runs(cfgs)
    queue = RunQueue(store)
    dead = RuntimeError("CUDA error: an illegal memory access was encountered")

    def train(group: list) -> ClaimedRuns:
        tokens = {c.run_id: queue.claim_run(c.run_id, max_attempts=3) for c in group}
        with ClaimedRuns(group, tokens, store, Layout(tmp_path), Logging((), tmp_path), max_attempts=3) as claimed:
            claimed.start()
            raise dead
        return claimed

    assert train(cfgs).ending.outcome.name == "device lost"
    runs = [store.get_run(c.run_id) for c in cfgs]
    assert [(r.status, r.attempts) for r in runs] == [(Status.INTERRUPTED, 0)] * 3
    assert all(r.error.startswith(TRAIN_ALONE) and "lost its device" in r.error for r in runs)
    train(cfgs[:1])                         # alone: its attempt counted, queued again while attempts are left
    run = store.get_run(cfgs[0].run_id)
    assert (run.status, run.attempts) == (Status.QUEUED, 1) and "illegal memory access" in run.error
    store.close()
