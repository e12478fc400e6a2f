"""Launching a sweep: W pull workers through submitit, debug (in process), local (subprocesses) or Slurm.

A sweep's cells are rows in the database, not arguments of jobs: each worker (flctl.launch.worker) claims the next
one until none is left. By job: settings (LaunchFlags, LaunchSettings, Slot), plan (`flctl sweep`'s checks and
launch), submit (submitit), worker (the pull loop), jobs (results/jobs/<sweep>/ and its trust checks), slurm (every
Slurm command flctl runs itself), cancel.

The names below are imported on first use, so that the CLI reads LaunchFlags (no database layer) at start-up.
`cancel` and `submit` are functions of the modules of those names: import them from there.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOME = {
    "has_workers": "jobs", "live_controllers": "jobs", "live_workers": "jobs", "private_folder": "jobs",
    "submitted_jobs": "jobs",
    "Launched": "plan", "SweepPlan": "plan", "launch_sweep": "plan", "plan_sweep": "plan",
    "LaunchFlags": "settings", "LaunchSettings": "settings", "Slot": "settings", "SlurmOptions": "settings",
    "batch_runs_for": "settings", "local_slots": "settings", "slurm_workers": "settings",
    "Worker": "worker",
}
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'flctl.launch' has no attribute {name!r}")
    return getattr(importlib.import_module(f"flctl.launch.{_HOME[name]}"), name)
