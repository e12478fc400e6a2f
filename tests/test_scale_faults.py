"""Faults and bad input against issue 68's change (sweeps that grow without the orchestrator growing): the claim
through ix_runs_claim, one heartbeat statement a worker, the Optuna mirror's own lock and sweep_cells.mirrored, the
ledger counted in SQL, planning in bulk up to 100,000 cells, two-moons' layers in extras.npz, PgBouncer, and the
benchmarks' arguments. Written from outside: each test is one case a user or a hostile environment makes, on real
SQLite files, the real PostgreSQL (FLCTL_TEST_PG) and PgBouncer (FLCTL_TEST_PGBOUNCER), and real `python -m flctl`
processes (warm forks, tests/warm.py). A case flctl does not handle cleanly is xfail(strict=True) with the defect in
its reason: it turns green (and then fails as XPASS) once fixed.

Verdicts in short: a case passes when what a person sees is one line (exit 2 for bad input), nothing half-written,
and re-running the command finishes the job."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import text, update

from flctl.config import RunConfig
from flctl.db import RunQueue, Store
from flctl.db.liveness import db_now
from flctl.db.schema import Run
from flctl.status import Status
from tests import warm
from tests.helpers import bound, config, in_process
from tests.test_concurrency import bouncer_database, database_url

ROOT = Path(__file__).resolve().parents[1]
SID = "faultsweep01"

# A launcher that starts nothing (an installed one, as tests/test_launchers.py installs its toy): `flctl sweep`
# plans, records and syncs as ever, and its cells stay queued, so a test sees the plan's write alone.
NOOP = '''
from flctl.launch.backends import Launcher


class Noop(Launcher):
    """Starts no worker."""

    name = "noop"

    def slots(self, cells, device, *, workers, threads, per_gpu):
        return []

    def start(self, worker, slots, folder, log):
        return []
'''


@pytest.fixture(scope="module")
def noop_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("noop-site")
    (site / "noop_launcher.py").write_text(NOOP)
    info = site / "noop_launcher-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: noop-launcher\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[flctl.launchers]\nnoop = noop_launcher:Noop\n")
    return site


def env_of(results: Path, site: Path | None = None, **more: str) -> dict[str, str]:
    """A flctl process's environment: its own results folder, no FLCTL_DB, the noop launcher where ``site``."""
    env = {k: v for k, v in os.environ.items() if k not in ("FLCTL_DB", "PYTHONPATH")}
    env.update(FLCTL_RESULTS=str(results), COLUMNS="200", **more)
    if site is not None:
        env["PYTHONPATH"] = str(site)
    return env


def flctl(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m flctl *args` as its own (warm) process."""
    return warm.run([sys.executable, "-m", "flctl", *args], capture_output=True, env=env, timeout=timeout,
                    cwd=str(ROOT))


def one_line(stderr: str) -> str:
    """The one line a bad input gets; fails on a traceback or on several lines."""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def cells(n: int, start: int = 0, **overrides) -> list[RunConfig]:
    base = config("two-moons", "erm", **{"epochs": 1, **overrides})
    return [dataclasses.replace(base, lr=1e-6 * (1 + i)) for i in range(start, start + n)]


def sweep(store: Store, cfgs: list[RunConfig], sid: str = SID) -> list[str]:
    store.create_sweep(sid, sid, "two-moons", {}, cfgs)
    return sorted(c.run_id for c in cfgs)


def set_rows(store: Store, ids: list[str], **values) -> None:
    store.write(lambda s: s.execute(update(Run).where(Run.id.in_(ids)).values(**values)))


def finish(queue: RunQueue, run_id: str, value: float = 1.0) -> None:
    token = queue.claim_run(run_id)
    assert token
    queue.finish_run(run_id, token, status="completed", epochs_done=1, metrics={"train.avg_loss": value},
                     diverged_at=None, lambda_capped=0, artifacts={}, duration_s=1.0)


def wait_for(proc: warm.Popen, word: str, timeout: float = 120) -> str:
    """What ``proc`` printed once ``word`` is in it (its stdout); fails if it ends first."""
    deadline = time.monotonic() + timeout
    while word not in (said := proc.peek()):
        if proc.poll() is not None or time.monotonic() > deadline:
            out, err = proc.communicate(5)
            raise AssertionError(f"no {word!r} (exit {proc.returncode}):\n{out}\n{err}")
        time.sleep(0.02)
    return said


def no_traceback(stderr: str) -> None:
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr


# --------------------------------------------------------------------------------------------------------------
# Pipes: a long ledger or list cut short by `head -1` (BrokenPipe): quiet, no traceback.

@pytest.fixture(scope="module")
def big_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A SQLite database with a sweep of 20,000 queued cells and 250 empty sweeps (a list longer than one screen)."""
    path = tmp_path_factory.mktemp("big") / "flctl.db"
    store = Store.open(f"sqlite:///{path}")
    for k in range(250):
        store.create_sweep(f"{k:012x}", f"empty{k}", "two-moons", {}, [])
    store.create_sweep("big000000001", "big", "two-moons", {}, cells(20_000))
    store.close()
    return f"sqlite:///{path}"


@pytest.mark.parametrize("args", [["status", "big"], ["status", "big", "--json"], ["sweeps"], ["sweeps", "--json"],
                                  ["runs", "--json"]], ids=lambda a: "-".join(a))
def test_a_long_read_piped_into_head_ends_quietly(big_db: str, tmp_path: Path, args: list[str]) -> None:
    line = " ".join([sys.executable, "-m", "flctl", *args, "--db", big_db])
    res = subprocess.run(["bash", "-c", f"{line} 2>{tmp_path / 'err'} | head -1; exit ${{PIPESTATUS[0]}}"],
                         capture_output=True, text=True, timeout=300, env=env_of(tmp_path / "r"))
    err = (tmp_path / "err").read_text()
    no_traceback(err)
    assert res.returncode in (0, 1) and not err.strip(), (res.returncode, err)
    assert len(res.stdout.splitlines()) == 1


def test_a_dry_run_of_20000_cells_piped_into_head_ends_quietly_and_writes_nothing(tmp_path: Path) -> None:
    results = tmp_path / "results"
    line = f"{sys.executable} -m flctl sweep two-moons --lr 1e-4..1:200 --seeds 100 --dry-run --yes"
    res = subprocess.run(["bash", "-c", f"{line} 2>{tmp_path / 'err'} | head -1; exit ${{PIPESTATUS[0]}}"],
                         capture_output=True, text=True, timeout=300, env=env_of(results), cwd=tmp_path)
    err = (tmp_path / "err").read_text()
    no_traceback(err)
    assert res.returncode in (0, 1) and "20000 runs" in res.stdout, (res.stdout, err)
    assert not results.exists()


# --------------------------------------------------------------------------------------------------------------
# Bad input: exit 2, one line, nothing written.

@pytest.mark.parametrize("axes", [["--lr", "1e-4..1:9091", "--seeds", "11", "--yes"],      # 100,001 cells
                                  ["--lr", "1e-4..1:0"], ["--lr", "1e-4..1:-5"], ["--lr", "1e-4..1:1e9"],
                                  ["--lr", "1e-4..1:10001"], ["--lr", "1e-4..nan:3"]], ids=lambda a: " ".join(a))
def test_a_grid_over_the_limit_or_a_bad_axis_is_one_line_and_writes_nothing(tmp_path: Path, noop_site: Path,
                                                                              axes: list[str]) -> None:
    results = tmp_path / "results"
    res = flctl("sweep", "two-moons", *axes, "--executor", "noop", env=env_of(results, noop_site))
    assert res.returncode == 2, res.stdout + res.stderr
    assert one_line(res.stderr).startswith("error: ")
    assert not results.exists()


@pytest.mark.parametrize("flag", [["--batch-runs", "0"], ["--batch-runs", "-3"], ["--workers", "0"]],
                         ids=lambda f: " ".join(f))
def test_a_grouped_launch_with_a_bad_count_is_one_line_and_writes_nothing(tmp_path: Path, flag: list[str]) -> None:
    results = tmp_path / "results"
    res = flctl("sweep", "two-moons", "--lr", "0.1,0.2", *flag, env=env_of(results))
    assert res.returncode == 2 and flag[0] in one_line(res.stderr), res.stderr
    assert not results.exists()


@pytest.mark.parametrize("variable,value", [("FLCTL_STALE_AFTER", "-5"), ("FLCTL_HEARTBEAT", "0"),
                                            ("FLCTL_STALE_AFTER", "soon")])
def test_a_bad_stale_bound_or_heartbeat_in_the_environment_is_one_line(big_db: str, tmp_path: Path, variable: str,
                                                                       value: str) -> None:
    """The bounds a claim takes lost workers' cells back by, and a worker's beat, read from the environment."""
    res = flctl("status", "big", "--db", big_db, env=env_of(tmp_path / "r", **{variable: value}))
    assert res.returncode == 2 and variable in one_line(res.stderr), res.stderr


def test_a_closed_database_port_is_one_line_within_seconds(tmp_path: Path) -> None:
    """A URL whose port nobody listens on (a PgBouncer that is down): how long until the error, and what it says."""
    if not os.environ.get("FLCTL_TEST_PGBOUNCER"):
        pytest.skip("no PgBouncer")
    import socket

    with socket.socket() as s:           # a port that was free a moment ago
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    res = flctl("status", "--db", f"postgresql://postgres@127.0.0.1:{port}/flctl", env=env_of(tmp_path / "r"))
    took = time.monotonic() - started
    assert res.returncode == 2 and "Connection refused" in one_line(res.stderr), res.stderr
    assert took < bound(15), took


def test_a_database_name_pgbouncer_cannot_route_is_one_line(tmp_path: Path) -> None:
    bouncer = os.environ.get("FLCTL_TEST_PGBOUNCER")
    if not bouncer:
        pytest.skip("no PgBouncer")
    res = flctl("sweeps", "--db", bouncer.rsplit("/", 1)[0] + "/no_such_database_68", env=env_of(tmp_path / "r"))
    assert res.returncode == 2 and 'database "no_such_database_68" does not exist' in one_line(res.stderr)


@pytest.mark.parametrize("threshold", ["5", "0"])
def test_a_url_that_asks_pgbouncer_for_prepared_statements_still_claims_and_beats(tmp_path: Path,
                                                                                  threshold: str) -> None:
    """`--db ...?prepare_threshold=5` (psycopg would prepare a statement on the server after 5 runs; PgBouncer in
    transaction pooling cannot route it): flctl's own setting must win, over many claims and beats."""
    url = bouncer_database() + f"?prepare_threshold={threshold}"
    store = Store.open(url)
    ids = sweep(store, cells(40))
    queue = RunQueue(store)
    held: dict[str, str] = {}
    for _ in range(30):
        [claim] = queue.claim_next(SID, max_attempts=3, held=held)
        assert queue.beat(held) == set(held)
    assert len(held) == 30 and set(held) <= set(ids)
    with store.engine.connect() as conn:          # flctl's own setting, not the URL's
        assert conn.connection.dbapi_connection.prepare_threshold is None
    store.close()


# The benchmarks' arguments are input too: a bad one is argparse's one line and exit 2, before any work.
BENCH_CASES = [
    ("bench_scale.py", ["--sizes", "0"], True),
    ("bench_scale.py", ["--workers", "-1"], True),
    ("bench_scale.py", ["--backend", "nosuch"], True),
    ("bench_reads.py", ["--cells", "500"], True),
    ("bench_pace.py", ["--sizes", "0", "0"], True),
    ("bench_mirror.py", ["--cells", "0"], True),
    ("bench_mirror.py", ["--cells", "-3"], True),
    ("bench_mirror.py", ["--new", "0"], True),
    ("bench_mirror.py", ["--repeats", "0", "--cells", "10", "--new", "1"], True),
    ("bench_reads.py", ["--repeats", "0", "--cells", "1000", "status"], True),
]


@pytest.mark.parametrize("script,args,clean", [
    pytest.param(s, a, c, marks=[] if c is True else pytest.mark.xfail(strict=True, reason=c))
    for s, a, c in BENCH_CASES], ids=[f"{s}{' '.join(a)}" for s, a, _ in BENCH_CASES])
def test_a_benchmarks_bad_argument_is_one_line_and_exit_2(tmp_path: Path, script: str, args: list[str],
                                                           clean) -> None:
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args, "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env_of(tmp_path / "r"))
    assert res.returncode == 2, res.stderr[-2000:]
    assert "Traceback" not in res.stderr and res.stderr.strip().splitlines()[-1].startswith(script.replace(".py", ""))
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------------------------------------------
# Signals to `flctl sweep` while it writes a plan of 100,000 cells: the sweep is whole or absent, and the same
# command again finishes it.

GRID_100K = ["two-moons", "--lr", "1e-4..1:10000", "--seeds", "10", "--yes"]


def wal_growing(db: Path, size: int = 1 << 20) -> bool:
    wal = Path(f"{db}-wal")
    return wal.exists() and wal.stat().st_size > size


def as_in_a_terminal() -> None:
    """A child's signals as a terminal leaves them: SIGINT not ignored (a test run in the background has it ignored,
    and flctl keeps a SIGINT that is ignored so: `flctl sweep ... &`)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_during_the_bulk_write_of_100000_cells_leaves_the_sweep_whole_or_absent(
        tmp_path: Path, noop_site: Path, sig: signal.Signals) -> None:
    results = tmp_path / "results"
    env = env_of(results, noop_site)
    url = f"sqlite:///{results / 'flctl.db'}"
    log = tmp_path / "out"
    with open(log, "w") as out:      # a real interpreter: its signal dispositions are the terminal's
        proc = subprocess.Popen([sys.executable, "-m", "flctl", "sweep", *GRID_100K, "--executor", "noop"], env=env,
                                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, preexec_fn=as_in_a_terminal)
    deadline = time.monotonic() + 300
    while "planning: 100,000 of 100,000 cells" not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    deadline = time.monotonic() + 120            # the rows are going in: the plan's one transaction is open
    while not wal_growing(results / "flctl.db") and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(sig)
    proc.wait(120)
    said = log.read_text()
    no_traceback(said)
    expected = {signal.SIGTERM: 143, signal.SIGINT: 130, signal.SIGHUP: 129}[sig]
    # it came while the rows went in; on a loaded machine it may land once the launch is done (exit 0): then the
    # sweep must be whole, as below
    assert proc.returncode in (expected, 0), said
    if proc.returncode > 0:
        assert said.strip().splitlines()[-1] == f"flctl: interrupted ({sig.name})", said
    store = Store.open(url)
    with store.session() as s:
        found = tuple(s.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()
                      for table in ("runs", "sweep_cells", "sweeps"))
    store.close()
    assert found in ((0, 0, 0), (100_000, 100_000, 1)), found
    again = flctl("sweep", *GRID_100K, "--executor", "noop", env=env, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    store = Store.open(url)
    [row] = store.list_sweeps()
    assert row["cells"] == 100_000 and store.sweep_counts(row["id"]).states == {"fl": {"queued": 100_000}}
    store.close()


# --------------------------------------------------------------------------------------------------------------
# Signals to a sweep's worker between its claim and its training.

# A sweep's worker (flctl.launch.worker.Worker, as a local job runs it) that stops after its claim, before it trains,
# until the file ``go`` is there.
HELD_WORKER = r"""
import os, sys, time
import flctl.launch.worker as w
from flctl.launch.backends import Slot
from flctl.launch.recipe import WorkerRecipe
url, root, sid, go = sys.argv[1:5]
real = w.train_claimed
def held_then_train(cfgs, tokens, *args, **kw):
    print("claimed " + " ".join(sorted(tokens)), flush=True)
    while not os.path.exists(go):
        time.sleep(0.02)
    return real(cfgs, tokens, *args, **kw)
w.train_claimed = held_then_train
worker = w.Worker(WorkerRecipe(url, root, sid, executor="local", batch_runs=1, sync_study=False))
worker(Slot(0, threads=1))
print("stopped", worker.stopped, flush=True)
sys.exit(worker.stopped or 0)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP],
                         ids=lambda s: s.name)
def test_a_signal_between_a_workers_claim_and_its_training_leaves_no_cell_held(tmp_path: Path,
                                                                               sig: signal.Signals) -> None:
    results = tmp_path / "results"
    results.mkdir()
    url = f"sqlite:///{results / 'flctl.db'}"
    store = Store.open(url)
    ids = sweep(store, cells(2, epochs=3))
    proc = warm.Popen([sys.executable, "-c", HELD_WORKER, url, str(results), SID, str(tmp_path / "go")],
                      env=env_of(results), stdout=warm.PIPE, stderr=warm.PIPE)
    [held] = wait_for(proc, "claimed").split("claimed ")[1].split()
    proc.send_signal(sig)
    (tmp_path / "go").touch()
    out, err = proc.communicate(120)
    no_traceback(err)
    run = store.get_run(held)
    # handed back before it trained (SIGHUP as SIGTERM: a closed terminal): interrupted, the attempt not counted
    assert proc.returncode in (0, 128 + sig), out + err
    assert (run.status, run.attempts, run.epochs_done) == (Status.INTERRUPTED, 0, 0), \
        (run.status, run.attempts, run.epochs_done, run.error)
    queue = RunQueue(store)           # another worker of this host takes both, at once: nothing waits for a bound
    taken = [c.cfg.run_id for _ in range(2) for c in queue.claim_next(SID, max_attempts=3)]
    assert sorted(taken) == ids and queue.claim_next(SID, max_attempts=3) == []
    store.close()


# Inside a heartbeat's transaction (its UPDATE sent, not committed), frozen; a KeyboardInterrupt there is caught
# and the process lives on (an API user's Ctrl-C): its transaction must be rolled back, no lock kept.
IN_BEAT = r"""
import signal, sys, time
from sqlalchemy import event
from flctl.db import RunQueue, Store
url, sid = sys.argv[1:3]
signal.signal(signal.SIGINT, signal.default_int_handler)     # as in a terminal (a test's may have it ignored)
store = Store.open(url)
queue = RunQueue(store)
held = {}
queue.claim_next(sid, max_attempts=3, held=held)
def hold(conn, cursor, statement, *rest):
    if statement.lstrip().upper().startswith("UPDATE RUNS SET") and "HEARTBEAT_AT" in statement.upper():
        print("in-beat", flush=True)
        time.sleep(3600)
event.listen(store.engine, "after_cursor_execute", hold)
try:
    queue.beat(held, dict.fromkeys(held, 7))
except KeyboardInterrupt:
    print("caught", flush=True)
time.sleep(3600)
"""


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_ctrl_c_inside_a_heartbeat_rolls_it_back_and_keeps_no_lock(tmp_path: Path, backend: str) -> None:
    url = database_url(backend, tmp_path)
    store = Store.open(url)
    sweep(store, cells(3))
    proc = warm.Popen([sys.executable, "-c", IN_BEAT, url, SID], stdout=warm.PIPE, stderr=warm.PIPE)
    try:
        wait_for(proc, "in-beat")
        proc.send_signal(signal.SIGINT)
        wait_for(proc, "caught")
        if backend == "sqlite":       # a writer of its own that waits 2 s at most (a Store's waits 4 minutes)
            other = sqlite3.connect(str(tmp_path / "flctl.db"), timeout=2)
            try:
                other.execute("BEGIN IMMEDIATE")
                other.rollback()
            finally:
                other.close()
        started = time.monotonic()
        got = RunQueue(store).claim_next(SID, max_attempts=3)          # a writer goes on at once
        assert got and time.monotonic() - started < bound(5)
        [beaten] = [r for r in store.list_runs() if r.status == Status.RUNNING and r.pid == proc.pid]
        assert beaten.epochs_done == 0                                 # the beat was not written
    finally:
        proc.kill()
        proc.wait(30)
    store.close()


# --------------------------------------------------------------------------------------------------------------
# The Optuna mirror killed or stopped in the middle.

def finished_sweep(url: str, n: int, sid: str = SID, start: int = 0) -> tuple[Store, list[str]]:
    """A sweep of ``n`` cells, every one completed (written directly: what a mirror reads)."""
    store = Store.open(url)
    ids = sweep(store, cells(n, start=start), sid)
    with store.session() as s:
        stamp = db_now(s)
    set_rows(store, ids, status=Status.COMPLETED, metrics={"train.avg_loss": 0.5}, finished_at=stamp,
             duration_s=1.0, epochs_done=1, attempts=1)
    return store, ids


def mirror_state(store: Store, url: str, sid: str = SID) -> tuple[list[str], set[str]]:
    """The run ids of the study's trials (each as often as it is there) and the cells marked mirrored."""
    import optuna

    from flctl.db import existing_storage

    storage = existing_storage(url)
    try:
        trials = optuna.load_study(study_name=f"flctl-{sid}", storage=storage).get_trials(deepcopy=False)
    except KeyError:
        trials = []
    finally:
        storage.engine.dispose()
    with store.session() as s:
        marked = set(s.scalars(text("SELECT run_id FROM sweep_cells WHERE mirrored AND sweep_id = :sid"),
                               {"sid": sid}))
    return sorted(t.user_attrs["run_id"] for t in trials), marked


# A mirror (flctl.study.sync_sweep, as `flctl sweep` calls it) that stops at ``where``: SIGSTOP there ("stop") or a
# sleep a signal ends ("hold"). flctl's handlers turn SIGTERM into KeyboardInterrupt, as in a command.
MIRROR = r"""
import os, signal, sys, time
import sqlalchemy
from sqlalchemy import event
import flctl.cli
from flctl.db import Store
from flctl.study import sync_sweep
url, sid, where, how = sys.argv[1:5]
signal.signal(signal.SIGTERM, flctl.cli._interrupt)
store = Store.open(url)
held = []
def hold(conn, cursor, statement, *rest):
    s = " ".join(statement.split()).upper()
    if not held and ((where == "write" and s.startswith("INSERT INTO TRIALS")) or
                     (where == "read" and s.startswith("SELECT") and "MIRRORED" in s and "LIMIT" in s)):
        held.append(1)
        print("in-" + where, flush=True)
        if how == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        else:
            time.sleep(3600)
event.listen(sqlalchemy.engine.Engine, "after_cursor_execute", hold)
print("added", sync_sweep(store, url, sid), flush=True)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGHUP, marks=pytest.mark.slow), signal.SIGKILL],
                         ids=lambda s: s.name)
def test_a_mirror_killed_inside_its_trials_write_leaves_no_trial_twice_and_none_lost(tmp_path: Path,
                                                                                     sig: signal.Signals) -> None:
    url = database_url("sqlite", tmp_path)
    store, ids = finished_sweep(url, 600)                  # more than a page (flctl.study.PAGE)
    from flctl.study import sync_sweep

    proc = warm.Popen([sys.executable, "-c", MIRROR, url, SID, "write", "hold"], stdout=warm.PIPE, stderr=warm.PIPE)
    wait_for(proc, "in-write")
    proc.send_signal(sig)
    proc.wait(60)
    trials, marked = mirror_state(store, url)
    assert set(trials) == marked and len(trials) == len(set(trials))        # both or neither, cell by cell
    assert sync_sweep(store, url, SID) == len(ids) - len(trials)
    trials, marked = mirror_state(store, url)
    assert trials == ids and marked == set(ids)
    store.close()


def stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def wait_stopped(proc: warm.Popen) -> None:
    deadline = time.monotonic() + 60
    while not stopped(proc.pid):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)


@pytest.mark.parametrize("backend,where", [("sqlite", "read"), ("sqlite", "write"),
                                           pytest.param("postgresql", "write", marks=pytest.mark.slow),
                                           pytest.param("pgbouncer", "write", marks=pytest.mark.slow)])
def test_a_mirror_stopped_holding_its_lock_keeps_no_worker_waiting_for_the_mirror(tmp_path: Path, backend: str,
                                                                                  where: str) -> None:
    """SIGSTOP while it holds MIRROR_LOCK: reading its page, or inside the transaction that writes its trials. A
    worker's exit sync (wait=False) returns at once; a worker finishing a cell goes on too, except on SQLite while the
    stopped mirror is inside its write (the database's one write lock: it then waits until SIGCONT)."""
    from flctl.study import sync_sweep

    url = database_url(backend, tmp_path)
    store, ids = finished_sweep(url, 20)
    late = sweep(store, cells(2, start=100), "laterone0001")
    proc = warm.Popen([sys.executable, "-c", MIRROR, url, SID, where, "stop"], stdout=warm.PIPE, stderr=warm.PIPE)
    try:
        wait_for(proc, "in-" + where)
        wait_stopped(proc)
        started = time.monotonic()
        assert sync_sweep(store, url, "laterone0001", wait=False) == 0
        assert time.monotonic() - started < bound(3)
        queue = RunQueue(store)
        if backend == "sqlite" and where == "write":
            import threading

            done = threading.Event()
            worker = threading.Thread(target=lambda: (finish(queue, late[0]), done.set()), daemon=True)
            worker.start()
            assert not done.wait(2)                      # SQLite's one writer: it waits for the stopped mirror
            proc.send_signal(signal.SIGCONT)
            assert done.wait(bound(60))
        else:
            started = time.monotonic()
            finish(queue, late[0])
            assert time.monotonic() - started < bound(5)
            proc.send_signal(signal.SIGCONT)
        out, err = proc.communicate(120)
        # the holder also takes the cell finished while it held the lock (flctl.study.sync_sweep)
        assert proc.returncode == 0 and out.split()[-1] in ("20", "21"), out + err
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
    sync_sweep(store, url, "laterone0001")
    trials, marked = mirror_state(store, url)
    assert trials == ids and marked == set(ids)
    assert mirror_state(store, url, "laterone0001")[0] == [late[0]]
    store.close()


# --------------------------------------------------------------------------------------------------------------
# A frozen process (SIGSTOP): holding a claim, or in the middle of a claim's transaction.

# Claims one cell, says so, and writes (a beat, then the cell's end) once the file ``go`` is there.
HOLDER = r"""
import json, os, sys, time
from flctl.db import RunQueue, Store
from flctl.db.queue import Ended
url, sid, go = sys.argv[1:4]
queue = RunQueue(Store.open(url))
held = {}
[claim] = queue.claim_next(sid, max_attempts=3, stale_after=2, held=held)
print("claimed", claim.cfg.run_id, flush=True)
while not os.path.exists(go):
    time.sleep(0.02)
beat = queue.beat(held, dict.fromkeys(held, 9))
lost = queue.finish_runs({r: Ended(t, "completed", 1, {"x": 1.0}, None, 0, {}, 0.0) for r, t in held.items()})
print(json.dumps({"beat": sorted(beat), "lost": sorted(lost)}), flush=True)
"""


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_worker_stopped_while_it_holds_a_claim_is_taken_over_and_then_writes_nothing(tmp_path: Path,
                                                                                      backend: str) -> None:
    url = database_url(backend, tmp_path)
    store = Store.open(url)
    [cell] = sweep(store, cells(1))
    proc = warm.Popen([sys.executable, "-c", HOLDER, url, SID, str(tmp_path / "go")], stdout=warm.PIPE,
                      stderr=warm.PIPE)
    try:
        wait_for(proc, "claimed")
        proc.send_signal(signal.SIGSTOP)
        queue, held = RunQueue(store), {}
        deadline = time.monotonic() + 60            # the stale bound (2 s) by the database's clock
        while not queue.claim_next(SID, max_attempts=3, stale_after=2, held=held):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert list(held) == [cell]
        (tmp_path / "go").touch()
        proc.send_signal(signal.SIGCONT)
        out, err = proc.communicate(60)
    finally:
        proc.send_signal(signal.SIGCONT)
    assert proc.returncode == 0, err
    assert json.loads(out.splitlines()[-1]) == {"beat": [], "lost": [cell]}     # fenced: nothing written
    run = store.get_run(cell)
    assert (run.status, run.attempts, run.epochs_done, run.pid) == (Status.RUNNING, 2, 0, os.getpid())
    store.close()


# Stops itself (SIGSTOP) inside its claim's transaction: the cells' UPDATE sent, not committed.
FROZEN_CLAIM = r"""
import os, signal, sys
from sqlalchemy import event
from flctl.db import RunQueue, Store
url, sid = sys.argv[1:3]
store = Store.open(url)
def hold(conn, cursor, statement, *rest):
    if statement.lstrip().upper().startswith("UPDATE RUNS SET STATUS"):
        print("in-claim", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
event.listen(store.engine, "after_cursor_execute", hold)
[claim] = RunQueue(store).claim_next(sid, max_attempts=3)
print("claimed", claim.cfg.run_id, flush=True)
"""

CLAIM_ONE = r"""
import sys
from flctl.db import RunQueue, Store
[claim] = RunQueue(Store.open(sys.argv[1])).claim_next(sys.argv[2], max_attempts=3)
print("claimed", claim.cfg.run_id, flush=True)
"""


@pytest.mark.parametrize("backend", ["sqlite", "postgresql", "pgbouncer"])
def test_a_worker_stopped_inside_its_claims_transaction(tmp_path: Path, backend: str) -> None:
    """PostgreSQL (and through PgBouncer): the others skip its locked cells and go on at once. SQLite: its one
    writer is stopped, so the others' claims wait (silently, up to busy_timeout 30 s x Store.write's 8 tries) and
    go on when it is continued; readers (`flctl status`) are not held up."""
    url = database_url(backend, tmp_path)
    store = Store.open(url)
    ids = sweep(store, cells(4))
    frozen = warm.Popen([sys.executable, "-c", FROZEN_CLAIM, url, SID], stdout=warm.PIPE, stderr=warm.PIPE)
    other = None
    try:
        wait_for(frozen, "in-claim")
        wait_stopped(frozen)
        started = time.monotonic()
        res = flctl("status", SID, "--json", "--db", url, env=env_of(tmp_path / "r"))
        assert res.returncode == 0 and json.loads(res.stdout)["total"]["queued"] == 4, res.stderr
        assert time.monotonic() - started < bound(15)
        other = warm.Popen([sys.executable, "-c", CLAIM_ONE, url, SID], stdout=warm.PIPE, stderr=warm.PIPE)
        if backend == "sqlite":
            time.sleep(3)                              # a negative: nothing to wait on but time
            assert other.poll() is None and "claimed" not in other.peek()
            frozen.send_signal(signal.SIGCONT)
        mine = wait_for(other, "claimed", timeout=bound(10) if backend != "sqlite" else 120).split()[-1]
        frozen.send_signal(signal.SIGCONT)
        theirs = wait_for(frozen, "claimed ").split()[-1]
    finally:
        frozen.send_signal(signal.SIGCONT)
        for p in (frozen, other):
            if p is not None:
                p.wait(60)
    assert mine != theirs and {mine, theirs} <= set(ids)
    running = {r.id for r in store.list_runs() if r.status == Status.RUNNING}
    assert running == {mine, theirs}
    store.close()


# --------------------------------------------------------------------------------------------------------------
# A second process at the same moment.

@pytest.mark.slow
def test_two_launches_of_the_same_50000_cell_grid_at_once_record_it_once(tmp_path: Path, noop_site: Path) -> None:
    url = database_url("sqlite", tmp_path)
    Store.open(url).close()                    # the schema made: the race is the plan's, not the first open's
    axes = ["two-moons", "--lr", "1e-4..1:5000", "--seeds", "10", "--yes", "--executor", "noop", "--db", url]
    procs = [warm.Popen([sys.executable, "-m", "flctl", "sweep", *axes], env=env_of(tmp_path / f"r{k}", noop_site),
                        stdout=warm.PIPE, stderr=warm.PIPE, cwd=str(ROOT)) for k in range(2)]
    for p in procs:
        out, err = p.communicate(600)
        no_traceback(err)
        assert p.returncode == 0, out + err
    store = Store.open(url)
    [row] = store.list_sweeps()
    assert row["cells"] == 50_000 and len(store.list_runs()) == 50_000
    store.close()


# `flctl sweep` that stops inside its plan's transaction, after it looked which runs are there and before it writes
# them, until the file ``go`` is there: another launch of the same grid runs meanwhile.
SLOW_LAUNCH = r"""
import os, sys, time
import sqlalchemy
from sqlalchemy import event
go, args = sys.argv[1], sys.argv[2:]
seen = []
def hold(conn, cursor, statement, *rest):
    if not seen and " ".join(statement.split()).upper().startswith("SELECT RUNS.ID FROM RUNS WHERE RUNS.ID IN"):
        seen.append(1)
        print("checked", flush=True)
        while not os.path.exists(go):
            time.sleep(0.02)
event.listen(sqlalchemy.engine.Engine, "after_cursor_execute", hold)
sys.argv = ["flctl", *args]
from flctl.__main__ import main
main()
"""


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_launch_of_the_same_grid_while_another_is_inside_its_plans_write(tmp_path: Path, noop_site: Path,
                                                                            backend: str) -> None:
    url = database_url(backend, tmp_path)
    Store.open(url).close()
    go = tmp_path / "go"
    args = ["sweep", "two-moons", "--lr", "1e-4..1:30", "--seeds", "10", "--executor", "noop", "--db", url]
    first = warm.Popen([sys.executable, "-c", SLOW_LAUNCH, str(go), *args], env=env_of(tmp_path / "r1", noop_site),
                       stdout=warm.PIPE, stderr=warm.PIPE, cwd=str(ROOT))
    try:
        wait_for(first, "checked")
        second = warm.Popen([sys.executable, "-m", "flctl", *args], env=env_of(tmp_path / "r2", noop_site),
                            stdout=warm.PIPE, stderr=warm.PIPE, cwd=str(ROOT))
        try:
            second.wait(5)            # PostgreSQL: it records the grid; SQLite: it waits for the first's write lock
        except subprocess.TimeoutExpired:
            pass
    finally:
        go.touch()
    said = [p.communicate(300) for p in (first, second)]
    for p, (out, err) in zip((first, second), said):
        no_traceback(err)
        assert p.returncode == 0, out + err
    store = Store.open(url)
    [row] = store.list_sweeps()
    assert row["cells"] == 300 and len(store.list_runs()) == 300
    store.close()


def test_status_watch_beside_a_sweep_follows_it_and_ends_when_it_settles(tmp_path: Path) -> None:
    url = database_url("sqlite", tmp_path)
    store = Store.open(url)
    ids = sweep(store, cells(6))
    queue, held = RunQueue(store), {}
    for _ in ids:
        queue.claim_next(SID, max_attempts=3, held=held)
    from flctl.db.queue import Ended

    def finish_some(run_ids: list[str]) -> None:
        assert not queue.finish_runs({r: Ended(held[r], "completed", 1, {"x": 1.0}, None, 0, {}, 0.0)
                                      for r in run_ids})

    watch = warm.Popen([sys.executable, "-m", "flctl", "status", SID, "--watch", "--db", url],
                       env=env_of(tmp_path / "r"), stdout=warm.PIPE, stderr=warm.PIPE, cwd=str(ROOT))
    try:
        wait_for(watch, f"sweep {SID}:")
        finish_some(ids[:3])
        wait_for(watch, "completed 3 · running 3")
        finish_some(ids[3:])
        out, err = watch.communicate(bound(60))
    finally:
        watch.kill()
    assert watch.returncode == 0, out + err
    no_traceback(err)
    assert "completed 6\n" in out and "│ all    │ 6 " in out, out
    store.close()


# Two mirrors that start at the same moment, each waiting for the lock (as two `flctl sweep` of one grid).
TWO_MIRRORS = r"""
import sys, time
from flctl.db import Store
from flctl.study import sync_sweep
url, sid, at = sys.argv[1], sys.argv[2], float(sys.argv[3])
store = Store.open(url)
time.sleep(max(0.0, at - time.time()))
print("added", sync_sweep(store, url, sid), flush=True)
"""


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
def test_two_mirrors_at_once_give_each_cell_one_trial(tmp_path: Path, backend: str) -> None:
    url = database_url(backend, tmp_path)
    store, ids = finished_sweep(url, 600)                     # two pages each (flctl.study.PAGE)
    at = time.time() + 3
    procs = [warm.Popen([sys.executable, "-c", TWO_MIRRORS, url, SID, str(at)], stdout=warm.PIPE, stderr=warm.PIPE)
             for _ in range(2)]
    added = []
    for p in procs:
        out, err = p.communicate(300)
        assert p.returncode == 0, err
        added.append(int(out.split()[-1]))
    assert sorted(added) == [0, len(ids)]
    trials, marked = mirror_state(store, url)
    assert trials == ids and marked == set(ids)
    store.close()


# --------------------------------------------------------------------------------------------------------------
# Damaged or foreign state.

@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_cell_without_its_together_key_is_claimed_alone_and_never_grouped(tmp_path: Path, backend: str) -> None:
    store = Store.open(database_url(backend, tmp_path))
    ids = sweep(store, cells(5))
    bare = ids[2]
    set_rows(store, [bare], together=None)          # a row 0008 could not fill, or one written by another tool
    queue, groups = RunQueue(store), []
    while True:
        held: dict[str, str] = {}
        if not queue.claim_next(SID, max_attempts=3, held=held):
            break
        queue.claim_next(SID, max_attempts=3, most=8, together=next(iter(held)), held=held)
        groups.append(sorted(held))
    assert sorted(i for g in groups for i in g) == ids
    assert [bare] in groups and sorted(len(g) for g in groups) == [1, 4]
    store.close()


# A sweep's worker as a local job runs it, on every cell it can claim; with batch_runs cells a group.
WORKER = r"""
import sys
from flctl.launch.backends import Slot
from flctl.launch.recipe import WorkerRecipe
from flctl.launch.worker import Worker
url, root, sid, batch = sys.argv[1:5]
worker = Worker(WorkerRecipe(url, root, sid, executor="local", batch_runs=int(batch), sync_study=False))
print("outcome", worker(Slot(0, threads=1)), flush=True)
"""


def test_a_cell_with_another_kinds_together_key_is_not_trained_with_the_wrong_cells(tmp_path: Path) -> None:
    """A row whose together key is wrong (an epochs=2 cell carrying the epochs=1 cells' key): a grouped claim takes it
    with them, the trainer refuses the group (flctl.train: can_train_together), and each cell trains alone."""
    results = tmp_path / "results"
    results.mkdir()
    url = f"sqlite:///{results / 'flctl.db'}"
    store = Store.open(url)
    one, two = cells(2, epochs=1), cells(2, start=10, epochs=2)
    sweep(store, one + two)
    set_rows(store, [two[0].run_id], together=one[0].together_id)
    proc = warm.Popen([sys.executable, "-c", WORKER, url, str(results), SID, "4"], stdout=warm.PIPE, stderr=warm.PIPE,
                      env=env_of(results))
    out, err = proc.communicate(600)
    assert proc.returncode == 0, err
    runs = {r.id: r for r in store.list_runs()}
    assert {r.status for r in runs.values()} == {"completed"}, {r.id: (r.status, r.error) for r in runs.values()}
    assert {r.id: r.epochs_done for r in runs.values()} == {c.run_id: c.epochs for c in one + two}
    store.close()


DAMAGED_CONFIG = ("a queued cell whose config cannot be read stalls its whole sweep: the claim parses every config it "
                  "takes inside its transaction (flctl/db/claims.py take_next, RunConfig.from_json(r.config)), so the "
                  "damaged row, first in the index's order, makes every claim raise (SQLite: StoreError 'a row holds "
                  "invalid JSON'; PostgreSQL, a JSON that is no config: TypeError) and roll back: no worker ever gets "
                  "the good cells, and revision 0008's promise ('a row whose config this flctl cannot read ... is "
                  "claimed alone') does not hold")


@pytest.mark.parametrize("backend,damage", [("sqlite", "{not json"), ("postgresql", "{}")])
def test_a_queued_cell_whose_config_is_damaged_does_not_stall_the_others(tmp_path: Path, backend: str,
                                                                          damage: str) -> None:
    url = database_url(backend, tmp_path)
    store = Store.open(url)
    ids = sweep(store, cells(3))
    store.write(lambda s: s.execute(text("UPDATE runs SET config = :c WHERE id = :i"
                                         if backend == "sqlite" else
                                         "UPDATE runs SET config = CAST(:c AS json) WHERE id = :i"),
                                    {"c": damage, "i": ids[0]}))
    queue, taken = RunQueue(store), []
    for _ in range(3):
        try:
            taken += [c.cfg.run_id for c in queue.claim_next(SID, max_attempts=3)]
        except Exception:           # the damaged cell may be refused in one line; the others must still come
            pass
    assert sorted(taken) == ids[1:]
    store.close()


def test_sweep_wait_over_a_damaged_cell_trains_the_others_and_names_it(tmp_path: Path, noop_site: Path) -> None:
    results = tmp_path / "results"
    axes = ["two-moons", "-m", "erm", "--lr", "0.01,0.02,0.03", "--epochs", "1"]
    assert flctl("sweep", *axes, "--executor", "noop", env=env_of(results, noop_site)).returncode == 0
    bad = sorted(r.id for r in Store.open(f"sqlite:///{results / 'flctl.db'}").list_runs())[0]
    with sqlite3.connect(results / "flctl.db") as conn:
        conn.execute("UPDATE runs SET config = '{not json' WHERE id = ?", (bad,))
    res = flctl("sweep", *axes, "--wait", "--workers", "1", env=env_of(results), timeout=600)
    no_traceback(res.stderr)
    assert res.returncode != 2 and bad in res.stdout + res.stderr, res.stdout + res.stderr
    with sqlite3.connect(results / "flctl.db") as conn:     # list_runs refuses the damaged row, in one line
        states = dict(conn.execute("SELECT id, status FROM runs").fetchall())
    assert states.pop(bad) == "failed" and set(states.values()) == {"completed"} and len(states) == 2


def test_a_cell_whose_run_is_gone_is_counted_alike_by_status_and_sweeps(tmp_path: Path) -> None:
    url = database_url("sqlite", tmp_path)
    store = Store.open(url)
    ids = sweep(store, cells(3))
    store.close()
    with sqlite3.connect(tmp_path / "flctl.db") as conn:     # foreign keys are off in a plain connection
        conn.execute("INSERT INTO sweep_cells (sweep_id, run_id, mirrored) VALUES (?, 'deadbeefdeadbeef', 0)", (SID,))
    store = Store.open(url)
    queue = RunQueue(store)        # the claim and the mirror step over it
    assert sorted(c.cfg.run_id for _ in ids for c in queue.claim_next(SID, max_attempts=3)) == ids
    env = env_of(tmp_path / "r")
    listed = json.loads(flctl("sweeps", "--json", "--db", url, env=env).stdout)
    ledger = json.loads(flctl("status", SID, "--json", "--db", url, env=env).stdout)
    assert listed[0]["cells"] == ledger["cells"] == 4 and ledger["total"]["missing"] == 1
    store.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_without_the_new_indexes_claims_and_counts_are_the_same(tmp_path: Path, backend: str) -> None:
    """ix_runs_claim and ix_runs_ledger dropped (a DBA's cleanup, a restore without indexes): slower, still right."""
    store = Store.open(database_url(backend, tmp_path))
    ids = sweep(store, cells(8))
    set_rows(store, ids[5:6], status=Status.INTERRUPTED, attempts=1)
    set_rows(store, ids[6:7], status=Status.FAILED, attempts=1, error="boom")
    set_rows(store, ids[7:8], status=Status.COMPLETED, attempts=1)
    from flctl.status import ledger

    before = ledger(store, SID)
    store.write(lambda s: [s.execute(text(f"DROP INDEX {name}")) for name in ("ix_runs_claim", "ix_runs_ledger")])
    assert ledger(store, SID) == before
    queue = RunQueue(store)
    taken = [c.cfg.run_id for _ in ids for c in queue.claim_next(SID, max_attempts=3)]
    assert taken == [ids[5], *ids[:5]]                 # interrupted first, then queued in the index's order
    store.close()


def test_a_deleted_optuna_study_is_made_again_with_every_finished_cell(tmp_path: Path) -> None:
    import optuna

    from flctl.db import existing_storage
    from flctl.study import sync_sweep

    url = database_url("sqlite", tmp_path)
    store = Store.open(url)
    ids = sweep(store, cells(6))
    queue = RunQueue(store)
    for i, run_id in enumerate(ids[:3]):
        finish(queue, run_id, float(i))
    assert sync_sweep(store, url, SID) == 3
    storage = existing_storage(url)
    optuna.delete_study(study_name=f"flctl-{SID}", storage=storage)
    storage.engine.dispose()
    for run_id in ids[3:]:
        finish(queue, run_id)
    sync_sweep(store, url, SID)
    assert mirror_state(store, url)[0] == ids
    store.close()


def damaged_study(url: str, grid) -> tuple[Store, list[str]]:
    """Sweep SID with a finished cell mirrored, its study's grid attribute replaced by ``grid``, and a cell finished
    since (waiting for a mirror)."""
    import optuna

    from flctl.db import existing_storage
    from flctl.study import sync_sweep

    store = Store.open(url)
    ids = sweep(store, cells(4))
    queue = RunQueue(store)
    finish(queue, ids[0])
    sync_sweep(store, url, SID)
    storage = existing_storage(url)
    optuna.load_study(study_name=f"flctl-{SID}", storage=storage).set_user_attr("grid", grid)
    storage.engine.dispose()
    finish(queue, ids[1])
    return store, ids


# A grid attribute damaged by hand: not a grid; a grid without the cells' values; an axis flctl has not. Each is made
# again from the sweep's cells (flctl.study._Studies), never a stop of the mirror of the sweeps after it.
GRIDS = ['"garbage"', '{"lr": [1]}', '{"nosuch": [1, 2]}']


@pytest.mark.parametrize("grid", GRIDS, ids=["garbage", "an-axis-of-other-values", "an-unknown-axis"])
def test_a_damaged_grid_in_one_study_does_not_stop_the_mirror_of_the_others(tmp_path: Path, grid: str) -> None:
    from flctl.errors import ConfigError
    from flctl.study import sync_sweep

    url = database_url("sqlite", tmp_path)
    store, _ = damaged_study(url, json.loads(grid))
    other, ids = finished_sweep(url, 3, sid="zzotherswee1", start=50)       # after SID in the mirror's order
    try:
        sync_sweep(store, url, "zzotherswee1")
    except ConfigError:              # the damaged study may be named in one line; the other sweep's cells go on
        pass
    assert mirror_state(store, url, "zzotherswee1")[0] == ids
    store.close()


def test_sweep_beside_a_damaged_study_ends_without_a_traceback(tmp_path: Path, noop_site: Path) -> None:
    url = database_url("sqlite", tmp_path)
    damaged_study(url, "garbage")[0].close()
    res = flctl("sweep", "two-moons", "--lr", "0.1,0.2", "--executor", "noop", "--db", url,
                env=env_of(tmp_path / "r", noop_site))
    no_traceback(res.stderr)
    assert res.returncode == 0, res.stderr


# --------------------------------------------------------------------------------------------------------------
# Two-moons' extras.npz (the MLP's layers the multipliers figure computes the decision grid from), damaged.

@pytest.fixture(scope="module")
def moons(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, bytes]:
    """A results folder with one completed two-moons fl run: (its root, its extras.npz, that file's bytes)."""
    root = tmp_path_factory.mktemp("moons") / "results"
    res = in_process("run", "two-moons", "-m", "fl", "--epochs", "2", "--results-dir", str(root))
    assert res.returncode == 0, res.stdout + res.stderr
    [run] = Store.open(f"sqlite:///{root / 'flctl.db'}").list_runs()
    extras = Path(run.artifacts["extras"])
    return root, extras, extras.read_bytes()


@pytest.fixture
def extras_of(moons):
    """Writes a damaged extras.npz in place of the run's (``extras_of(arrays)``, or raw bytes); put back after."""
    import numpy as np

    root, path, original = moons
    kept = dict(np.load(path))

    def write(change) -> tuple[Path, dict]:
        if isinstance(change, bytes):
            path.write_bytes(change)
        else:
            with open(path, "wb") as f:
                np.savez(f, **change(dict(kept)))
        return root, kept
    yield write
    path.write_bytes(original)


def multipliers_figure(root: Path, out: Path) -> subprocess.CompletedProcess:
    return in_process("report", "--plot", "multipliers", "--results-dir", str(root), "--out", str(out))


def last_layer(kept: dict) -> int:
    return max(int(k.rsplit("_", 1)[1]) for k in kept if k.startswith("mlp_weight_"))


def test_the_undamaged_run_draws(extras_of, tmp_path: Path) -> None:
    root, kept = extras_of(lambda e: e)
    assert last_layer(kept) >= 2                       # an MLP with a hidden layer between two others
    res = multipliers_figure(root, tmp_path / "m")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "m.png").stat().st_size > 10_000


@pytest.mark.parametrize("missing", ["the last layer's bias", "a middle layer", "the last layer"])
def test_extras_with_a_layer_missing_are_refused_in_one_line(extras_of, tmp_path: Path, missing: str) -> None:
    def drop(e: dict) -> dict:
        n = last_layer(e)
        names = {"the last layer's bias": [f"mlp_bias_{n}"], "a middle layer": ["mlp_weight_1", "mlp_bias_1"],
                 "the last layer": [f"mlp_weight_{n}", f"mlp_bias_{n}"]}[missing]
        return {k: v for k, v in e.items() if k not in names}

    root, _ = extras_of(drop)
    res = multipliers_figure(root, tmp_path / "m")
    assert res.returncode == 2 and "layer" in one_line(res.stderr), (res.returncode, res.stderr)


@pytest.mark.parametrize("damage", ["a first layer of 3 inputs", "a weight of one dimension", "no layers and no grid",
                                    "not a zip file"])
def test_extras_that_cannot_be_drawn_are_one_line_and_exit_2(extras_of, tmp_path: Path, damage: str) -> None:
    import numpy as np

    def change(e: dict):
        if damage == "a first layer of 3 inputs":
            e["mlp_weight_0"] = np.ones((e["mlp_weight_0"].shape[0], 3), np.float32)
        elif damage == "a weight of one dimension":
            e["mlp_weight_0"] = e["mlp_weight_0"].ravel()
        else:
            e = {k: v for k, v in e.items() if not k.startswith("mlp_")}
        return e

    root, _ = extras_of(b"PK\x03\x04 truncated" if damage == "not a zip file" else change)
    res = multipliers_figure(root, tmp_path / "m")
    assert res.returncode == 2, res.stdout + res.stderr
    assert one_line(res.stderr).startswith("error: ") and not (tmp_path / "m.png").exists()


# --------------------------------------------------------------------------------------------------------------
# A database of the previous release (schema revision 0007), with a sweep in every state, opened by this flctl.

PREVIOUS_RELEASE = "acee7cc"            # the last commit before issue 68's round: its newest revision is 0007


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's flctl and tasks, extracted from git: a folder to run `python -c` in."""
    where = tmp_path_factory.mktemp("previous-release")
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", PREVIOUS_RELEASE, "flctl", "tasks"],
                             capture_output=True, timeout=120)
    if archive.returncode != 0:
        pytest.skip(f"no commit {PREVIOUS_RELEASE} here: {archive.stderr.decode()[:200]}")
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive.stdout, check=True, timeout=120)
    return where


# Run by the previous release: a sweep of 16 cells in every state (mirrored by that release's sync, one finished
# after it), an empty sweep; prints the cells' ids and the previous release's own ledger of the sweep.
OLD_SWEEP = r"""
import dataclasses, json, socket, subprocess, sys
from datetime import timedelta
from sqlalchemy import update
from flctl import migrations
from flctl.config import resolve
from flctl.db import RunQueue, Store
from flctl.db.liveness import db_now
from flctl.db.schema import Run
from flctl.status import ledger
from flctl.study import sync_sweep
from flctl.tasks import get_task
assert migrations.head() == "0007", migrations.head()
url, live_pid = sys.argv[1], int(sys.argv[2])
store = Store.open(url)
base = resolve(get_task("two-moons"), "erm", {"epochs": 1}, None)
cfgs = [dataclasses.replace(base, lr=1e-6 * (1 + i), epochs=1 + i // 12) for i in range(16)]
store.create_sweep("oldsweep0001", "old", "two-moons", {}, cfgs)
store.create_sweep("oldempty0001", "empty", "two-moons", {}, [])
ids = sorted(c.run_id for c in cfgs)
queue = RunQueue(store)
def done(i, status="completed", value=1.0):
    token = queue.claim_run(ids[i])
    queue.finish_run(ids[i], token, status=status, epochs_done=1, metrics={"train.avg_loss": value}, diverged_at=None,
                     lambda_capped=0, artifacts={}, duration_s=1.0)
def put(i, **values):
    store.write(lambda s: s.execute(update(Run).where(Run.id == ids[i]).values(**values)))
done(0)
done(1, value=2.0)
done(2, status="diverged")
sync_sweep(store, url, "oldsweep0001")
done(3, value=3.0)
with store.session() as s:
    now = db_now(s)
gone = subprocess.Popen(["true"])
gone.wait()
put(4, status="failed", attempts=1, error="boom")
put(5, status="failed", attempts=3, error="boom again")
put(6, status="interrupted", attempts=1, error="stopped")
put(7, status="running", attempts=1, host="elsewhere", pid=1, heartbeat_at=now - timedelta(hours=1), claim_token="a" * 32)
put(8, status="running", attempts=1, host=socket.gethostname(), pid=gone.pid, heartbeat_at=now, claim_token="b" * 32)
put(9, status="running", attempts=1, host=socket.gethostname(), pid=live_pid, heartbeat_at=now, claim_token="c" * 32)
print(json.dumps({"ids": ids, "ledger": ledger(store, "oldsweep0001")}))
"""

# This flctl opening the old database: two of these start at the same moment.
OPEN_NEW = r"""
import sys, time
from flctl.db import Store
url, at = sys.argv[1], float(sys.argv[2])
time.sleep(max(0.0, at - time.time()))
store = Store.open(url)
print("runs", len(store.list_runs()), flush=True)
"""


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
def test_a_previous_release_database_opened_by_two_processes_at_once_is_upgraded_whole(
        tmp_path: Path, previous_release: Path, backend: str) -> None:
    """Every to-do and lost cell still claimable (and no other), the ledger as the previous release counted it, the
    together key filled in, and the cells it mirrored not mirrored twice."""
    from flctl import migrations
    from flctl.status import ledger
    from flctl.study import sync_sweep

    url = database_url(backend, tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FLCTL_DB")}
    old = subprocess.run([sys.executable, "-c", OLD_SWEEP, url, str(os.getpid())], cwd=previous_release, env=env,
                         capture_output=True, text=True, timeout=300)
    assert old.returncode == 0, old.stderr
    made = json.loads(old.stdout.splitlines()[-1])
    ids, before = made["ids"], made["ledger"]

    at = time.time() + 3
    procs = [warm.Popen([sys.executable, "-c", OPEN_NEW, url, str(at)], stdout=warm.PIPE, stderr=warm.PIPE)
             for _ in range(2)]
    for p in procs:
        out, err = p.communicate(300)
        assert p.returncode == 0 and out.split() == ["runs", "16"], out + err
    store = Store.open(url)
    with store.session() as s:
        assert s.execute(text("SELECT version_num FROM flctl_alembic_version")).scalar_one() == migrations.head()
        assert s.execute(text("SELECT count(*) FROM runs WHERE together IS NULL")).scalar_one() == 0
    after = ledger(store, "oldsweep0001")
    assert {k: after[k] for k in ("methods", "total", "cells")} == {k: before[k] for k in ("methods", "total", "cells")}
    assert after["total"]["stale"] == 2 and after["total"]["running"] == 1

    queue, taken = RunQueue(store), []
    while got := queue.claim_next("oldsweep0001", max_attempts=3, stale_after=60):
        taken += [c.cfg.run_id for c in got]
    # interrupted, then queued, then the lost workers' (a stale heartbeat, then a dead pid here); not the live one's,
    # not the failed ones, not those done
    assert taken[0] == ids[6] and sorted(taken[1:-2]) == ids[10:] and taken[-2:] == [ids[7], ids[8]], taken
    assert sync_sweep(store, url, "oldsweep0001") == 1                  # the cell finished after the old sync
    assert mirror_state(store, url, "oldsweep0001")[0] == sorted(ids[:4])
    store.close()


# --------------------------------------------------------------------------------------------------------------
# At scale, as a user sees it: a sweep of 100,000 cells in every state.

KINDS = [f"ValueError: the {a}{b} went wrong" for a in "ghijklmnopqrstuvwxyz" for b in "gh"][:30]   # no hex, no digit
BIG = {Status.COMPLETED: 60_000, Status.FAILED: 1_000, Status.DIVERGED: 100, Status.INTERRUPTED: 100, "stale": 100}
BIG_QUEUED = 100_000 - sum(BIG.values())


@pytest.fixture(scope="module")
def hundred_k(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A SQLite database with sweep SID of 100,000 cells (erm and fl), in the states of BIG, the rest queued."""
    path = tmp_path_factory.mktemp("hundred-k") / "flctl.db"
    store = Store.open(f"sqlite:///{path}")
    erm = cells(50_000)
    fl = [dataclasses.replace(c, method="fl") for c in cells(50_000)]
    ids = sweep(store, erm + fl)
    with store.session() as s:
        long_ago = db_now(s) - timedelta(hours=1)
    at = 0

    def put(n: int, **values) -> list[str]:
        nonlocal at
        part, at = ids[at:at + n], at + n
        for k in range(0, n, 5000):
            set_rows(store, part[k:k + 5000], **values)
        return part

    put(BIG[Status.COMPLETED], status=Status.COMPLETED, attempts=1, metrics={"train.avg_loss": 0.1})
    failed = put(BIG[Status.FAILED], status=Status.FAILED, attempts=1)
    for k, kind in enumerate(KINDS):
        set_rows(store, failed[k::len(KINDS)], error=kind)
    put(BIG[Status.DIVERGED], status=Status.DIVERGED, attempts=1)
    put(BIG[Status.INTERRUPTED], status=Status.INTERRUPTED, attempts=1, error="stopped")
    put(BIG["stale"], status=Status.RUNNING, attempts=1, host="elsewhere", pid=1, heartbeat_at=long_ago)
    store.close()
    return f"sqlite:///{path}"


def big_totals() -> dict:
    return {"completed": BIG[Status.COMPLETED], "running": 0, "stale": BIG["stale"], "queued": BIG_QUEUED,
            "interrupted": BIG[Status.INTERRUPTED], "failed": BIG[Status.FAILED], "diverged": BIG[Status.DIVERGED],
            "missing": 0}


@pytest.mark.slow
def test_status_of_100000_cells_counts_right_and_shows_one_error_of_many(hundred_k: str, tmp_path: Path) -> None:
    started = time.monotonic()
    res = flctl("status", SID, "--db", hundred_k, env=env_of(tmp_path / "r"))
    took = time.monotonic() - started
    assert res.returncode == 0, res.stderr
    [row] = [line for line in res.stdout.splitlines() if line.startswith("│ all ")]
    numbers = [int(x) for x in row.replace("│", " ").split()[1:10]]
    assert numbers == [*big_totals().values(), 100_000], row
    assert "other)" in row and row.count("ValueError") <= 1          # the top error and how many others
    assert took < bound(20), took


@pytest.mark.slow
def test_status_json_of_100000_cells_is_whole(hundred_k: str, tmp_path: Path) -> None:
    res = flctl("status", SID, "--json", "--db", hundred_k, env=env_of(tmp_path / "r"))
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["cells"] == 100_000 and data["total"] == big_totals()
    assert sum(sum(m.values()) for m in data["methods"].values()) == 100_000
    assert {e["message"] for e in data["errors"]} >= set(KINDS)                    # every kind, none cut
    assert sum(e["count"] for e in data["errors"]) == BIG[Status.FAILED] + BIG[Status.DIVERGED]


@pytest.mark.slow
def test_status_watch_of_a_settled_100000_cell_sweep_caps_its_error_list(hundred_k: str, tmp_path: Path) -> None:
    import shutil

    path = tmp_path / "flctl.db"
    shutil.copy(hundred_k.removeprefix("sqlite:///"), path)
    with sqlite3.connect(path) as conn:        # settled: nothing left to do
        conn.execute("UPDATE runs SET status = 'completed' WHERE status IN ('queued', 'interrupted', 'running')")
    res = flctl("status", SID, "--watch", "--db", f"sqlite:///{path}", env=env_of(tmp_path / "r"))
    assert res.returncode == 3, res.stdout + res.stderr                  # CELLS_FAILED_EXIT: cells failed for good
    from flctl.cli.ledger import ERRORS_SHOWN

    assert res.stdout.count(" × ") == ERRORS_SHOWN, res.stdout
    left = len(KINDS) + 1 - ERRORS_SHOWN          # the diverged cells are a kind of their own
    assert f"and {left} more kind(s) of error in " in res.stdout and "--json` lists them all" in res.stdout


@pytest.mark.slow
def test_sweeps_of_100000_cells_counts_them_right(hundred_k: str, tmp_path: Path) -> None:
    listed = json.loads(flctl("sweeps", "--json", "--db", hundred_k, env=env_of(tmp_path / "r")).stdout)
    assert [(r["cells"], r["completed"]) for r in listed] == [(100_000, BIG[Status.COMPLETED])]


def test_sweeps_caps_a_list_of_251_sweeps(big_db: str, tmp_path: Path) -> None:
    from flctl.cli.ledger import SWEEPS_SHOWN

    res = flctl("sweeps", "--db", big_db, env=env_of(tmp_path / "r"))
    assert res.returncode == 0 and f"and {251 - SWEEPS_SHOWN} more sweep(s), older" in res.stdout, res.stderr
    assert len(json.loads(flctl("sweeps", "--json", "--db", big_db, env=env_of(tmp_path / "r")).stdout)) == 251


@pytest.mark.slow
@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "launch"])
def test_planning_100000_cells_shows_progress_and_ends_within_30_seconds(tmp_path: Path, noop_site: Path,
                                                                         dry: bool) -> None:
    results = tmp_path / "results"
    started = time.monotonic()
    res = flctl("sweep", *GRID_100K, "--executor", "noop", *(["--dry-run"] if dry else []),
                env=env_of(results, noop_site), timeout=600)
    took = time.monotonic() - started
    assert res.returncode == 0, res.stderr
    assert "planning: 50,000 of 100,000 cells" in res.stderr and "100000 runs" in res.stdout or not dry, res.stdout
    assert took < bound(30), took
    assert results.joinpath("flctl.db").exists() != dry
