"""A results folder is input: what flctl reads back from it (worker files, submitted jobs, the database) cannot
make it signal a process it did not start, pass a planted option to Slurm, stall a sweep, or change a file.

Signals that a regression could send to every process of the user (pid -1, 0) are only ever sent to a recording
stand-in for os.kill in this process; the other cases use real processes and real signals.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flctl.cli import app
from flctl.db import Store, poll_delays
from flctl.launch.cancel import cancel
from flctl.procs import process
from tests import warm
from tests.helpers import wait_until

# Slow (pyproject.toml's markers; `pytest -m "not slow"` is the fast loop): a populated results folder and the
# sweeps that read it back: 21 s of the suite's 904 s of test time (2 cores, xdist -n 2).
pytestmark = pytest.mark.slow

FLCTL = [sys.executable, "-m", "flctl"]
HOST = socket.gethostname()
SID = "abcdef123456"
runner = CliRunner()


def flctl(results: Path, *args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """`flctl *args` as a process forked warm (tests/warm.py); the workers it starts are real interpreters."""
    return warm.run([*FLCTL, *args, "--results-dir", str(results)], capture_output=True, timeout=timeout,
                    env={**os.environ, "COLUMNS": "200", **(env or {})})


def invoke(results: Path, *args: str):
    return runner.invoke(app, [*args, "--results-dir", str(results)], env={"COLUMNS": "200"})


def snapshot(root: Path) -> dict[str, str]:
    """Every file and folder under ``root``: a hash of its bytes (folders: 'dir')."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


def sweep_processes(results: Path) -> set[int]:
    """Live submitit controllers and job processes of sweeps under ``results``, from /proc: their command lines
    name a folder under results/jobs."""
    pids = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and (p := process(int(proc.name))) is not None:
            cmd = " ".join(p.cmdline)
            if "submitit." in cmd and str(results / "jobs") in cmd:
                pids.add(p.pid)
    return pids


@pytest.fixture
def leftovers(tmp_path: Path):
    """Whatever sweep process or `sleep` a test leaves behind (a failed test) is killed at its end."""
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for pid in sweep_processes(tmp_path):
        os.kill(pid, signal.SIGKILL)


def sleeper(leftovers: list) -> subprocess.Popen:
    """A live process of this user that no flctl command started."""
    proc = subprocess.Popen(["sleep", "60"])
    leftovers.append(proc)
    wait_until(lambda: (p := process(proc.pid)) is not None and p.cmdline[:1] == ("sleep",), interval=0.01)
    return proc


def plant(results: Path, name: str, content) -> Path:
    path = results / "jobs" / SID / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def empty_sweep(results: Path) -> Store:
    """A database holding sweep SID (no cells): enough for `flctl cancel SID` to look at its jobs folder."""
    results.mkdir(parents=True, exist_ok=True)
    store = Store.open(f"sqlite:///{results / 'flctl.db'}")
    store.create_sweep(SID, "planted", "two-moons", {}, [])
    return store


def forged(proc: subprocess.Popen) -> dict:
    """A worker file naming ``proc`` with what the OS says of it: what someone who can read /proc could write."""
    p = process(proc.pid)
    assert p is not None
    return {"host": HOST, "pid": p.pid, "job_id": None, "executor": "local", **p.identity()}


# ---- 2. worker and job files are validated before anything is signalled or run ----

def test_cancel_spares_a_live_process_that_planted_files_name(tmp_path: Path, leftovers) -> None:
    results = tmp_path / "results"
    empty_sweep(results).close()
    victim = sleeper(leftovers)
    plant(results, f"workers/{HOST}-{victim.pid}.json", {"host": HOST, "pid": victim.pid, "job_id": None,
                                                         "executor": "local"})
    plant(results, "workers/forged.json", forged(victim))
    plant(results, "workers/reused.json", forged(victim) | {"start_time": forged(victim)["start_time"] + 1})
    plant(results, "submitted.json", [{"executor": "local", "job_id": str(victim.pid), "host": HOST,
                                       **process(victim.pid).identity()}])

    out = flctl(results, "cancel", SID, "--timeout", "1")
    assert out.returncode == 0, out.stderr
    assert "nothing to cancel" in out.stdout, out.stdout
    assert victim.poll() is None                                       # neither SIGINT nor SIGKILL reached it
    warnings = out.stderr.strip().splitlines()
    assert warnings and all(w.startswith("warning: skipping ") for w in warnings), out.stderr
    assert any("does not say which process registered" in w for w in warnings), out.stderr
    assert any("not a process flctl started for this sweep" in w for w in warnings), out.stderr
    assert not (results / "jobs" / SID / "workers" / "reused.json").exists()     # its process is gone: removed


def test_cancel_never_signals_pid_minus_one_zero_or_one(tmp_path: Path, monkeypatch, capsys) -> None:
    results = tmp_path / "results"
    store = empty_sweep(results)
    for pid in (-1, 0, 1, "-1", True):
        plant(results, f"workers/{HOST}-{pid}.json", {"host": HOST, "pid": pid, "job_id": None, "executor": "local",
                                                      "start_time": 1, "cmdline": ["python", "-m", "flctl", "sweep"]})
    plant(results, "submitted.json", [{"executor": "local", "job_id": j, "host": HOST, "start_time": 1,
                                       "cmdline": ["python"]} for j in ("-1", "0", "1")])
    sent: list[tuple[int, int]] = []
    real_kill = os.kill

    def kill(pid: int, sig: int) -> None:       # records; only the harmless probe of a real pid goes through
        sent.append((pid, sig))
        if sig == 0 and isinstance(pid, int) and pid > 1:
            real_kill(pid, 0)

    monkeypatch.setattr(os, "kill", kill)
    outcome = cancel(store, results, SID, timeout=0.2)
    res = runner.invoke(app, ["cancel", SID, "--timeout", "0.2", "--results-dir", str(results)])
    assert res.exit_code == 0, res.output
    assert [s for s in sent if not (isinstance(s[0], int) and s[0] > 1)] == []
    assert outcome["stopped"] == [] and outcome["killed"] == []
    assert "skipping worker file" in capsys.readouterr().err + res.stderr


def test_a_planted_job_id_never_reaches_scancel(tmp_path: Path, monkeypatch, capsys) -> None:
    results = tmp_path / "results"
    store = empty_sweep(results)
    plant(results, "submitted.json", [{"executor": "slurm", "job_id": j, "host": HOST}
                                      for j in ("--user=alice", "12345_0", "12345_1", "-1", "7;rm", "12346_[0-3%2]")])
    calls: list[list[str]] = []

    def run(argv, **_kwargs):
        calls.append(list(argv))
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(subprocess, "run", run)
    cancel(store, results, SID, timeout=0.2)
    scancel = [c for c in calls if c[0] == "scancel"]
    assert scancel and all(c[-2:] == ["12345", "12346"] for c in scancel), calls   # real ids go on as before
    assert not any(arg in ("--user=alice", "-1", "7;rm") for c in calls for arg in c), calls
    err = capsys.readouterr().err
    assert err.count("is not a Slurm job id") == 3 and all(len(line) < 300 for line in err.splitlines()), err


def test_the_jobs_folder_is_private_and_a_linked_one_is_refused(tmp_path: Path) -> None:
    results = tmp_path / "results"
    (results / "jobs").mkdir(parents=True)
    (results / "jobs").chmod(0o755)                                     # as an older flctl left it
    res = invoke(results, "sweep", "two-moons", "-m", "erm", "--epochs", "1", "--executor", "debug")
    assert res.exit_code == 0, res.output
    [sid] = [p.name for p in (results / "jobs").iterdir()]
    for folder in (results / "jobs", results / "jobs" / sid, results / "jobs" / sid / "workers"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "jobs").symlink_to(elsewhere)
    res = invoke(linked, "sweep", "two-moons", "-m", "erm", "--epochs", "1", "--executor", "debug")
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and "not a folder of this user" in lines[0], res.output
    assert list(elsewhere.iterdir()) == []


# ---- 6. a launch is recorded before `flctl sweep` returns; planted files do not count as workers ----

def test_cancel_right_after_sweep_returns_stops_the_sweep(tmp_path: Path, leftovers) -> None:
    # Each job process sleeps 5 s before Python runs it, so `flctl cancel` certainly comes before any worker
    # has registered its file: all it can go by is what `flctl sweep` recorded of its launch. A SIGINT in that
    # sleep ends the process, as it would a worker still starting (Python reports an exception raised in
    # sitecustomize and goes on, which would let the worker train to the end). The handler is set here because a
    # process started in the background of a non-interactive shell (`bash .ci/run &`) inherits SIGINT ignored.
    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text(
        "import os, signal, time\n"
        "if b'submitit.core._submit' in open(f'/proc/{os.getpid()}/cmdline', 'rb').read():\n"
        "    signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "    try:\n"
        "        time.sleep(5)\n"
        "    except KeyboardInterrupt:\n"
        "        os._exit(130)\n")
    results = tmp_path / "results"
    out = flctl(results, "sweep", "two-moons", "-m", "fl", "--seed", "0,1", "--epochs", "3000", "--workers", "2",
                "--threads", "1", "--executor", "local", env={"PYTHONPATH": str(slow)})
    assert out.returncode == 0, out.stderr
    [sid] = [p.name for p in (results / "jobs").iterdir()]
    assert not list((results / "jobs" / sid).glob("workers/*.json"))      # no worker has registered yet

    res = invoke(results, "cancel", sid, "--json")
    assert res.exit_code == 0, res.output
    outcome = json.loads(res.stdout)
    # the two job processes, found through their jobs (seen once in CI to find one: the launch's record is in the
    # message if it happens again)
    assert len(outcome["stopped"]) == 2, (outcome, out.stdout,
                                          (results / "jobs" / sid / "submitted.json").read_text(errors="replace"))
    assert not sweep_processes(results)
    statuses = [r.status for r in Store.open(f"sqlite:///{results / 'flctl.db'}", readonly=True).list_runs()]
    assert sorted(statuses) == ["queued", "queued"], statuses


def test_a_job_controller_is_recorded_as_the_program_it_execs_not_as_it_was_before(tmp_path: Path) -> None:
    # The H100's red `cancel right after sweep`: submitted.json held a controller with "cmdline": [] (read while it
    # was in execve), so `flctl cancel` found one of its two jobs. Here the window is stretched: the child forked by
    # this process stays this process's program for 0.3 s before it execs the command a local job controller runs
    # (the command line of a process in execve reads empty for a moment, of one forked its parent's). What is
    # recorded must be the command it runs from then on, so that the controller is found afterwards.
    from types import SimpleNamespace

    from flctl.launch.jobs import live_controllers, private_folder, remember_jobs
    from flctl.layout import Layout

    root = tmp_path / "results"
    root.mkdir()
    folder = private_folder(root, Layout(root).sweep_jobs(SID))
    cmd = [sys.executable, "-c", "import time; time.sleep(30)", "-m", "submitit.local._local", str(folder)]
    pid = os.fork()
    if pid == 0:                                   # the child: exec late, as a slow execve would
        try:
            time.sleep(0.3)
            os.execv(cmd[0], cmd)
        finally:
            os._exit(1)
    try:
        remember_jobs(Layout(root).submitted(SID), "local", [SimpleNamespace(job_id=str(pid))])
        [entry] = json.loads(Layout(root).submitted(SID).read_text())
        assert entry["cmdline"] == cmd
        assert [p.pid for p in live_controllers(root, SID)] == [pid]
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_planted_worker_files_do_not_stall_sweep_wait(tmp_path: Path, leftovers) -> None:
    results = tmp_path / "results"
    args = ("sweep", "two-moons", "-m", "erm,fl", "--epochs", "2", "--workers", "2", "--threads", "1",
            "--executor", "local")
    plan = invoke(results, *args, "--dry-run")
    assert plan.exit_code == 0, plan.output
    sid = plan.stdout.split("sweep ", 1)[1].split(":", 1)[0]
    victim = sleeper(leftovers)
    workers = results / "jobs" / sid / "workers"
    workers.mkdir(parents=True)
    (workers / f"{HOST}-{victim.pid}.json").write_text(json.dumps(forged(victim)))
    (workers / "second.json").write_text(json.dumps(forged(victim) | {"start_time": 1}))

    out = flctl(results, *args, "--wait", timeout=90)           # before: no worker started, and it waited forever
    assert out.returncode == 0, out.stdout + out.stderr
    assert "already on it" not in out.stdout, out.stdout
    runs = json.loads(flctl(results, "runs", "--json").stdout)
    assert [r["status"] for r in runs] == ["completed", "completed"]
    assert victim.poll() is None


# ---- 7. read commands read; a foreign database is left alone ----

@pytest.fixture(scope="module")
def populated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results folder made by real commands in their own processes (so none keeps the database open): a run and
    a finished sweep. SQLite removed its -wal file as the last connection closed."""
    root = tmp_path_factory.mktemp("populated") / "results"
    for args in (("run", "two-moons", "--epochs", "2"),
                 ("sweep", "two-moons", "-m", "erm,fl", "--epochs", "2", "--executor", "debug", "--name", "moons")):
        out = flctl(root, *args)
        assert out.returncode == 0, out.stderr
    assert not (root / "flctl.db-wal").exists()
    return root


READS = [("runs",), ("runs", "--json"), ("show", "{run}"), ("status",), ("status", "moons", "--json"), ("sweeps",),
         ("report", "--table", "main", "--task", "two-moons"), ("report", "--table", "runs"),
         ("report", "--samples", "violators", "--task", "two-moons", "--out", "{out}"), ("cancel", "moons"),
         ("sweep", "two-moons", "-m", "erm,fl", "--epochs", "2", "--dry-run")]   # (--out: outputs go elsewhere)


@pytest.mark.parametrize("journal", ["wal", "delete"])
def test_read_commands_leave_the_results_folder_as_it_was(populated: Path, tmp_path: Path, journal: str) -> None:
    run_id = json.loads(invoke(populated, "runs", "--json").stdout)[0]["id"]
    for args in READS:
        results = tmp_path / "-".join(args)[:40] / "results"
        shutil.copytree(populated, results)
        with sqlite3.connect(results / "flctl.db") as conn:      # the file's own mode, kept in its header
            assert conn.execute(f"PRAGMA journal_mode={journal}").fetchone() == (journal,)
        conn.close()
        before = snapshot(results)
        res = invoke(results, *(a.format(run=run_id, out=tmp_path / "violators.parquet") for a in args))
        assert res.exit_code == 0, (args, res.output)
        assert snapshot(results) == before, args


def test_a_reader_sees_a_writer_and_never_the_file_change_under_it(populated: Path, tmp_path: Path) -> None:
    from sqlalchemy import func, select

    from flctl.db.schema import Run
    from tests.helpers import config

    results = tmp_path / "results"
    shutil.copytree(populated, results)
    url = f"sqlite:///{results / 'flctl.db'}"
    reader = Store.open(url, readonly=True)
    known = {r.id for r in reader.list_runs()}
    with reader.session() as s:                            # a read in progress, on the file as it is
        assert s.scalar(select(func.count()).select_from(Run)) == len(known)
        assert not (results / "flctl.db-wal").exists()
        before = (results / "flctl.db").read_bytes()
        writer = Store.open(url)
        writer.add_runs([config("two-moons", "erm", seed=7)])
        writer.close()                                     # the last connection: it would checkpoint into the file
        assert (results / "flctl.db").read_bytes() == before
        assert s.scalar(select(func.count()).select_from(Run)) == len(known)
    assert (results / "flctl.db-wal").exists()             # the new run waits in the -wal file, and is read there
    assert len({r.id for r in reader.list_runs()} - known) == 1
    reader.close()


def test_a_foreign_sqlite_database_is_never_modified(tmp_path: Path) -> None:
    foreign = tmp_path / "notes.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.execute("INSERT INTO notes VALUES ('mine')")
    conn.close()
    before = foreign.read_bytes()
    assert before[18:20] == b"\x01\x01"                        # a rollback journal
    for args in (["run", "two-moons", "--epochs", "1"], ["runs"], ["sweeps"]):
        res = runner.invoke(app, [*args, "--db", f"sqlite:///{foreign}"])
        lines = res.stderr.strip().splitlines()
        assert res.exit_code == 2 and len(lines) == 1 and "not an flctl database" in lines[0], res.output
        assert foreign.read_bytes() == before, args
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith("notes")] == ["notes.db"], args


def test_a_wait_looks_often_at_first_then_every_interval() -> None:
    delays = list(itertools.islice(poll_delays(0.2), 8))
    assert delays == pytest.approx([0.02, 0.03, 0.045, 0.0675, 0.10125, 0.151875, 0.2, 0.2])
    assert next(poll_delays(0.01)) == 0.01                  # never longer than the interval asked for


def test_the_tests_of_a_module_fixture_share_one_worker(populated: Path, request: pytest.FixtureRequest) -> None:
    # conftest groups them for xdist so that the folder is built once; pytest 9.2 silently undid such groups (and the
    # Slurm tests'), so this checks that the group reached xdist.
    if os.environ.get("PYTEST_XDIST_WORKER") and request.config.getvalue("loadgroup"):
        assert request.node.nodeid.endswith("@fixture:test_results_folder.py"), request.node.nodeid
