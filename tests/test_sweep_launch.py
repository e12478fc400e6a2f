"""Sweeps through real subprocesses (submitit's local executor): pull workers, kill -9 recovery, cancel."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from flctl import records
from flctl.db import Store
from flctl.errors import ConfigError
from flctl.launch.backends import Slot
from flctl.launch.backends.local import local_slots
from tests import warm
from tests.helpers import in_process, wait_until

# Slow (pyproject.toml's markers; `pytest -m "not slow"` is the fast loop): real pull workers, killed and cancelled
# mid-sweep: 117 s of the suite's 904 s of test time (2 cores, xdist -n 2).
pytestmark = pytest.mark.slow

FLCTL = [sys.executable, "-m", "flctl"]
ORDER = [("epoch", "ascending"), ("split", "ascending"), ("sample_id", "ascending")]


def flctl(results: Path, *args: str) -> subprocess.CompletedProcess:
    """`flctl *args` as a process forked warm (tests/warm.py); the workers it starts are real interpreters."""
    return warm.run([*FLCTL, *args, "--results-dir", str(results)], capture_output=True, timeout=300,
                    env={**os.environ, "COLUMNS": "200"})


def ledger(results: Path, sweep: str | None = None) -> dict:
    out = in_process("status", *([sweep] if sweep else []), "--json", "--results-dir", str(results))   # polled
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def worker_pids(results: Path) -> set[int]:
    """Live submitit job processes working for sweeps under ``results``, from /proc (not from flctl's own
    bookkeeping): the command line runs submitit's job entry point with a folder under results/jobs/."""
    pids = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if "submitit.core._submit" in cmd and str(results / "jobs") in cmd and state != "Z":
            pids.add(int(proc.name))
    return pids


def same_records(a_root: Path, b_root: Path, run_id: str) -> bool:
    a = records.read(a_root / "records", [run_id]).sort_by(ORDER)
    b = records.read(b_root / "records", [run_id]).sort_by(ORDER)
    return len(a) > 0 and a.equals(b)


def test_slots_on_cpu_and_on_gpus() -> None:
    assert local_slots(25, device="cpu", cores=2) == [Slot(0, 1), Slot(1, 1)]
    assert local_slots(25, device="cpu", cores=8, threads=2) == [Slot(i, 2) for i in range(4)]
    assert local_slots(25, device="cpu", cores=8, workers=3) == [Slot(i, 2) for i in range(3)]
    assert local_slots(1, device="cpu", cores=8) == [Slot(0, 8)]                    # never more workers than cells
    gpus = ["0", "1"]
    assert [s.cuda for s in local_slots(25, device="cuda", cores=16, per_gpu=2, gpus=gpus)] == ["0", "0", "1", "1"]
    assert [s.threads for s in local_slots(25, device="cuda", cores=16, per_gpu=2, gpus=gpus)] == [4] * 4
    assert [s.cuda for s in local_slots(25, device="cuda:1", cores=16, per_gpu=3, gpus=gpus)] == ["1"] * 3
    with pytest.raises(ConfigError, match="no CUDA device"):
        local_slots(5, device="cuda", gpus=[])
    with pytest.raises(ConfigError, match="--per-gpu must be an integer of at least 1"):
        local_slots(5, device="cpu", per_gpu=0)


def test_a_slurm_worker_takes_as_many_threads_as_slurm_gave_it(monkeypatch) -> None:
    from flctl.launch.backends.slurm import Slurm

    for name in ("SLURM_CPUS_PER_TASK", "SLURM_CPUS_ON_NODE"):
        monkeypatch.delenv(name, raising=False)
    assert Slurm.cpus_here() is None                                  # outside Slurm: torch's own default
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "1")
    assert Slurm.cpus_here() == 1
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "3")                # --cpus-per-task wins over the node's count
    assert Slurm.cpus_here() == 3


def test_a_worker_in_this_process_puts_torchs_threads_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `--wait` makes the calling process one of the workers (as `flctl paper` and flctl.api do): its threads are
    # the worker's while it trains, the caller's again after; kept at 2 they made later tests here 4-13x slower.
    before, seen, original = torch.get_num_threads(), [], torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (seen.append(n), original(n))[1])
    out = in_process("sweep", "two-moons", "--method", "erm", "--epochs", "1", "--workers", "1", "--threads",
                     str(before + 1), "--wait", "--results-dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert seen == [before + 1, before] and torch.get_num_threads() == before


def test_pull_workers_never_exceed_w_and_rerun_submits_nothing(tmp_path: Path) -> None:
    args = ("sweep", "two-moons", "--method", "fl,rfl", "--alpha", "1e-2..1", "--seeds", "2", "--epochs", "30",
            "--workers", "2", "--threads", "1", "--executor", "local")
    peak, done = [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], len(worker_pids(tmp_path)))
            done.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    first = flctl(tmp_path, *args)
    assert first.returncode == 0, first.stderr
    assert "8 cells, 8 new" in first.stdout and "2 worker job(s) through local" in first.stdout, first.stdout
    wait_until(lambda: ledger(tmp_path)["total"]["completed"] == 8, "8 completed cells")
    wait_until(lambda: not worker_pids(tmp_path), "the workers to exit once no cell is left")
    done.set()
    sampler.join()
    assert 1 <= peak[0] <= 2, peak
    # The workers mirrored the finished cells into the sweep's Optuna study as they exited (`status` only reads).
    import optuna

    [summary] = optuna.get_all_study_summaries(f"sqlite:///{tmp_path / 'flctl.db'}")
    assert summary.n_trials == 8
    again = flctl(tmp_path, *args)
    assert "0 new, 8 completed" in again.stdout and "0 to do" in again.stdout and "through" not in again.stdout
    runs = json.loads(flctl(tmp_path, "runs", "--json").stdout)
    assert len(runs) == 8 and all(r["attempts"] == 1 for r in runs)
    assert len({r["job_id"] for r in runs}) <= 2                 # two workers shared the eight cells


def test_killed_worker_cell_is_finished_by_the_survivor_with_identical_records(tmp_path: Path) -> None:
    cell = ("two-moons", "--method", "fl", "--eps", "0.1", "--epochs", "400", "--eval-every", "10")
    results = tmp_path / "sweep"
    # one cell at a time (--batch-runs 1): the finished cell's records equal its `flctl run` bit for bit
    args = ("sweep", *cell, "--seed", "0,1,2", "--workers", "2", "--threads", "1", "--executor", "local",
            "--batch-runs", "1")
    assert flctl(results, *args).returncode == 0
    store = Store.open(f"sqlite:///{results / 'flctl.db'}")
    # Wait until a worker has written a few records of its cell, then kill it with SIGKILL (no cleanup).
    files = lambda: list((results / "records").glob("run_id=*/epoch=*.parquet"))   # noqa: E731
    wait_until(lambda: len(files()) >= 3, interval=0.01)
    victim = next(r for r in store.list_runs() if r.status == "running")
    os.kill(victim.pid, signal.SIGKILL)
    # The dead pid makes the cell stale at once; the surviving worker claims it after its own cell.
    wait_until(lambda: ledger(results)["total"]["completed"] == 3, "the survivor to finish all three cells")
    run = store.get_run(victim.id)
    assert run.status == "completed" and run.attempts == 2 and run.pid != victim.pid
    reference = in_process("run", *cell, "--seed", str(victim.seed), "--results-dir", str(tmp_path / "ref"))
    assert reference.returncode == 0, reference.stderr
    assert len(records.read(results / "records", [victim.id])) == 40 * 2 * 1000
    assert same_records(tmp_path / "ref", results, victim.id)                 # no lost, no duplicated rows


def test_cancel_stops_workers_hands_cells_back_and_rerun_finishes(tmp_path: Path) -> None:
    # 1000 epochs: a cell is still at about epoch 400 when cancel's signal lands (about 8 ms an epoch here)
    cell = ("two-moons", "--method", "fl", "--eps", "0.1", "--epochs", "1000", "--eval-every", "50")
    # one cell at a time (--batch-runs 1): a resumed cell's records equal its `flctl run` bit for bit (grouped cells
    # equal it up to float rounding: tests/test_grouped.py)
    args = ("sweep", *cell, "--seed", "0,1,2", "--workers", "2", "--threads", "1", "--executor", "local",
            "--checkpoint-every", "0.2", "--batch-runs", "1")
    results = tmp_path / "sweep"
    assert flctl(results, *args).returncode == 0
    store = Store.open(f"sqlite:///{results / 'flctl.db'}")
    wait_until(lambda: sum(r.status == "running" for r in store.list_runs()) == 2
               and len(list((results / "records").glob("run_id=*/epoch=*.parquet"))) >= 4, interval=0.05)
    [sid] = [p.name for p in (results / "jobs").iterdir()]

    out = flctl(results, "cancel", sid[:6], "--json")
    assert out.returncode == 0, out.stderr
    stopped = json.loads(out.stdout)
    assert len(stopped["stopped"]) == 2 and stopped["killed"] == []              # both stopped cleanly
    assert not worker_pids(results)
    runs = store.list_runs()
    assert not any(r.status == "running" for r in runs)
    interrupted = [r for r in runs if r.status == "interrupted" and r.epochs_done > 0]
    assert interrupted and all(r.attempts == 0 for r in interrupted)          # a handed-back attempt is not counted
    # the workers hand their cells back themselves: those count too (it said "0 running cell(s) handed back")
    assert sorted(stopped["handed_back"]) == sorted(r.id for r in runs if r.status == "interrupted")
    assert len(stopped["handed_back"]) == 2
    assert all((results / "runs" / r.id / "checkpoint.pt").exists() for r in interrupted)
    again = flctl(results, "cancel", sid)
    assert again.returncode == 0 and "nothing to cancel" in again.stdout

    # --wait: the re-run's own process is one of its two workers (started above as two new interpreters)
    resumed = flctl(results, *args, "--wait")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "1 worker job(s) through local" in resumed.stdout and "and one in this process" in resumed.stdout
    assert ledger(results)["total"]["completed"] == 3
    run = store.get_run(interrupted[0].id)
    assert run.attempts == 1                                                  # one counted attempt in all
    reference = in_process("run", *cell, "--seed", str(run.seed), "--results-dir", str(tmp_path / "ref"))
    assert reference.returncode == 0, reference.stderr
    assert same_records(tmp_path / "ref", results, run.id)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run with CUDA_VISIBLE_DEVICES set)")
def test_local_sweep_on_cuda_runs_per_gpu_workers_on_the_gpu(tmp_path: Path) -> None:
    out = flctl(tmp_path, "sweep", "two-moons", "-m", "fl", "--seed", "0,1,2,3", "--epochs", "5", "--device", "cuda",
                "--per-gpu", "2", "--batch-runs", "1", "--wait")
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{2 * torch.cuda.device_count()} worker job(s) through local" in out.stdout, out.stdout
    runs = json.loads(flctl(tmp_path, "runs", "--json").stdout)
    assert [r["status"] for r in runs] == ["completed"] * 4 and {r["device"] for r in runs} == {"cuda"}
