"""Start a sweep's pull workers through its launcher (flctl.launch.backends), and remember the jobs started."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flctl.launch.backends import Slot
from flctl.launch.jobs import private_folder, remember_jobs
from flctl.layout import Layout

if TYPE_CHECKING:
    from flctl.launch.worker import Worker


def submit(worker: Worker, slots: Sequence[Slot]) -> list[Any]:
    """Start ``worker`` once per slot through its recipe's launcher, and record the jobs (submitted.json) before
    returning, so that `flctl cancel` finds them at once. Returns without waiting, except for a launcher whose
    workers run in this process."""
    if not slots:
        return []
    recipe = worker.recipe
    launcher, layout, root = recipe.launcher, Layout(Path(recipe.results_root)), Path(recipe.results_root)
    folder = private_folder(root, layout.sweep_jobs(recipe.sweep_id))
    jobs = launcher.start(worker, slots, folder, layout.controllers_log(recipe.sweep_id), recipe.per_gpu)
    if not launcher.in_process:
        remember_jobs(layout.submitted(recipe.sweep_id), recipe.executor, jobs)
    return jobs
