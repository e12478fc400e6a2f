"""Real processes: a `flctl run` killed with SIGKILL resumes to the same records; import boundaries.

The processes a test signals or kills are forked warm (tests/warm.py); those whose imports are checked start a new
interpreter."""

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
from tests import warm
from tests.helpers import in_process

# Slow (pyproject.toml's markers; `pytest -m "not slow"` is the fast loop): real flctl processes killed, signalled
# and checked for their imports: 31 s of the suite's 904 s of test time (2 cores, xdist -n 2).
pytestmark = pytest.mark.slow

FLCTL = [sys.executable, "-m", "flctl"]
REPO = Path(__file__).resolve().parents[1]


def flctl(results: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*FLCTL, *args, "--results-dir", str(results)], capture_output=True, text=True,
                          timeout=300, **kw)


def cli(results: Path, *args: str) -> subprocess.CompletedProcess:
    """flctl in this process: the uninterrupted runs, resumes and reads around the process a test kills."""
    return in_process(*args, "--results-dir", str(results))


def test_killed_run_resumes_and_ends_equal_to_an_uninterrupted_run(tmp_path: Path) -> None:
    args = ("run", "two-moons", "--method", "fl", "--eps", "0.1", "--epochs", "150", "--eval-every", "10")
    whole = cli(tmp_path / "a", *args)
    assert whole.returncode == 0, whole.stderr

    killed = tmp_path / "b"
    proc = warm.Popen([*FLCTL, *args, "--results-dir", str(killed)], stdout=warm.DEVNULL, stderr=warm.DEVNULL)
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

    resumed = cli(killed, *args)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from epoch" in resumed.stdout

    run_id = run_dirs[0].name
    a = records.read(tmp_path / "a" / "records", [run_id]).sort_by([("epoch", "ascending"), ("split", "ascending"),
                                                                    ("sample_id", "ascending")])
    b = records.read(killed / "records", [run_id]).sort_by([("epoch", "ascending"), ("split", "ascending"),
                                                             ("sample_id", "ascending")])
    assert len(a) == 15 * 2 * 1000 and a.equals(b)          # no lost and no duplicated rows
    row = json.loads(cli(killed, "show", run_id, "--json").stdout)
    assert row["status"] == "completed" and row["attempts"] == 2


def test_the_installed_package_holds_every_package_of_the_checkout() -> None:
    """pyproject.toml lists flctl's packages by hand (tasks/ installs as flctl_tasks): a package missing there is
    missing from every non-editable install (the Dockerfile's), while the editable checkout still works."""
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "flctl").rglob("__init__.py")}
    assert listed - {"flctl_tasks"} == found and "flctl_tasks" in listed


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


def test_a_run_imports_only_its_own_task() -> None:
    # `flctl run two-moons` in one process, then a look at what it imported: no torchvision (cifar10/utkface's
    # models), no other task's module.
    code = ("import sys, runpy, tempfile; d = tempfile.mkdtemp(); "
            "sys.argv = ['flctl', 'run', 'two-moons', '--epochs', '1', '--results-dir', d]\n"
            "try:\n    runpy.run_module('flctl', run_name='__main__')\nexcept SystemExit as e:\n    assert not e.code, e\n"
            "print(sorted(m for m in sys.modules if m.startswith(('torchvision', 'flctl_tasks.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "['flctl_tasks.two_moons']", out.stdout


@pytest.mark.parametrize("task", ["two-moons", "digits", "diabetes", "polyfit", "cifar10", "utkface"])
def test_planning_a_sweep_imports_no_torch(task: str) -> None:
    # A task module imports torch, scikit-learn and torchvision inside its functions, so `flctl sweep` plans
    # (and starts its workers) without paying ~2 s of imports first. orca-dpo's policy class needs torch at import.
    code = ("import sys, runpy, tempfile; d = tempfile.mkdtemp(); "
            f"sys.argv = ['flctl', 'sweep', {task!r}, '--seeds', '2', '--dry-run', '--results-dir', d]\n"
            "try:\n    runpy.run_module('flctl', run_name='__main__')\nexcept SystemExit as e:\n    assert not e.code, e\n"
            "print(sorted(m for m in ('torch', 'sklearn', 'torchvision') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


def test_sigterm_and_sigint_stop_a_run_interrupted_and_it_resumes_to_identical_records(tmp_path: Path) -> None:
    args = ("run", "two-moons", "--method", "fl", "--eps", "0.1", "--epochs", "300", "--eval-every", "25",
            "--checkpoint-every", "3600")          # by time: never; the checkpoints are the eval epochs' and the stop's
    whole = cli(tmp_path / "a", *args)
    assert whole.returncode == 0, whole.stderr
    order = [("epoch", "ascending"), ("split", "ascending"), ("sample_id", "ascending")]

    for sig, code in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
        stopped = tmp_path / sig.name
        proc = warm.Popen([*FLCTL, *args, "--results-dir", str(stopped)], stdout=warm.PIPE, stderr=warm.STDOUT,
                          env={**os.environ, "COLUMNS": "200"})
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(list((stopped / "records").glob("run_id=*/epoch=*.parquet"))) < 3:
            time.sleep(0.02)
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == code, (sig, out)
        [run_dir] = list((stopped / "runs").iterdir())
        row = json.loads(cli(stopped, "show", run_dir.name, "--json").stdout)
        assert row["status"] == "interrupted" and row["attempts"] == 0, row     # handed back, not failed
        # One line after the progress bar, which is closed by then: the last line of the output.
        assert out.strip().splitlines()[-1].startswith(f"interrupted after epoch {row['epochs_done']}, "
                                                       "checkpointed"), out
        listed = json.loads(cli(stopped, "runs", "--status", "interrupted", "--json").stdout)
        assert [r["id"] for r in listed] == [run_dir.name]
        import torch

        assert torch.load(run_dir / "checkpoint.pt", weights_only=True)["epoch"] == row["epochs_done"]

        resumed = cli(stopped, *args)
        assert resumed.returncode == 0, resumed.stderr
        assert f"resumed from epoch {row['epochs_done']}" in resumed.stdout
        a = records.read(tmp_path / "a" / "records", [run_dir.name]).sort_by(order)
        b = records.read(stopped / "records", [run_dir.name]).sort_by(order)
        assert len(a) == 12 * 2 * 1000 and a.equals(b)
        done = json.loads(cli(stopped, "show", run_dir.name, "--json").stdout)
        assert done["status"] == "completed" and done["attempts"] == 1
        assert done["duration_s"] > row["duration_s"] > 0                          # both attempts' time


def test_piped_output_keeps_whole_cells_and_completion_is_offered(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    assert cli(tmp_path, "run", "digits", "-m", "fl", "--epochs", "1").returncode == 0
    listing = flctl(tmp_path, "runs", env=env)                     # stdout is a pipe here, not a terminal
    run_id = json.loads(flctl(tmp_path, "runs", "--json", env=env).stdout)[0]["id"]
    assert run_id in listing.stdout and "digits" in listing.stdout and "…" not in listing.stdout
    help_text = subprocess.run([*FLCTL, "--help"], capture_output=True, text=True, env=env).stdout
    assert "--install-completion" in help_text


def test_a_process_that_ends_freezes_its_objects_after_every_other_exit_handler() -> None:
    """flctl's console script and a worker job end without the collector walking every object (1.2-1.5 s of a run's
    exit with torch loaded): the freeze runs after the handlers registered later (a tracker's flush), and what was
    printed and the exit code are those of a plain exit."""
    code = ("import atexit, gc, sys; from flctl.procs import end_without_collecting; end_without_collecting(); "
            "atexit.register(lambda: print('before the freeze:', gc.get_freeze_count())); "
            "atexit.register(lambda: sys.stdout.write('unflushed')); sys.exit(3)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout, out.stderr) == (3, "unflushedbefore the freeze: 0\n", "")
    code = ("import atexit, gc; from flctl.procs import end_without_collecting; "
            "atexit.register(lambda: print('frozen:', gc.get_freeze_count() > 0)); end_without_collecting()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout) == (0, "frozen: True\n"), out.stderr
