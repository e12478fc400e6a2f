"""What a sweep's worker is made of (WorkerRecipe): plain, picklable data, built once by the launch and handed as it is
to every worker of the sweep (flctl.launch.worker)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import flctl.plugins
from flctl.db import STALE_AFTER_S
from flctl.launch.backends import Launcher, make_launcher
from flctl.launch.settings import LaunchSettings


@dataclass(frozen=True)
class WorkerRecipe:
    """What a sweep's worker is made of, built once by the launch (flctl.launch.plan.launch_sweep) and handed as it is
    to each worker, to the worker that replaces one after a device loss, and to a requeued one: plain, picklable
    data. ``plugins``: the plugin task files and modules the launching process used (FLCTL_TASKS, a spec's
    task_module), so that a worker on another node or under another environment loads the same ones."""

    db_url: str
    results_root: str
    sweep_id: str
    executor: str = "local"                     # the launcher (flctl.launch.backends) and its options
    options: Any = None
    max_attempts: int = LaunchSettings.max_attempts
    stale_after: float = STALE_AFTER_S
    checkpoint_every: float = LaunchSettings.checkpoint_every
    batch_runs: int = 1
    linger_s: float = 0.0
    sync_study: bool = True
    plugins: tuple[str, ...] = field(default_factory=lambda: tuple(flctl.plugins.paths()))
    losses_in_a_row: int = 0                    # workers before this one that lost their device with no cell done
    db_inode: int | None = None                 # the SQLite file's, at launch (flctl.db.store.not_the_one)
    log_to: tuple[str, ...] = ()                # the loggers its cells are logged to (flctl.loggers)

    @property
    def launcher(self) -> Launcher:
        return make_launcher(self.executor, self.options)
