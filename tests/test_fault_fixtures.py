"""`flctl paper` and `flctl export` under the faults `run` and `sweep --wait` are tried with elsewhere
(test_ground_moving, test_first_contact_run, test_database_server_stops, test_tracker_faults): a disk that fills
(a file size limit stands for it: tmpfs cannot be mounted here) and a signal. Each ends with one `error:` (or
`interrupted`) line and its documented exit code (docs/reference.md: 1, 143), no traceback, within a bounded time,
and nothing is lost: the same command afterwards completes the bundle, or the export."""

from __future__ import annotations

import os
import resource
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests import warm
from tests.helpers import wait_until

pytestmark = pytest.mark.slow

FLCTL = [sys.executable, "-m", "flctl"]


def file_limit(kib: int):
    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)       # a write past the limit is EFBIG, not a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (kib * 1024, kib * 1024))
    return limited


def errors(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


def test_paper_and_export_under_a_full_disk_and_a_signal_end_in_one_line_and_lose_nothing(tmp_path: Path) -> None:
    results = tmp_path / "results"
    paper = [*FLCTL, "paper", "--scale", "smoke", "--only", "figure:3", "--executor", "debug",
             "--results-dir", str(results)]
    env = {**os.environ, "COLUMNS": "200"}

    # 300 KiB: the records fit, the database's journal does not (at e320564: a 100-line SQLAlchemy traceback)
    full = subprocess.run(paper, capture_output=True, text=True, timeout=300, preexec_fn=file_limit(300), env=env)
    assert full.returncode == 1, full.stdout + full.stderr
    assert "Traceback" not in full.stdout + full.stderr
    assert len(errors(full.stderr)) == 1, full.stderr

    # SIGTERM while its cell trains: 143 and one line
    def training() -> bool:
        with sqlite3.connect(results / "flctl.db") as db:
            return db.execute("SELECT count(*) FROM runs WHERE status = 'running'").fetchone()[0] > 0

    run = warm.Popen(paper, stdout=warm.PIPE, stderr=warm.PIPE, text=True, env=env)
    wait_until(lambda: run.poll() is not None or training(), "a cell training", timeout=120, interval=0.05)
    run.send_signal(signal.SIGTERM)
    out, err = run.communicate(timeout=120)
    assert run.returncode in (0, 143), out + err       # 0: its one smoke cell was done before the signal came
    assert "Traceback" not in out + err
    if run.returncode == 143:           # its in-process worker took the signal (SIGTERM stops workers) or the command did
        last = err.strip().splitlines()[-1]
        assert last.endswith("interrupted (SIGTERM)") or "workers were stopped" in last, err

    # nothing lost: the same command completes the bundle
    whole = warm.run(paper, capture_output=True, text=True, timeout=300, env=env)
    assert whole.returncode == 0, whole.stdout + whole.stderr
    assert (results / "paper-smoke" / "index.html").is_file()

    # export with no room for the tracker's files: exit 1, one line, and the records untouched
    sweep_id = sqlite3.connect(results / "flctl.db").execute("SELECT id FROM sweeps").fetchone()[0]
    export = [*FLCTL, "export", sweep_id, "--to", "tensorboard", "--results-dir", str(results)]
    cramped = subprocess.run(export, capture_output=True, text=True, timeout=300, preexec_fn=file_limit(1), env=env)
    assert cramped.returncode == 1, cramped.stdout + cramped.stderr
    assert "Traceback" not in cramped.stdout + cramped.stderr
    assert len(errors(cramped.stderr)) == 1 and "flctl export" in errors(cramped.stderr)[0], cramped.stderr
    verify = warm.run([*FLCTL, "verify", "--results-dir", str(results)], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    again = warm.run(export, capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0, again.stdout + again.stderr


def test_worker_jobs_where_flctl_does_not_import_are_told_and_the_sweep_completes(tmp_path: Path) -> None:
    """A node where flctl does not import (stood for by a package of that name earlier on the workers' PYTHONPATH,
    set after this process imported the real one): its worker jobs die before they can train. `sweep --wait` trains
    the cells in its own process, exits 0, and says in one warning line why the jobs did not help (before: silent).
    The cells take seconds, so that the jobs have failed before the wait ends (a sweep done sooner did not need them,
    and says nothing)."""
    shadow = tmp_path / "shadow" / "flctl"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ImportError("flctl does not import on this node")\n')
    results = tmp_path / "results"
    script = ("import os, sys\nfrom flctl.cli import main\n"
              f"os.environ['PYTHONPATH'] = {str(shadow.parent)!r}\n"
              "sys.argv = ['flctl', 'sweep', 'two-moons', '-m', 'erm', '--seeds', '3', '--epochs', '300', '--executor', "
              f"'local', '--workers', '3', '--threads', '1', '--wait', '--results-dir', {str(results)!r}]\nmain()\n")
    # not from the checkout: `python -m` puts the current folder first on a worker's path, before PYTHONPATH
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "200"}, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    warned = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    assert len(warned) == 1 and "2 worker job(s) failed before they could train (ImportError: flctl does not " \
        "import on this node)" in warned[0] and "_log.err" in warned[0], done.stderr
    assert "Traceback" not in done.stderr
    with sqlite3.connect(results / "flctl.db") as db:
        assert db.execute("SELECT status, count(*) FROM runs GROUP BY status").fetchall() == [("completed", 3)]
    # and later, from another shell (a sweep launched without --wait is followed this way): status tells it too
    status = subprocess.run([*FLCTL, "status", "--results-dir", str(results)], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert status.returncode == 0, status.stdout + status.stderr
    assert [line for line in status.stderr.splitlines() if line.startswith("warning:")] == warned, status.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_command_line_is_imported_is_one_line_and_its_code(signum: signal.Signals) -> None:
    """The first phase of every command: the ~0.3 s in which flctl.cli and its libraries are imported, before its
    handlers are in place. A signal sent as that import begins (a hook on __import__ sends it, so that it lands there
    every time) ends the command as a later one does: one line, 128 + its number (before: Ctrl-C was a
    KeyboardInterrupt traceback out of an import, SIGTERM a silent -15)."""
    script = ("import builtins, os, sys\nimport flctl.__main__ as entry\nreal = builtins.__import__\n"
              "def hook(name, *args, **kwargs):\n"
              f"    if name == 'flctl.cli':\n        os.kill(os.getpid(), {int(signum)})\n"
              "    return real(name, *args, **kwargs)\n"
              "builtins.__import__ = hook\nsys.argv = ['flctl', 'tasks']\nentry.main()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (128 + signum, "", f"flctl: interrupted ({signum.name})\n")
