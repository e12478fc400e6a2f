"""The ground moving under a sweep: its database file deleted or replaced, or its results folder deleted, while
`sweep --wait` and its workers run. The command stops with one line and exit 1, and nothing writes any more: no empty
database appears in the deleted one's place, a replacement file is left as it was put there, a deleted results
folder stays deleted. At 3623c99 the sweep hung or exited 0 while its workers wrote into the unlinked file."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flctl.db import Store
from tests import warm
from tests.helpers import wait_until
from tests.test_sweep_launch import worker_pids

# Slow (pyproject.toml's markers; `pytest -m "not slow"` is the fast loop): two-worker sweeps whose database or
# results folder goes away under them: 135 s of the suite's 904 s of test time (2 cores, xdist -n 2).
pytestmark = pytest.mark.slow

FLCTL = [sys.executable, "-m", "flctl"]


@pytest.mark.parametrize("how", ["delete the database", "replace the database", "delete the results folder"])
def test_a_sweep_stops_in_one_line_when_its_ground_moves(tmp_path: Path, how: str) -> None:
    results = tmp_path / "results"
    db = results / "flctl.db"
    # 2 workers: one in this command's process, one a submitit job; the heartbeat is short, as a heartbeat of the
    # real length would only make the test wait longer
    # Two grouped cells a worker (the CPU's default): at 143ffa6 a loaded suite twice saw the deleted database told as
    # "replaced", as a connection opened after the deletion made an empty file in its place (no connection makes the
    # file now: flctl.db.sqlite.never_made_again).
    # Cells too long to end in the test (the moved ground stops them): at 4000 epochs a CI run once timed out
    # waiting for two cells training, as if they had ended before the look saw both conditions at once.
    proc = subprocess.Popen([*FLCTL, "sweep", "two-moons", "-m", "fl", "--seeds", "4", "--epochs", "200000",
                             "--eval-every", "50", "--workers", "2", "--threads", "1", "--executor", "local",
                             "--wait", "--results-dir", str(results)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "FLCTL_HEARTBEAT": "0.5", "COLUMNS": "250"})
    try:
        wait_until(lambda: _running(results) >= 2
                   and len(list((results / "records").glob("run_id=*/epoch=*.parquet"))) >= 2,
                   "two cells training", interval=0.1,
                   explain=lambda: f"sweep exit {proc.poll()}; {_running(results)} running; records "
                                   f"{sorted(p.parent.name for p in results.glob('records/run_id=*/epoch=*'))}")
        kept = None
        if how == "delete the database":
            db.unlink()
        elif how == "replace the database":
            shutil.copy(db, tmp_path / "copy.db")
            os.replace(tmp_path / "copy.db", db)
            kept = hashlib.sha256(db.read_bytes()).hexdigest()
        else:
            shutil.rmtree(results)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1, out + err
    assert len(errors) == 1, err
    said = {"delete the database": f"the database {db.resolve()} was deleted",
            "replace the database": f"the database {db.resolve()} was replaced by another file",
            "delete the results folder": "was deleted"}[how]
    assert said in errors[0] and "its workers stop and write no more" in errors[0], errors[0]
    wait_until(lambda: not worker_pids(results), "the workers to stop", timeout=120)
    time.sleep(1.0)     # two heartbeats: a worker still writing would show now
    if how == "delete the database":
        assert not db.exists(), "an empty database was made in the deleted one's place"
    elif how == "replace the database":
        assert hashlib.sha256(db.read_bytes()).hexdigest() == kept, "something wrote into the replacement"
    else:
        assert not results.exists(), "the deleted results folder was made again"


@pytest.mark.parametrize("how", ["delete the database", "replace the results folder by a file"])
def test_a_debug_sweep_whose_ground_moves_under_its_worker_here_ends_in_one_line(tmp_path: Path, how: str) -> None:
    """The debug launcher's worker runs in the command itself: once it stops for the moved ground, the command
    syncs nothing into what is gone and ends with its one line and exit 1 (a traceback, and submitit's post-mortem
    debugger waiting at a terminal, before)."""
    results = tmp_path / "results"
    proc = warm.Popen([*FLCTL, "sweep", "two-moons", "-m", "fl", "--seeds", "3", "--epochs", "4000",
                       "--eval-every", "50", "--executor", "debug", "--batch-runs", "1",
                       "--results-dir", str(results)],              # stdin closed (tests/warm.py)
                      stdout=warm.PIPE, stderr=warm.PIPE, text=True,
                      env={**os.environ, "FLCTL_HEARTBEAT": "0.5", "COLUMNS": "250"})
    try:
        wait_until(lambda: list((results / "records").glob("run_id=*/epoch=*.parquet")), "a cell training",
                   interval=0.1)
        if how == "delete the database":
            (results / "flctl.db").unlink()
        else:
            os.replace(results, tmp_path / "moved")
            results.write_text("a file")
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out + err
    assert "Traceback" not in err and "(Pdb)" not in out, out + err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "its workers stop and write no more" in errors[0], err
    if how == "delete the database":
        assert not (results / "flctl.db").exists()
    else:
        assert results.read_text() == "a file"


def test_a_wait_on_a_sweep_that_flctl_cancel_stopped_ends_with_one_line_and_130(tmp_path: Path) -> None:
    """`status --watch` (the wait of `sweep --wait` and `paper`) on a sweep whose workers `flctl cancel` stopped:
    its cells are handed back and no worker is left to take them, so the wait ends at once, with a line and 130
    (at 3623c99 it waited for ever, until killed)."""
    results = tmp_path / "results"
    args = ["--results-dir", str(results)]
    started = warm.run([*FLCTL, "sweep", "two-moons", "-m", "fl", "--seeds", "3", "--epochs", "4000",
                        "--eval-every", "50", "--workers", "2", "--threads", "1", "--executor", "local",
                        "--batch-runs", "1", *args],    # a cell a worker: two train, one waits
                       capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    watcher = warm.Popen([*FLCTL, "status", "--watch", *args], stdout=warm.PIPE, stderr=warm.PIPE, text=True,
                         env={**os.environ, "COLUMNS": "250"})
    sid, out, err = _cancel_while_two_train(watcher, results)
    assert watcher.returncode == 130, out + err
    assert [line for line in out.splitlines() if line.startswith("stopped:")] == \
        [f"stopped: sweep {sid}'s workers were stopped (`flctl cancel`, a signal); 2 cell(s) handed back, `flctl "
         "sweep` with the same axes resumes it"], out


def test_flctl_cancel_under_sweep_wait_is_told_on_stderr_as_what_it_did(tmp_path: Path) -> None:
    """`flctl cancel` stops every worker of a `sweep --wait`, the command's own too: it exits 130 with one line on
    stderr that says they all stopped (at 4402814 the line was on stdout and said the other workers went on)."""
    results = tmp_path / "results"
    args = ["--results-dir", str(results)]
    proc = subprocess.Popen([*FLCTL, "sweep", "two-moons", "-m", "fl", "--seeds", "3", "--epochs", "4000",
                             "--eval-every", "50", "--workers", "2", "--threads", "1", "--executor", "local",
                             "--batch-runs", "1", "--wait", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "COLUMNS": "250"})
    sid, out, err = _cancel_while_two_train(proc, results)
    assert proc.returncode == 130, out + err
    assert "stopped" not in out, out
    assert [line for line in err.splitlines() if line.startswith("stopped:")] == [
        f"stopped: sweep {sid}'s workers were stopped; their cells went back to the queue, and `flctl sweep` with "
        "the same axes resumes it"], err


def test_a_full_disk_under_a_two_worker_sweep_ends_in_one_line_and_the_sweep_resumes(tmp_path: Path) -> None:
    """A file size limit stands for the full disk (a ~2 MB checkpoint, 512 KiB allowed: the database and the records
    fit): each worker hands its cell back and stops, and the wait ends with one error line and exit 1, no cell left
    running. At 3623c99 this ended in a SQLAlchemy traceback with cells left running."""
    import resource
    import signal

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (512 * 1024, 512 * 1024))

    results = tmp_path / "results"
    args = ["sweep", "two-moons", "-m", "fl", "--seeds", "3", "--epochs", "30", "--eval-every", "10", "-o",
            "hidden=400", "--workers", "2", "--threads", "1", "--executor", "local", "--checkpoint-every", "0",
            "--results-dir", str(results)]
    full = subprocess.run([*FLCTL, *args, "--wait"], capture_output=True, text=True, timeout=300, preexec_fn=limited,
                          env={**os.environ, "COLUMNS": "250"})
    assert full.returncode == 1, full.stdout + full.stderr
    assert "Traceback" not in full.stdout + full.stderr
    errors = [line for line in full.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: the disk filled up under sweep "), full.stderr
    reader = Store.open(f"sqlite:///{results / 'flctl.db'}", readonly=True)
    assert not any(r.status == "running" for r in reader.list_runs())
    again = warm.run([*FLCTL, *args, "--wait"], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert {r.status for r in reader.list_runs()} == {"completed"}


@pytest.mark.parametrize("signum,code", [(2, 130), (15, 143)], ids=["SIGINT", "SIGTERM"])
def test_a_signal_ends_every_waiting_command_with_its_code(tmp_path: Path, signum: int, code: int) -> None:
    """SIGINT 130 and SIGTERM 143, as `flctl run` exits, for `sweep --wait` (its own worker hands its cell back) and
    `status --watch` alike, each with a line saying so (at 3623c99 status --watch ended with 130 for both, silently,
    and `sweep --wait` with 130 for SIGTERM)."""
    results = tmp_path / "results"
    args = ["--results-dir", str(results)]
    sweep = [*FLCTL, "sweep", "two-moons", "-m", "fl", "--seeds", "2", "--epochs", "4000", "--eval-every", "50",
             "--workers", "1", "--threads", "1", "--executor", "local", *args]
    waiting = subprocess.Popen([*sweep, "--wait"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watcher = None
    try:
        wait_until(lambda: _running(results) >= 1, "a cell training", interval=0.1)
        watcher = warm.Popen([*FLCTL, "status", "--watch", *args], stdout=warm.PIPE, stderr=warm.PIPE, text=True)
        # its first poll is done (its first line said): an event, not a sleep that a loaded machine outlasts
        wait_until(lambda: watcher.peek() or watcher.poll() is not None, "the watch's first line", interval=0.1)
        watcher.send_signal(signum)
        _, err = watcher.communicate(timeout=120)
        assert watcher.returncode == code and err.strip().endswith("interrupted (SIGINT)" if signum == 2 else
                                                                     "interrupted (SIGTERM)"), err
        waiting.send_signal(signum)
        out, err = waiting.communicate(timeout=120)
        assert waiting.returncode == code, out + err
        # its one worker was this process's: told on stderr that the sweep's workers stopped, and how it resumes
        assert "stopped: sweep " in err and "went back to the queue" in err and "stopped" not in out, out + err
        assert "Traceback" not in err
    finally:
        for p in (waiting, watcher):
            if p is not None and p.poll() is None:
                p.kill()


def test_ctrl_c_at_a_terminal_says_what_became_of_every_worker(tmp_path: Path) -> None:
    """A terminal's Ctrl-C reaches every process of its foreground group: `sweep --wait` and the local workers it
    started. The line then says that they all stopped and their cells went back (at e320564 it said "the other 1
    worker(s) go on" while none was left)."""
    results = tmp_path / "results"
    waiting = subprocess.Popen([*FLCTL, "sweep", "two-moons", "-m", "fl", "--seeds", "3", "--epochs", "4000",
                                "--eval-every", "50", "--workers", "2", "--threads", "1", "--executor", "local",
                                "--batch-runs", "1", "--wait", "--results-dir", str(results)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_until(lambda: _running(results) >= 2, "two cells training", interval=0.1)
        os.killpg(waiting.pid, signal.SIGINT)             # what a terminal does on Ctrl-C
        out, err = waiting.communicate(timeout=120)
    finally:
        if waiting.poll() is None:
            os.killpg(waiting.pid, signal.SIGKILL)
    assert waiting.returncode == 130, out + err
    said = [line for line in err.splitlines() if line.startswith("stopped:")]
    assert len(said) == 1 and "workers were stopped; their cells went back" in said[0] and "go on" not in said[0], err
    assert _running(results) == 0


def _cancel_while_two_train(waiting: subprocess.Popen, results: Path) -> tuple[str, str, str]:
    """`flctl cancel` the results folder's one sweep once two of its cells train, while ``waiting`` waits on it:
    (the sweep's id, what ``waiting`` printed on stdout and stderr once it ended)."""
    try:
        wait_until(lambda: _running(results) == 2, "two cells training", interval=0.1)
        [sid] = [p.name for p in (results / "jobs").iterdir()]
        cancelled = warm.run([*FLCTL, "cancel", sid, "--results-dir", str(results)], capture_output=True,
                             text=True, timeout=120)
        assert cancelled.returncode == 0, cancelled.stderr
        out, err = waiting.communicate(timeout=120)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    return sid, out, err


def _running(results: Path) -> int:
    """The cells running in the results folder's database (0 until the sweep has made it)."""
    from flctl.errors import StoreError

    try:
        store = Store.open(f"sqlite:///{results / 'flctl.db'}", readonly=True)
    except StoreError:
        return 0
    try:
        return sum(r.status == "running" for r in store.list_runs())
    finally:
        store.close()


def test_a_watch_with_the_database_named_elsewhere_needs_no_results_folder_here(tmp_path: Path) -> None:
    """`status --watch --db URL` from a folder with no results/ of its own: only the database is watched (the
    ground check must not take the missing ./results for a deleted one)."""
    results = tmp_path / "results"
    done = warm.run([*FLCTL, "sweep", "two-moons", "-m", "fl", "--seeds", "1", "--epochs", "3",
                     "--executor", "debug", "--results-dir", str(results)], capture_output=True, text=True,
                    timeout=120)
    assert done.returncode == 0, done.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("FLCTL_RESULTS", "FLCTL_DB")}
    out = warm.run([*FLCTL, "status", "--watch", "--db", f"sqlite:///{results / 'flctl.db'}"], cwd=elsewhere,
                   capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0 and "completed 1" in out.stdout, out.stdout + out.stderr
