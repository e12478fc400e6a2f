"""A sweep beside other processes of the same sweep: a `flctl sweep --wait` started beside a frozen worker (SIGSTOP:
its process alive, its worker file there, its cells going stale) takes the cells over within the stale bound and a
poll, says so in one line and ends with every cell done; the frozen worker, woken, writes nothing (its claims are
fenced). Real processes, real signals, a real SQLite file; the stale bound set small through FLCTL_STALE_AFTER."""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
import time
from pathlib import Path

import pytest

from flctl.db import Store
from flctl.procs import pid_alive
from tests import warm
from tests.helpers import bound, wait_until
from tests.test_concurrency import database_url
from tests.test_fencing import freeze_outside_a_write
from tests.test_scale_faults import NOOP

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
STALE_S = 3.0
AXES = ["two-moons", "-m", "erm", "--lr", "0.01,0.02", "--epochs", "300", "--eval-every", "10", "--workers", "1",
        "--batch-runs", "2", "--threads", "1"]


def env_of(results: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FLCTL_DB", "PYTHONPATH")}
    return env | {"FLCTL_RESULTS": str(results), "FLCTL_STALE_AFTER": f"{STALE_S:g}", "FLCTL_HEARTBEAT": "0.3",
                  "COLUMNS": "200"}


def rows(db: Path) -> dict[str, tuple]:
    with sqlite3.connect(db) as conn:
        return {r[0]: r[1:] for r in conn.execute("SELECT id, status, attempts, pid, claim_token, epochs_done, "
                                                  "heartbeat_at, finished_at FROM runs")}


def start_wait(env: dict[str, str]) -> warm.Popen:
    return warm.Popen([sys.executable, "-m", "flctl", "sweep", *AXES, "--wait"], stdout=warm.PIPE, stderr=warm.PIPE,
                      env=env, cwd=str(ROOT))


def said_at(proc: warm.Popen, word: str, timeout: float = 240) -> float:
    """The moment (time.monotonic) ``word`` appeared in ``proc``'s stdout, looked at every 20 ms."""
    deadline = time.monotonic() + bound(timeout)
    while word not in proc.peek():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate(5)
        time.sleep(0.02)
    return time.monotonic()


def records(results: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in (results / "records").rglob("*") if p.is_file()}


@pytest.mark.parametrize("when", ["still-beating", "already-stale"])
def test_a_waiting_sweep_takes_over_a_frozen_workers_cells_and_the_woken_worker_writes_nothing(
        tmp_path: Path, when: str) -> None:
    results = tmp_path / "results"
    db, env = results / "flctl.db", env_of(results)
    first = warm.run([sys.executable, "-m", "flctl", "sweep", *AXES], capture_output=True, env=env, timeout=300,
                     cwd=str(ROOT))
    assert first.returncode == 0, first.stdout + first.stderr
    # the background worker holds both cells (one group) and has trained some of them
    held = wait_until(lambda: db.exists() and {r[2] for r in rows(db).values() if r[0] == "running" and r[4]},
                      "the worker's claim", timeout=240, interval=0.05)
    [frozen] = held
    wait_until(lambda: records(results), "its first records", timeout=240, interval=0.05)
    wait = None
    try:
        if when == "still-beating":     # the wait is launched beside a worker that beats, and freezes after
            wait = start_wait(env)
            said_at(wait, "to do")
            assert {r[0] for r in rows(db).values()} == {"running"}, "the worker finished before it could freeze"
        freeze_outside_a_write(frozen, db)
        frozen_at = time.monotonic()
        if when == "already-stale":     # the wait is launched once the frozen worker's cells are stale
            time.sleep(STALE_S + 1)
            wait = start_wait(env)
        else:                           # the wait took them over within the stale bound and a poll, in one line
            took_over = said_at(wait, "took over")
            assert took_over - (frozen_at + STALE_S) < bound(2.0), took_over - frozen_at
        out, err = wait.communicate(bound(600))
        assert wait.returncode == 0, out + err
        assert "Traceback" not in err, err
        if when == "still-beating":
            [line] = [line for line in out.splitlines() if "took over" in line]
            assert "took over 2 cell(s) of a lost worker" in line and "2 re-queued" in line, out
        else:                           # the launch met them stale: re-queued, and a worker started for them
            assert "2 re-queued after a lost worker" in out and "already on it" not in out, out
        after = rows(db)
        assert {r[0] for r in after.values()} == {"completed"}, after
        assert {r[2] for r in after.values()} != {frozen} and {r[1] for r in after.values()} == {2}, after
        done = records(results)
        os.kill(frozen, signal.SIGCONT)      # woken: its claims are gone; it must write nothing
        wait_until(lambda: not pid_alive(frozen), "the woken worker to stop", timeout=bound(120), interval=0.1)
    finally:
        if pid_alive(frozen):
            os.kill(frozen, signal.SIGKILL)
        if wait is not None and wait.poll() is None:
            wait.kill()
    assert rows(db) == after and records(results) == done
    store = Store.open(f"sqlite:///{db}", readonly=True)
    assert len(store.list_runs()) == 2
    store.close()


# Two `flctl sweep` of one grid started at the same moment (two terminals, two job scripts), on PostgreSQL: each reads
# which runs exist and writes the others. Both must end well, with the grid recorded once.
AT_ONCE = r"""
import sys, time
at, args = float(sys.argv[1]), sys.argv[2:]
time.sleep(max(0.0, at - time.time()))
sys.argv = ["flctl", *args]
from flctl.__main__ import main
main()
"""


@pytest.fixture(scope="module")
def noop_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder for PYTHONPATH with test_scale_faults' launcher that starts no worker (its cells stay queued)."""
    site = tmp_path_factory.mktemp("noop-site")
    (site / "noop_launcher.py").write_text(NOOP)
    (info := site / "noop_launcher-0.1.dist-info").mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: noop-launcher\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[flctl.launchers]\nnoop = noop_launcher:Noop\n")
    return site


def test_two_launches_of_one_grid_at_once_on_postgresql_both_succeed(tmp_path: Path, noop_site: Path) -> None:
    url = database_url("postgresql", tmp_path)
    Store.open(url).close()
    args = ["sweep", "two-moons", "--lr", "1e-4..1:500", "--seeds", "10", "--executor", "noop", "--db", url]
    at = time.time() + 4            # both past their imports and plans, then the same second
    procs = [warm.Popen([sys.executable, "-c", AT_ONCE, str(at), *args],
                        env=env_of(tmp_path / f"r{i}") | {"PYTHONPATH": str(noop_site)}, stdout=warm.PIPE,
                        stderr=warm.PIPE, cwd=str(ROOT)) for i in range(2)]
    said = [p.communicate(bound(300)) for p in procs]
    for p, (out, err) in zip(procs, said):
        assert p.returncode == 0 and "Traceback" not in err, out + err
    added = sorted(int(out.split(" new,")[0].rsplit(" ", 1)[1]) for out, _ in said)
    assert added == [0, 5000], said          # the second found the first's rows
    store = Store.open(url)
    [row] = store.list_sweeps()
    assert row["cells"] == 5000, row
    assert len(store.list_runs()) == 5000
    store.close()
