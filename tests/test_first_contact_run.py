"""A run survives what a results folder meets in use: a checkpoint that cannot be loaded (set aside, the run starts
over), a full disk (one line naming the file, the run left interrupted and resumable), and a shell that exports
FLCTL_DB while the tests run."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flctl import records
from flctl.cli import app
from flctl.db import Store
from flctl.layout import Layout, records_of
from flctl.runner import execute
from tests import warm
from tests.helpers import config

# Slow (pyproject.toml's markers; `pytest -m "not slow"` is the fast loop): runs resumed after a full disk and
# damaged checkpoints: 13 s of the suite's 904 s of test time (2 cores, xdist -n 2).
pytestmark = pytest.mark.slow

FLCTL = [sys.executable, "-m", "flctl"]
ORDER = [("epoch", "ascending"), ("split", "ascending"), ("sample_id", "ascending")]
# Small and quick: 3 eval epochs of 300 samples; "hidden" sets the checkpoint's size (for the full disk).
ARGS = ["run", "two-moons", "-m", "fl", "--epochs", "6", "--eval-every", "2", "-o", "n_train=300", "-o", "n_test=300"]

runner = CliRunner()


def cli(root: Path, *args: str):
    res = runner.invoke(app, [*args, "--results-dir", str(root)], env={"COLUMNS": "200"})
    return res


def uninterrupted(root: Path, args: list[str]):
    assert cli(root, *args).exit_code == 0
    [run_id] = [p.name for p in (root / "runs").iterdir()]
    return run_id, records.read(root / "records", [run_id]).sort_by(ORDER)


def stopped_after_epoch_2(root: Path) -> Path:
    """An interrupted run as a Ctrl-C leaves it: records and a checkpoint of epoch 2, status interrupted."""
    cfg = config("two-moons", "fl", epochs=6, eval_every=2, options={"n_train": "300", "n_test": "300"})
    asked = iter([False, False, True])      # before the first epoch, then at each epoch's end
    root.mkdir(parents=True)
    store = Store.open(f"sqlite:///{root / 'flctl.db'}")
    try:
        ending = execute(cfg, store, Layout(root), stop=lambda: next(asked))
    finally:
        store.close()
    assert ending is not None
    [result] = ending.results
    assert result.status == "stopped" and result.epochs_done == 2
    return Layout(root).run_dir(cfg.run_id) / "checkpoint.pt"


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_a_checkpoint_that_cannot_be_loaded_is_set_aside_and_the_run_starts_over(tmp_path: Path,
                                                                                  damage: str) -> None:
    run_id, whole = uninterrupted(tmp_path / "a", ARGS)
    root = tmp_path / "b"
    checkpoint = stopped_after_epoch_2(root)
    assert checkpoint.parent.name == run_id
    if damage == "garbage":
        checkpoint.write_bytes(b"not a checkpoint\n" * 10)
    else:
        checkpoint.write_bytes(checkpoint.read_bytes()[: 0 if damage == "empty" else 3000])
    # a failed attempt's record of a later epoch, which the restart must not leave beside its own
    stray = records_of(root / "records", run_id) / "epoch=00005.parquet"
    stray.write_bytes((records_of(tmp_path / "a" / "records", run_id) / "epoch=00004.parquet").read_bytes())

    res = cli(root, *ARGS)
    assert res.exit_code == 0, res.output
    warnings = [line for line in res.output.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "cannot be loaded" in warnings[0] and "from scratch" in warnings[0], res.output
    assert "weights_only" not in res.output and "Traceback" not in res.output
    [aside] = checkpoint.parent.glob("checkpoint.pt.corrupt-*")
    assert aside.name in warnings[0] and not checkpoint.exists()
    assert not stray.exists()
    assert records.read(root / "records", [run_id]).sort_by(ORDER).equals(whole)


def _limited(max_bytes: int):
    def apply() -> None:     # in the child: writes past max_bytes fail with EFBIG instead of killing it
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))
    return apply


def test_a_full_disk_is_one_line_naming_the_file_and_the_run_resumes(tmp_path: Path) -> None:
    # hidden=400: a ~2 MB checkpoint against a 512 KiB limit, which records (~14 KB a file) and the database stay
    # under: the first checkpoint cannot be written, as on a disk that filled up.
    args = [*ARGS, "-o", "hidden=400"]
    run_id, whole = uninterrupted(tmp_path / "a", args)
    root = tmp_path / "b"
    full = subprocess.run([*FLCTL, *args, "--results-dir", str(root)], capture_output=True, text=True, timeout=300,
                          preexec_fn=_limited(512 * 1024), env={**os.environ, "COLUMNS": "200"})
    lines = full.stderr.strip().splitlines()
    assert full.returncode == 1, full.stderr
    assert len(lines) == 1 and lines[0].startswith("error: cannot write "), full.stderr
    assert str(root / "runs" / run_id / "checkpoint.pt") in lines[0] and "File too large" in lines[0]
    assert "is interrupted" in lines[0] and "Traceback" not in full.stdout
    row = json.loads(cli(root, "show", run_id, "--json").stdout)
    assert row["status"] == "interrupted" and row["attempts"] == 0, row          # handed back, not failed
    assert not list((root / "runs" / run_id).glob(".*.tmp"))                     # no half-written file left

    res = cli(root, *args)                                                       # space again: it resumes
    assert res.exit_code == 0, res.output
    assert records.read(root / "records", [run_id]).sort_by(ORDER).equals(whole)
    assert json.loads(cli(root, "show", run_id, "--json").stdout)["status"] == "completed"


def test_the_suite_passes_with_flctl_db_exported(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.db"
    env = {**os.environ, "FLCTL_DB": f"sqlite:///{elsewhere}", "FLCTL_RESULTS": str(tmp_path / "user-results")}
    # One case, on the populated folder built first, in one process forked warm (tests/warm.py).
    out = warm.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
                    "tests/test_bad_input.py", "-k", "mnist"],
                   capture_output=True, timeout=600, env=env, cwd=Path(__file__).parent.parent)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "1 passed" in out.stdout, out.stdout[-3000:]
    assert not elsewhere.exists() and not (tmp_path / "user-results").exists()
