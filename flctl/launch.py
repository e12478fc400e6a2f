"""Launching sweep cells through submitit: debug (in process), local (subprocesses) or Slurm (job arrays).

A job runs a pack of cells (run ids) one after the other. Each cell is claimed in the database first, so a
cell is never run twice at once and a completed cell is never run again. On preemption or timeout submitit
calls ``Worker.checkpoint``: the current run is handed back (status queued) and the job is requeued with the
same pack; on restart, finished cells are skipped and the interrupted one resumes from its epoch checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import submitit

from flctl.config import ConfigError, RunConfig
from flctl.runner import Layout, execute
from flctl.store import STALE_AFTER_S, Store

EXECUTORS = ("debug", "local", "slurm")
DEFAULT_MAX_ATTEMPTS = 3


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    gpus: int | None = None
    cpus: int | None = None
    mem_gb: float | None = None
    time_min: int | None = None
    account: str | None = None
    qos: str | None = None
    array_parallelism: int | None = None
    # Extra sbatch options as data (KEY=VALUE -> #SBATCH --KEY=VALUE); never passed through a shell.
    extra: dict[str, str] = field(default_factory=dict)

    def parameters(self) -> dict[str, Any]:
        p: dict[str, Any] = {}
        for key, value in (("slurm_partition", self.partition), ("gpus_per_node", self.gpus),
                           ("cpus_per_task", self.cpus), ("mem_gb", self.mem_gb), ("timeout_min", self.time_min),
                           ("slurm_account", self.account), ("slurm_qos", self.qos),
                           ("slurm_array_parallelism", self.array_parallelism)):
            if value is not None:
                p[key] = value
        if self.extra:
            p["slurm_additional_parameters"] = dict(self.extra)
        return p


class Worker(submitit.helpers.Checkpointable):
    """The job body: train each cell of a pack that is still to do. Picklable; holds only plain data."""

    def __init__(self, db_url: str, results_root: str, max_attempts: int = DEFAULT_MAX_ATTEMPTS,
                 stale_after: float = STALE_AFTER_S) -> None:
        self.db_url, self.results_root = db_url, results_root
        self.max_attempts, self.stale_after = max_attempts, stale_after
        self.current: str | None = None

    def __call__(self, run_ids: Sequence[str]) -> dict[str, str]:
        store = Store.open(self.db_url)
        layout = Layout(Path(self.results_root))
        job_id = _job_id()
        outcome: dict[str, str] = {}
        try:
            for run_id in run_ids:
                row = store.get_run(run_id)
                if row is None or row["status"] == "completed":
                    outcome[run_id] = "skipped" if row else "missing"
                    continue
                cfg = RunConfig.from_json(row["config"])
                self.current = run_id
                try:
                    result = execute(cfg, store, layout, max_attempts=self.max_attempts,
                                     stale_after=self.stale_after, job_id=job_id)
                except Exception as exc:  # recorded as failed by execute; go on with the rest of the pack
                    outcome[run_id] = f"failed: {type(exc).__name__}"
                    continue
                finally:
                    self.current = None
                outcome[run_id] = "held elsewhere" if result is None else result.status
        finally:
            store.close()
        return outcome

    def checkpoint(self, run_ids: Sequence[str]) -> submitit.helpers.DelayedSubmission:
        # Called from submitit's signal handler on preemption/timeout, while a run trains in this process:
        # hand that run back so the requeued job (same pack) can claim it again and resume its checkpoint.
        if self.current is not None:
            store = Store.open(self.db_url)
            try:
                store.requeue(self.current, "preempted or timed out; job requeued")
            finally:
                store.close()
        return submitit.helpers.DelayedSubmission(Worker(self.db_url, self.results_root, self.max_attempts,
                                                         self.stale_after), run_ids)


@contextlib.contextmanager
def _stdio_to(path: Path):
    """Point fds 1 and 2 at a file while local job controllers are spawned.

    submitit's local controllers inherit the submitting process's stdout/stderr; left attached, a pipe
    reader (`flctl sweep | tee`, subprocess capture) would wait until every job has finished.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def _job_id() -> str | None:
    try:
        return submitit.JobEnvironment().job_id
    except RuntimeError:  # not inside a submitit job (debug executor runs in process)
        return None


def check_executor(executor: str) -> None:
    if executor not in EXECUTORS:
        raise ConfigError(f"unknown executor {executor!r}; choose one of: {', '.join(EXECUTORS)}")
    if executor == "slurm" and shutil.which("sbatch") is None:
        raise ConfigError("--executor slurm needs Slurm's commands (sbatch, sacct) on PATH; "
                          "use --executor local on this machine")


def packs(run_ids: Sequence[str], pack: int) -> list[list[str]]:
    """Group cells K per job, so cheap runs share one interpreter start-up."""
    if pack < 1:
        raise ConfigError(f"--pack must be at least 1, got {pack}")
    return [list(run_ids[i:i + pack]) for i in range(0, len(run_ids), pack)]


def submit(run_ids: Sequence[str], *, db_url: str, results_root: Path, executor: str, folder: Path,
           pack: int = 1, slurm: SlurmOptions | None = None, max_attempts: int = DEFAULT_MAX_ATTEMPTS,
           stale_after: float = STALE_AFTER_S, cpus: int | None = None) -> list[submitit.Job]:
    """Submit the cells as one job array (packs of ``pack`` cells); returns without waiting (but debug)."""
    check_executor(executor)
    groups = packs(run_ids, pack)
    if not groups:
        return []
    ex = submitit.AutoExecutor(folder=str(folder), cluster=executor)
    params: dict[str, Any] = {"name": "flctl", "timeout_min": 24 * 60}
    if cpus:
        params["cpus_per_task"] = cpus
    if executor == "slurm":
        params.update((slurm or SlurmOptions()).parameters())
        # Requeue on preemption/timeout through submitit's checkpointing; Slurm sends USR2 before the end.
        params.setdefault("slurm_signal_delay_s", 120)
    else:
        params = {k: v for k, v in params.items() if k in ("name", "timeout_min", "cpus_per_task")}
    ex.update_parameters(**params)
    worker = Worker(db_url, str(results_root), max_attempts, stale_after)
    if executor == "local":
        with _stdio_to(Path(folder) / "controllers.log"):
            jobs = ex.map_array(worker, groups)
    else:
        jobs = ex.map_array(worker, groups)
    if executor == "debug":  # submitit's debug jobs run in this process when their result is asked for
        for job in jobs:
            job.result()
    return jobs
