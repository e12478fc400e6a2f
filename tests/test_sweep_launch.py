"""Sweeps through real subprocesses (submitit's local executor): completion, idempotence, kill -9 recovery."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from flctl import records
from flctl.store import Store
from tests.helpers import wait_until

FLCTL = [sys.executable, "-m", "flctl"]


def flctl(results: Path, *args: str) -> subprocess.CompletedProcess:
    out = subprocess.run([*FLCTL, *args, "--results-dir", str(results)], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "COLUMNS": "200"})
    return out


def ledger(results: Path, sweep: str | None = None) -> dict:
    out = flctl(results, "status", *([sweep] if sweep else []), "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_local_sweep_completes_and_rerun_submits_nothing(tmp_path: Path) -> None:
    args = ("sweep", "two-moons", "--method", "fl,rfl", "--alpha", "1e-2..1", "--seeds", "2", "--epochs", "5",
            "--executor", "local", "--pack", "4")
    first = flctl(tmp_path, *args)
    assert first.returncode == 0, first.stderr
    assert "8 cells, 8 new" in first.stdout and "2 job(s) through local" in first.stdout
    done = wait_until(lambda: (lambda l: l if l["total"]["completed"] == 8 else None)(ledger(tmp_path)))
    assert done["methods"]["fl"]["completed"] == 2 and done["methods"]["rfl"]["completed"] == 6
    again = flctl(tmp_path, *args)
    assert "0 new, 8 completed" in again.stdout and "submitting 0" in again.stdout
    runs = json.loads(flctl(tmp_path, "runs", "--json").stdout)
    assert len(runs) == 8 and all(r["attempts"] == 1 and r["job_id"] for r in runs)


def test_killed_worker_is_reaped_and_its_run_resumes_to_identical_records(tmp_path: Path) -> None:
    cell = ("two-moons", "--method", "fl", "--eps", "0.1", "--epochs", "400", "--eval-every", "10")
    reference = flctl(tmp_path / "ref", "run", *cell)
    assert reference.returncode == 0, reference.stderr

    results = tmp_path / "sweep"
    args = ("sweep", *cell, "--executor", "local")
    assert flctl(results, *args).returncode == 0
    store = Store.open(f"sqlite:///{results / 'flctl.db'}")
    # Wait until the worker has written some records, then kill it with SIGKILL (no cleanup possible).
    wait_until(lambda: len(list((results / "records").glob("run_id=*/epoch=*.parquet"))) >= 3, interval=0.01)
    [run] = store.list_runs()
    assert run["status"] == "running", "the run finished before it could be killed"
    os.kill(run["pid"], signal.SIGKILL)
    wait_until(lambda: ledger(results)["total"]["stale"] == 1)       # dead pid on this host: stale at once

    resumed = flctl(results, *args)
    assert "1 re-queued after a lost worker" in resumed.stdout and "submitting 1" in resumed.stdout
    wait_until(lambda: ledger(results)["total"]["completed"] == 1)
    [run] = store.list_runs()
    assert run["attempts"] == 2 and run["status"] == "completed"

    order = [("epoch", "ascending"), ("split", "ascending"), ("sample_id", "ascending")]
    a = records.read(tmp_path / "ref" / "records", [run["id"]]).sort_by(order)
    b = records.read(results / "records", [run["id"]]).sort_by(order)
    assert len(b) == 40 * 2 * 1000 and a.equals(b)                 # no lost, no duplicated rows
