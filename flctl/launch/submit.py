"""Start a sweep's W pull workers through submitit: debug (in process), local (subprocesses) or Slurm job arrays."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import submitit

from flctl.db import STALE_AFTER_S
from flctl.knobs import (
    DEFAULT_CHECKPOINT_EVERY_S,
    DEFAULT_MAX_ATTEMPTS,
)
from flctl.launch.jobs import private_folder, remember_jobs
from flctl.launch.settings import Slot, SlurmOptions
from flctl.launch.slurm import check_executor
from flctl.launch.worker import Worker
from flctl.layout import Layout


@contextlib.contextmanager
def _stdio_to(path: Path):
    """Point fds 1 and 2 at a file while local job controllers are spawned.

    submitit's local controllers inherit the submitting process's stdout/stderr; left attached, a pipe
    reader (`flctl sweep | tee`, subprocess capture) would wait until every job has finished.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600), "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def submit(sweep_id: str, slots: Sequence[Slot], *, db_url: str, results_root: Path, executor: str,
           slurm: SlurmOptions | None = None, per_gpu: int = 1, max_attempts: int = DEFAULT_MAX_ATTEMPTS,
           stale_after: float = STALE_AFTER_S, checkpoint_every: float = DEFAULT_CHECKPOINT_EVERY_S,
           batch_runs: int = 1, linger_s: float = 0.0, losses_in_a_row: int = 0) -> list[submitit.Job]:
    """Start one pull worker per slot (a job array; under Slurm with ``per_gpu`` K, K workers per job as K
    tasks sharing the job's GPUs). Returns without waiting, except debug, which runs its worker in process."""
    check_executor(executor)
    if not slots:
        return []
    layout = Layout(results_root)
    folder = private_folder(results_root, layout.sweep_jobs(sweep_id))
    ex = submitit.AutoExecutor(folder=str(folder), cluster=executor)
    params: dict[str, Any] = {"name": f"flctl-{sweep_id}", "timeout_min": 7 * 24 * 60}
    if executor == "slurm":
        params.update((slurm or SlurmOptions()).parameters())
        if per_gpu > 1:
            params["tasks_per_node"] = per_gpu
        # Requeue on preemption/timeout through submitit's checkpointing; Slurm sends USR2 before the end.
        params.setdefault("slurm_signal_delay_s", 120)
        slots = slots[::per_gpu] if per_gpu > 1 else slots
    ex.update_parameters(**params)
    worker = Worker(db_url, str(results_root), sweep_id, executor=executor, max_attempts=max_attempts,
                    stale_after=stale_after, checkpoint_every=checkpoint_every, batch_runs=batch_runs,
                    linger_s=linger_s, slurm=slurm if executor == "slurm" else None, losses_in_a_row=losses_in_a_row)
    if executor == "local":
        with _stdio_to(layout.controllers_log(sweep_id)):
            jobs = ex.map_array(worker, list(slots))
    else:
        jobs = ex.map_array(worker, list(slots))
    if executor != "debug":
        remember_jobs(layout.submitted(sweep_id), executor, jobs)
    if executor == "debug":  # submitit's debug jobs run in this process when their result is asked for
        for job in jobs:
            job.result()
    return jobs
