"""Real processes: a `flctl run` killed with SIGKILL resumes to the same records; import boundaries."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flctl import records

FLCTL = [sys.executable, "-m", "flctl"]


def flctl(results: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*FLCTL, *args, "--results-dir", str(results)], capture_output=True, text=True,
                          timeout=300, **kw)


def test_killed_run_resumes_and_ends_equal_to_an_uninterrupted_run(tmp_path: Path) -> None:
    args = ("run", "two-moons", "--method", "fl", "--eps", "0.1", "--epochs", "150", "--eval-every", "10")
    whole = flctl(tmp_path / "a", *args)
    assert whole.returncode == 0, whole.stderr

    killed = tmp_path / "b"
    proc = subprocess.Popen([*FLCTL, *args, "--results-dir", str(killed)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    # Kill -9 once a checkpoint past epoch 30 exists: mid-training, with some records already written.
    while time.monotonic() < deadline:
        parts = list((killed / "records").glob("run_id=*/epoch=*.parquet"))
        if len(parts) >= 3:
            break
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    run_dirs = list((killed / "runs").iterdir())
    assert len(run_dirs) == 1 and (run_dirs[0] / "checkpoint.pt").exists(), "killed before the first checkpoint"
    assert not (run_dirs[0] / "model.pt").exists(), "the run finished before it was killed"

    resumed = flctl(killed, *args)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from epoch" in resumed.stdout

    run_id = run_dirs[0].name
    a = records.read(tmp_path / "a" / "records", [run_id]).sort_by([("epoch", "ascending"), ("split", "ascending"),
                                                                    ("sample_id", "ascending")])
    b = records.read(killed / "records", [run_id]).sort_by([("epoch", "ascending"), ("split", "ascending"),
                                                             ("sample_id", "ascending")])
    assert len(a) == 15 * 2 * 1000 and a.equals(b)          # no lost and no duplicated rows
    row = json.loads(flctl(killed, "show", run_id, "--json").stdout)
    assert row["status"] == "completed" and row["attempts"] == 2


def test_cli_startup_does_not_import_torch() -> None:
    code = "import sys, flctl.cli; sys.exit(int(any(m in sys.modules for m in ('torch', 'sqlalchemy', 'pyarrow'))))"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.parametrize("module", ["flctl.train", "flctl.methods", "flctl.data", "flctl.models", "flctl.records",
                                    "flctl.metrics", "flctl.config"])
def test_core_modules_import_no_infrastructure(module: str) -> None:
    banned = ("sqlalchemy", "optuna", "submitit", "typer")
    code = f"import sys, {module}; bad = [m for m in {banned!r} if m in sys.modules]; print(bad); sys.exit(bool(bad))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
