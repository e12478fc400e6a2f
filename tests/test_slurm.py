"""Sweeps on a real Slurm cluster through submitit: job arrays, a cancelled job, preemption with requeue.

Needs a running cluster and SLURM_CONF pointing at it, e.g. `sudo .ci/slurm.sh /tmp/flctl-slurm` and
`. /tmp/flctl-slurm/env.sh`. Without one the module is skipped, except under CI (env CI set), where it fails:
CI must not pass by skipping these tests.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from flctl import records
from flctl.db import Store
from flctl.layout import records_of
from tests import helpers, warm

# A real cluster on a loaded 2-core machine: each test bounds its own waits (wait_until), so the per-test
# pytest-timeout (300 s) is raised here rather than cutting a slow but progressing re-run short.
# Slow (pyproject.toml's markers; `pytest -m "not slow"` is the fast loop): job arrays on a real Slurm cluster
# (CI's): minutes where the cluster is up.
pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

FLCTL = [sys.executable, "-m", "flctl"]
RECORD_ORDER = [("epoch", "ascending"), ("split", "ascending"), ("sample_id", "ascending")]
ROWS_PER_EVAL = 2 * 1000                                  # two-moons: train + test split, 1000 samples each

_MISSING = ("SLURM_CONF is not set" if not os.environ.get("SLURM_CONF")
            else "sinfo is not on PATH" if shutil.which("sinfo") is None else None)
_HOWTO = "start a cluster with `.ci/slurm.sh /tmp/flctl-slurm` (as root) and `. /tmp/flctl-slurm/env.sh`"
if _MISSING and "CI" not in os.environ:
    pytest.skip(f"no Slurm cluster ({_MISSING}); {_HOWTO}", allow_module_level=True)


@pytest.fixture(scope="module", autouse=True)
def slurm_cluster() -> None:
    if _MISSING:
        pytest.fail(f"CI is set but there is no Slurm cluster to test against: {_MISSING}; {_HOWTO}",
                    pytrace=False)
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("sinfo did not answer within 20 s: is slurmctld running?", pytrace=False)
    states = out.stdout.split()
    unusable = ("down", "drain", "drng", "fail", "maint", "unk", "npc", "inval")
    if out.returncode != 0 or not states or any(s.endswith("*") or s.startswith(unusable) for s in states):
        pytest.fail(f"the Slurm cluster of SLURM_CONF={os.environ['SLURM_CONF']} is not usable: sinfo says "
                    f"{out.stdout.strip() or out.stderr.strip()!r}", pytrace=False)


# ---- helpers ----

@pytest.fixture
def leftovers():
    """Jobs and processes a test started; whatever is still running at its end (a failed test) is stopped."""
    started: dict[str, list] = {"jobs": [], "procs": []}
    yield started
    if started["jobs"]:
        subprocess.run(["scancel", *started["jobs"]], capture_output=True, timeout=30)
    for proc in started["procs"]:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def flctl(results: Path, *args: str) -> subprocess.CompletedProcess:
    """`flctl *args` as a process forked warm (tests/warm.py): the jobs it submits start real interpreters."""
    return warm.run([*FLCTL, *args, "--results-dir", str(results)], capture_output=True, timeout=300,
                    env={**os.environ, "COLUMNS": "200"})


def ledger(results: Path) -> dict:
    out = helpers.in_process("status", "--json", "--results-dir", str(results))   # polled: no interpreter each time
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def statuses(results: Path) -> Counter:
    """Cell statuses straight from the database: cheap enough to poll (each `flctl status` is a Python start-up,
    and polling with it would take CPU from the jobs on a small machine)."""
    store = Store.open(f"sqlite:///{results / 'flctl.db'}")
    try:
        return Counter(r.status for r in store.list_runs())
    finally:
        store.close()


def job_logs(folder: Path) -> str:
    """The tail of every submitit job log under ``folder``: the evidence when a wait times out."""
    parts = []
    for log in sorted(Path(folder).rglob("*_log.*")):
        parts.append(f"--- {log.name} ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-25:]))
    return "\n".join(parts) or f"(no job logs under {folder})"


def wait_until(predicate, what: str, timeout: float = 120, interval: float = 0.5, logs: Path | None = None):
    """Poll like tests.helpers.wait_until; on timeout show Slurm's queue and the job logs."""
    def explain() -> str:
        queue = subprocess.run(["squeue", "-o", "%i %T %r"], capture_output=True, text=True).stdout
        return f"squeue:\n{queue}" + (f"\njob logs:\n{job_logs(logs)}" if logs else "")
    return helpers.wait_until(predicate, what, timeout, interval, explain)


def submitted_job(stdout: str) -> str:
    """The Slurm job id that `flctl sweep` reports ('N worker job(s) through slurm: ID')."""
    m = re.search(r"(\d+) worker job\(s\) through slurm: (\d+)\s*$", stdout, re.M)
    assert m, f"no job id in the sweep's output:\n{stdout}"
    return m.group(2)


def sacct(job: str, *, duplicates: bool = False) -> list[tuple[str, str]]:
    """(JobID, State) of the allocations of ``job`` (array tasks one by one); with ``duplicates``, also the
    earlier incarnations of a requeued job."""
    out = subprocess.run(["sacct", "-j", job, "-X", "-n", "-P", "-o", "JobID,State", *(["-D"] if duplicates else [])],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return [tuple(line.split("|", 1)) for line in out.stdout.splitlines() if line]  # type: ignore[misc]


def record_files(results: Path, run_id: str) -> dict[str, tuple[int, int]]:
    """Each eval epoch's records file of a run, with (inode, mtime): a rewritten file gets a new inode."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns)
            for p in records_of(results / "records", run_id).glob("epoch=*.parquet")}


def assert_resumed(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> None:
    """Records written before the interruption were kept, not rewritten: the run resumed from its checkpoint
    (a resumed run redoes at most the epoch it was in; a fresh start would replace every file)."""
    kept = sorted(before)[:-1]
    assert len(kept) >= 2, f"too few records before the interruption to tell a resume from a restart: {before}"
    assert {k: after.get(k) for k in kept} == {k: before[k] for k in kept}, "records rewritten: not resumed"


def assert_complete_records(results: Path, run_id: str, epochs: int, every: int):
    evals = epochs // every
    table = records.read(results / "records", [run_id]).sort_by(RECORD_ORDER)
    keys = Counter(zip(table["epoch"].to_pylist(), table["split"].to_pylist(), table["sample_id"].to_pylist()))
    assert len(table) == evals * ROWS_PER_EVAL, f"{len(table)} rows, expected {evals * ROWS_PER_EVAL}"
    assert max(keys.values()) == 1, "duplicated record rows"
    assert sorted({e for e, _, _ in keys}) == list(range(every, epochs + 1, every))
    return table


# ---- tests ----

def test_sweep_runs_as_a_job_array_and_rerun_submits_nothing(tmp_path: Path, leftovers) -> None:
    # 4 cells, 2 pull workers: each worker takes more than one cell (the node has 2 CPUs, so more workers would only
    # wait for one and import torch again).
    args = ("sweep", "two-moons", "--method", "fl,rfl", "--alpha", "1e-2..1", "--seeds", "1", "--epochs", "5",
            "--executor", "slurm", "--workers", "2")
    first = flctl(tmp_path, *args)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "4 cells, 4 new" in first.stdout and "2 worker job(s) through slurm" in first.stdout, first.stdout
    array = submitted_job(first.stdout)
    leftovers["jobs"].append(array)
    [sid] = [p.name for p in (tmp_path / "jobs").iterdir()]

    wait_until(lambda: statuses(tmp_path)["completed"] == 4, "4 completed cells", logs=tmp_path / "jobs")
    done = ledger(tmp_path)
    assert done["total"]["completed"] == 4, done
    assert done["methods"]["fl"]["completed"] == 1 and done["methods"]["rfl"]["completed"] == 3
    assert done["total"]["failed"] == 0 and done["total"]["stale"] == 0

    # One array of 2 pull workers sharing the 4 cells, each run recorded with the array task that trained it.
    runs = json.loads(flctl(tmp_path, "runs", "--json").stdout)
    assert len(runs) == 4 and all(r["status"] == "completed" and r["attempts"] == 1 for r in runs)
    tasks = {f"{array}_{i}" for i in range(2)}
    assert {r["job_id"] for r in runs} <= tasks, [r["job_id"] for r in runs]
    rows = wait_until(lambda: (lambda r: r if len(r) == 2 and all(s == "COMPLETED" for _, s in r) else None)(
        sacct(array)), f"sacct to show array {array} completed")
    assert {j for j, _ in rows} == tasks
    assert sorted(p.name for p in (tmp_path / "jobs" / sid).glob(f"{array}_*_result.pkl")) == \
        sorted(f"{t}_0_result.pkl" for t in tasks)

    again = flctl(tmp_path, *args)
    assert again.returncode == 0, again.stderr
    assert "0 new, 4 completed" in again.stdout and "0 to do" in again.stdout, again.stdout
    assert "through slurm" not in again.stdout


def test_cancelled_job_is_stale_and_rerun_resumes_it(tmp_path: Path, leftovers) -> None:
    epochs, every = 1000, 50
    args = ("sweep", "two-moons", "--method", "fl", "--eps", "0.1", "--epochs", str(epochs),
            "--eval-every", str(every), "--executor", "slurm")
    first = flctl(tmp_path, *args)
    assert first.returncode == 0, first.stdout + first.stderr
    job = submitted_job(first.stdout)
    leftovers["jobs"].append(job)
    store = Store.open(f"sqlite:///{tmp_path / 'flctl.db'}")
    [run] = store.list_runs()
    rid = run.id

    wait_until(lambda: len(record_files(tmp_path, rid)) >= 3, "the job to train a few epochs", interval=0.1,
               logs=tmp_path / "jobs")
    before = store.get_run(rid)
    assert before.status == "running" and before.job_id == job, before    # one worker: a plain job
    # The worker dies without a word to the database (SIGKILL, as from the OOM killer or a node going away), then the
    # job is cancelled. Not scancel alone: its SIGTERM is ignored by submitit and the SIGKILL comes KillWait (5 s)
    # later, or, for the job's steps, after the batch shell is gone: a run can finish inside that wait.
    os.kill(before.pid, signal.SIGKILL)
    wait_until(lambda: not Path(f"/proc/{before.pid}").exists(), "the worker process to be gone", timeout=30)
    subprocess.run(["scancel", job], capture_output=True)
    wait_until(lambda: [s.split()[0] for _, s in sacct(job)] in (["CANCELLED"], ["FAILED"]), "the job to end")
    files = record_files(tmp_path, rid)
    assert store.get_run(rid).status == "running"                # nobody told the database...
    # ...but its pid, on this host, is dead: stale at once (not after FLCTL_STALE_AFTER, 300 s by default).
    assert ledger(tmp_path)["total"]["stale"] == 1

    resumed = flctl(tmp_path, *args)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "1 re-queued after a lost worker" in resumed.stdout and "1 to do" in resumed.stdout, resumed.stdout
    job2 = submitted_job(resumed.stdout)
    leftovers["jobs"].append(job2)
    assert job2 != job
    wait_until(lambda: statuses(tmp_path)["completed"] == 1, "the resumed run to complete", logs=tmp_path / "jobs")
    assert ledger(tmp_path)["total"]["completed"] == 1
    after = store.get_run(rid)
    assert after.status == "completed" and after.attempts == 2 and after.job_id == job2, after
    assert after.epochs_done == epochs
    assert_resumed(files, record_files(tmp_path, rid))
    assert_complete_records(tmp_path, rid, epochs, every)
    assert not (tmp_path / "runs" / rid / "checkpoint.pt").exists()
    store.close()


def test_preempted_job_requeues_and_resumes_to_identical_records(tmp_path: Path, leftovers) -> None:
    from flctl.launch.backends import Slot
    from flctl.launch.recipe import WorkerRecipe
    from flctl.launch.worker import Worker, submit
    from flctl.sweep import plan, spec_from_values

    epochs, every = 1000, 20
    cell = ["two-moons", "--method", "fl", "--eps", "0.1", "--epochs", str(epochs), "--eval-every", str(every)]
    # The uninterrupted reference trains beside the Slurm job (it is mostly waiting to be requeued).
    ref_dir = tmp_path / "ref"
    reference = warm.Popen([*FLCTL, "run", *cell, "--results-dir", str(ref_dir)], stdout=warm.PIPE,
                           stderr=warm.STDOUT, env={**os.environ, "COLUMNS": "200"})
    leftovers["procs"].append(reference)

    results = tmp_path / "sweep"
    results.mkdir()
    [cfg] = plan(spec_from_values("two-moons", {"method": "fl", "eps": "0.1", "epochs": str(epochs),
                                                "eval_every": str(every)}, device="cpu"))
    url = f"sqlite:///{results / 'flctl.db'}"
    store = Store.open(url)
    store.create_sweep("preempted", None, "two-moons", {}, [cfg])
    folder = results / "jobs" / "preempted"
    [job] = submit(Worker(WorkerRecipe(url, str(results), "preempted", "slurm")), [Slot(0)])
    leftovers["jobs"].append(job.job_id)
    assert re.fullmatch(r"\d+", job.job_id), job.job_id                 # one worker: a plain job, no array

    wait_until(lambda: len(record_files(results, cfg.run_id)) >= 3, "the job to train a few epochs",
               interval=0.1, logs=folder)
    assert store.get_run(cfg.run_id).status == "running"
    job._interrupt()                                         # preemption: SIGTERM, then USR2 -> checkpoint()
    wait_until(lambda: store.get_run(cfg.run_id).status == "interrupted", "the run to be handed back", timeout=30,
               interval=0.1, logs=folder)
    files = record_files(results, cfg.run_id)

    # REQUEUED -> PENDING -> RUNNING (a requeued job waits cred_expire, 10 s, before it may start again).
    wait_until(job.done, "the requeued job to finish", interval=1, logs=folder)
    outcome = job.result()
    assert outcome == {cfg.run_id: "completed"}, outcome
    run = store.get_run(cfg.run_id)
    # A preempted attempt is handed back (store.requeue) and does not count against --max-attempts.
    assert run.status == "completed" and run.attempts == 1 and run.job_id == job.job_id, run
    log = Path(job.paths.stdout).read_text() + Path(job.paths.stderr).read_text()
    assert "this job is preempted" in log and "Requeued job" in log, log[-3000:]
    base = job.job_id.split("_")[0]
    shown = subprocess.run(["scontrol", "show", "job", base], capture_output=True, text=True).stdout
    assert re.search(r"\bRestarts=1\b", shown), shown                 # SLURM_RESTART_COUNT=1 in the job
    history = wait_until(lambda: (lambda r: r if ("COMPLETED" in {s for _, s in r}) else None)(
        sacct(base, duplicates=True)), "sacct to show the requeued job completed")
    assert [s for _, s in history] == ["REQUEUED", "COMPLETED"], history

    assert_resumed(files, record_files(results, cfg.run_id))
    b = assert_complete_records(results, cfg.run_id, epochs, every)
    out, _ = reference.communicate(timeout=240)
    assert reference.returncode == 0, out
    [ref_run] = Store.open(f"sqlite:///{ref_dir / 'flctl.db'}").list_runs()
    assert ref_run.id == cfg.run_id                                # same config, same run
    a = records.read(ref_dir / "records", [cfg.run_id]).sort_by(RECORD_ORDER)
    assert a.equals(b), "records of the preempted run differ from an uninterrupted run"
    assert run.metrics == pytest.approx(ref_run.metrics)
    store.close()


def test_cancel_stops_the_array_hands_cells_back_and_rerun_finishes(tmp_path: Path, leftovers) -> None:
    # A worker that started a few seconds ahead may finish its first cell and take the third before the other has
    # three records, so the third can be handed back with too few records to tell a resume: the test follows the
    # handed-back cell that got furthest (the slower worker's has three records: that is what the wait waits for).
    # 4000 epochs: grouped cells train 1000 in seconds, and under a loaded suite all three had completed before
    # `flctl cancel` (a process that imports first) got its signal to them
    epochs, every = 4000, 50
    cell = ("two-moons", "--method", "fl", "--eps", "0.1", "--epochs", str(epochs), "--eval-every", str(every))
    args = ("sweep", *cell, "--seed", "0,1,2", "--executor", "slurm", "--workers", "2", "--checkpoint-every", "0.5")
    first = flctl(tmp_path, *args)
    assert first.returncode == 0, first.stdout + first.stderr
    array = submitted_job(first.stdout)
    leftovers["jobs"].append(array)
    store = Store.open(f"sqlite:///{tmp_path / 'flctl.db'}")
    wait_until(lambda: sum(r.status == "running" for r in store.list_runs()) == 2
               and all(len(record_files(tmp_path, r.id)) >= 3 for r in store.list_runs() if r.status == "running"),
               "both workers to train a few epochs", interval=0.2, logs=tmp_path / "jobs")
    [sid] = [p.name for p in (tmp_path / "jobs").iterdir()]

    out = flctl(tmp_path, "cancel", sid, "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)["stopped"] == [{"kind": "slurm job", "job_id": array}]
    squeue = subprocess.run(["squeue", "-h", "-j", array], capture_output=True, text=True).stdout
    assert squeue.strip() == "", squeue                                       # no job left
    runs = store.list_runs()
    assert not any(r.status == "running" for r in runs), runs
    handed_back = sorted((r for r in runs if r.epochs_done > 0 and r.status == "interrupted"),
                         key=lambda r: -r.epochs_done)
    assert handed_back and all(r.attempts == 0 for r in handed_back), [(r.id, r.status, r.epochs_done, r.error, r.job_id) for r in runs]
    files = record_files(tmp_path, handed_back[0].id)

    resumed = flctl(tmp_path, *args)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    leftovers["jobs"].append(submitted_job(resumed.stdout))
    wait_until(lambda: statuses(tmp_path)["completed"] == 3, "the re-run to finish the sweep", timeout=300,
               logs=tmp_path / "jobs")
    rid = handed_back[0].id
    assert store.get_run(rid).attempts == 1
    assert_resumed(files, record_files(tmp_path, rid))
    assert_complete_records(tmp_path, rid, epochs, every)
    store.close()


def test_a_plugin_task_named_by_a_spec_trains_on_slurm(tmp_path: Path, leftovers) -> None:
    from tests.test_plugins import task_source

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "blobs_task.py").write_text(task_source("blobs"))
    spec = tmp_path / "blobs.toml"     # task_module relative to the spec's folder; the workers get it resolved
    spec.write_text('task = "blobs"\ntask_module = "mine/blobs_task.py"\nmethod = ["erm", "fl"]\nseeds = 1\n')
    results = tmp_path / "results"
    out = flctl(results, "sweep", "--spec", str(spec), "--executor", "slurm", "--workers", "1")   # one job: both cells
    assert out.returncode == 0, out.stdout + out.stderr
    leftovers["jobs"].append(submitted_job(out.stdout))
    wait_until(lambda: statuses(results)["completed"] == 2, "2 completed plugin cells", logs=results / "jobs")
    store = Store.open(f"sqlite:///{results / 'flctl.db'}")
    runs = store.list_runs()
    store.close()
    assert {r.provenance["task"]["file"] for r in runs} == {str(tmp_path / "mine" / "blobs_task.py")}
    assert all(r.job_id and r.provenance["task"]["origin"] == "file" for r in runs)
