"""Launching a sweep: W pull workers through a launcher (flctl.launch.backends: debug in process, local
subprocesses, Slurm job arrays, or an installed one).

A sweep's cells are rows in the database, not arguments of jobs: each worker (flctl.launch.worker) claims the next
one until none is left. By job: settings (LaunchFlags, LaunchSettings), backends (the launchers, Slot), plan
(`flctl sweep`'s checks and launch), flow (fill a planned sweep: launch or search, wait, sync), worker (the pull loop, its
recipe, and submit: start workers through the launcher), jobs (results/jobs/<sweep>/ and its trust checks),
wait (until a sweep settles), tune (a --tune search), cancel. Each launcher is one file of backends/, its flags,
job-system commands and what its jobs are given included.

The names below are imported on first use, so that the CLI reads LaunchFlags (no database layer) at start-up.
`cancel` is a function of the module of that name, `submit` of worker: import them from there.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOME = {
    "has_workers": "jobs", "live_controllers": "jobs", "live_workers": "jobs", "private_folder": "jobs",
    "queued_jobs": "jobs", "submitted_jobs": "jobs",
    "Launched": "plan", "SweepPlan": "plan", "launch_sweep": "plan", "plan_sweep": "plan",
    "LaunchFlags": "settings", "LaunchSettings": "settings", "batch_runs_for": "settings", "cells_together": "settings",
    "Launcher": "backends", "Slot": "backends", "get_launcher": "backends",
    "SlurmOptions": "backends.slurm", "slurm_workers": "backends.slurm", "local_slots": "backends.local",
    "Worker": "worker", "WorkerRecipe": "worker",
}
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'flctl.launch' has no attribute {name!r}")
    return getattr(importlib.import_module(f"flctl.launch.{_HOME[name]}"), name)
