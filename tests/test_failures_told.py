"""When cells fail, the user is told at once: `sweep --wait` and `status --watch` exit with CELLS_FAILED_EXIT and
one line per distinct error (its count, a run to `flctl show`); a task's own exception is not retried within the
launch; `runs` and `status` have an error column; `show` prints a traceback as lines, the epochs done when the run
failed and the library versions; and a log without a terminal gets timestamped lines as the run goes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from flctl.db import Store
from flctl.status import CELLS_FAILED_EXIT
from tests import warm

# Slow (pyproject.toml's markers; `pytest -m "not slow"` is the fast loop): sweeps whose cells fail, watched to
# their end: 21 s of the suite's 904 s of test time (2 cores, xdist -n 2).
pytestmark = pytest.mark.slow

FLCTL = [sys.executable, "-m", "flctl"]

# Two moons whose model raises a task's own error (the same on every try) at the training forward $FAIL_AT of a
# process, for the seeds in $FAIL_SEEDS: two forwards an epoch (1,000 samples, batches of 512).
FAILING_TASK = textwrap.dedent('''
    import dataclasses
    import os
    import torch
    from flctl_tasks.two_moons import TASK as MOONS

    class Failing(torch.nn.Module):
        def __init__(self, body):
            super().__init__()
            self.body, self.calls = body, 0

        def forward(self, x):
            if self.training:
                self.calls += 1
                if self.calls >= int(os.environ.get("FAIL_AT", "1")):
                    raise ValueError(f"planted failure at training step {self.calls}")
            return self.body(x)

    def build_model(options, data):
        model = MOONS.build_model(options, data)
        seeds = {int(s) for s in os.environ.get("FAIL_SEEDS", "").split(",") if s}
        return Failing(model) if torch.initial_seed() in seeds else model

    TASK = dataclasses.replace(MOONS, name="failing-moons", description="two moons whose chosen seeds fail",
                               build_model=build_model, batched=False)
''')


def flctl(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    task_file = tmp_path / "failing_moons.py"
    if not task_file.exists():
        task_file.write_text(FAILING_TASK)
    return warm.run([*FLCTL, *args, "--results-dir", str(tmp_path / "results")], capture_output=True, text=True,
                    timeout=300, env={**os.environ, "COLUMNS": "250", "FLCTL_TASKS": str(task_file), **env})


def test_a_sweep_whose_cells_fail_says_why_once_per_error_and_exits_non_zero(tmp_path: Path) -> None:
    out = flctl(tmp_path, "sweep", "failing-moons", "-m", "fl", "--seeds", "4", "--epochs", "3", "--executor",
                "debug", "--batch-runs", "1", "--wait", FAIL_SEEDS="1,2,3")
    assert out.returncode == CELLS_FAILED_EXIT, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if "failed or diverged" in line)
    assert lines[head].startswith("3 of 4 cell(s) failed or diverged"), lines[head]
    assert lines[head + 1].strip().startswith("3 × ValueError: planted failure at training step 1  (flctl show ")
    assert len(lines) == head + 2                        # one line per distinct error
    store = Store.open(f"sqlite:///{tmp_path / 'results' / 'flctl.db'}")
    failed = [r for r in store.list_runs() if r.status == "failed"]
    assert len(failed) == 3 and all(r.attempts == 1 for r in failed)     # the same error is not tried again

    # the ledger and the runs table name the error; `status --watch` of a settled sweep says the same, exit 3
    status = flctl(tmp_path, "status")
    assert status.returncode == 0 and "ValueError: planted failure" in status.stdout, status.stdout
    watched = flctl(tmp_path, "status", "--watch")
    assert watched.returncode == CELLS_FAILED_EXIT and "3 × ValueError: planted failure" in watched.stdout
    runs = flctl(tmp_path, "runs")
    assert runs.stdout.count("ValueError: planted failure at training step 1") == 3, runs.stdout
    data = json.loads(flctl(tmp_path, "status", "--json").stdout)
    assert [(e["count"], e["message"]) for e in data["errors"]] == [(3, "ValueError: planted failure at training "
                                                                        "step 1")]

    # a new launch of the sweep tries the failed cells again (the cause may be fixed): they complete now
    again = flctl(tmp_path, "sweep", "failing-moons", "-m", "fl", "--seeds", "4", "--epochs", "3", "--executor",
                  "debug", "--batch-runs", "1", "--wait")
    assert again.returncode == 0, again.stdout + again.stderr
    assert {r.status for r in store.list_runs()} == {"completed"}
    assert {r.attempts for r in store.list_runs() if r.seed} == {2}


def test_show_prints_the_traceback_as_lines_the_epochs_done_and_the_libraries(tmp_path: Path) -> None:
    out = flctl(tmp_path, "run", "failing-moons", "-m", "fl", "--seed", "1", "--epochs", "10", "--eval-every", "1",
                FAIL_SEEDS="1", FAIL_AT="7")            # the 7th training step: in epoch 4, after 3 epochs
    assert out.returncode == 1 and "ValueError: planted failure at training step 7" in out.stderr, out.stderr
    store = Store.open(f"sqlite:///{tmp_path / 'results' / 'flctl.db'}")
    [run] = store.list_runs()
    assert run.status == "failed" and run.epochs_done == 3
    shown = flctl(tmp_path, "show", run.id[:8]).stdout.splitlines()
    assert "Traceback (most recent call last):" in shown
    assert "ValueError: planted failure at training step 7" in shown
    assert max(map(len, shown)) < 250                     # lines, not one folded traceback
    assert any(line.startswith(f"run {run.id} failed after 3 epochs") for line in shown)
    libraries = next(line for line in shown if line.startswith("libraries: "))
    assert "torch " in libraries and "numpy " in libraries


def test_a_run_without_a_terminal_logs_a_timestamped_line_as_it_goes(tmp_path: Path) -> None:
    """stdout to a file, as under nohup, CI or Slurm: a line when training starts, while the run still trains,
    and one at each evaluation."""
    log = tmp_path / "log"
    with open(log, "w") as f:
        proc = subprocess.Popen([*FLCTL, "run", "two-moons", "--epochs", "600", "--eval-every", "150",
                                 "--results-dir", str(tmp_path / "results")], stdout=f, stderr=subprocess.STDOUT,
                                env={**os.environ, "COLUMNS": "250"})
        try:
            deadline = time.monotonic() + 120
            while "starting" not in log.read_text() and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.1)
            assert proc.poll() is None and "starting (data, model)" in log.read_text(), log.read_text()
        finally:
            assert proc.wait(timeout=300) == 0
    lines = log.read_text().splitlines()
    evaluated = [line for line in lines if " epoch " in line and "test.accuracy" in line]
    assert [line.split(" epoch ")[1].split(" ")[0] for line in evaluated] == ["150/600", "300/600", "450/600", "600/600"]
    assert all(time.strptime(line[:8], "%H:%M:%S") for line in evaluated)


def test_log_lines_come_at_least_every_interval_while_the_work_is_silent() -> None:
    """LogLines' beat: with nothing said for LOG_EVERY_S, the state is printed (here with a 0.2 s interval)."""
    import io

    from rich.console import Console

    import flctl.cli.progress as progress

    out = io.StringIO()
    before = progress.console
    progress.console = Console(file=out, width=200)
    try:
        lines = progress.LogLines(every_s=0.2)
        with lines.beating(lambda: "still training"):
            time.sleep(1.0)
    finally:
        progress.console = before
    said = out.getvalue().splitlines()
    assert 3 <= len(said) <= 6 and all(line.endswith(" still training") for line in said), said


def test_a_huge_grid_is_refused_at_once_even_with_yes_and_a_large_one_says_how_far_planning_got(tmp_path: Path
                                                                                                  ) -> None:
    """10^6 cells with --yes: refused in one line before a cell is made (at 3623c99 it planned for minutes and over
    a gigabyte, printing nothing); 20,000 with --yes: planned, with a progress line every 10,000 cells."""
    huge = flctl(tmp_path, "sweep", "two-moons", "-m", "fl", "--lr", "1e-4..1:1000", "--dual-lr", "1e-3..1:1000",
                 "--yes", "--dry-run")
    assert huge.returncode == 2 and huge.stderr.startswith("error: the grid has 1,000,000 cells, over the 100,000 "), \
        huge.stderr
    assert huge.stderr.count("\n") == 1
    large = flctl(tmp_path, "sweep", "two-moons", "-m", "fl", "--lr", "1e-4..1:200", "--dual-lr", "1e-3..1:100",
                  "--yes", "--dry-run")
    assert large.returncode == 0, large.stderr
    assert large.stderr.splitlines() == ["planning: 10,000 of 20,000 cells", "planning: 20,000 of 20,000 cells"]
    assert "20,000 runs; nothing was written" in large.stdout and "(the first 200 of 20,000 runs)" in large.stdout
