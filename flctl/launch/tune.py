"""`flctl sweep --tune N`: a TPE search over a sweep's axes (flctl.tpe_search.tune), its trials' cells launched as any
sweep's are (flctl.launch.plan.launch_sweep), one by one or ``parallel`` at a time, until N trials are told."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flctl.config import RunConfig
from flctl.db import Store
from flctl.launch.jobs import has_workers
from flctl.launch.plan import Launched, launch_sweep
from flctl.launch.settings import LaunchSettings
from flctl.layout import Layout

# Workers a --tune may start in a row for trials no worker took before it gives up (they die at start-up).
MAX_REVIVALS = 3


class TuneFailed(Exception):
    """A search that cannot go on, or ended without a value: one line for the user (exit 1)."""


@dataclasses.dataclass(frozen=True)
class Trial:
    """A trial as it is told: its number (from 0), the parameters it tried, its run, and its objective (None: the
    run has no value; ``status`` says why)."""

    number: int
    params: dict[str, Any]
    run_id: str
    value: float | None
    status: str


def run_tune(store: Store, url: str, root: Path, spec: Any, n_trials: int, objective: str, direction: str,
             parallel: int, settings: LaunchSettings, told: Callable[[Trial], None] | None = None,
             launched: Callable[[Launched, str, Any, LaunchSettings], None] | None = None) -> Any:
    """Search ``n_trials`` trials of ``spec``'s axes for the best ``objective`` (``direction`` min or max); each
    trial's cell is launched through ``settings``. Returns the Optuna study, whose best trial has a value;
    ``told`` hears of each trial as it is told, ``launched`` of each launch (flctl.launch.flow.Hooks). TuneFailed
    when workers keep dying before they take a trial, or no trial ended with a value."""
    from flctl.study import params_of, search_space
    from flctl.sweep import resolve_cell, tune_id
    from flctl.tpe_search import tune

    spec = dataclasses.replace(spec, tune=n_trials, objective=objective)
    sid = tune_id(spec)
    revived: list[str] = []
    names = list(search_space(spec))

    def launch(configs: list[RunConfig], revival: bool = False) -> None:
        if not revival:
            revived.clear()
        done = launch_sweep(store, url, root, sid, spec, configs, settings)
        if launched is not None:
            launched(done, sid, spec, settings)

    def revive(configs: list[RunConfig]) -> None:
        """Start a worker for trials' runs still queued when no worker of the sweep is alive (see flctl.tpe_search.tune)."""
        if has_workers(root, sid):
            return
        if len(revived) >= MAX_REVIVALS:   # workers that die before claiming anything: stop, do not loop
            raise TuneFailed(f"sweep {sid}: {MAX_REVIVALS} workers in a row exited without taking run(s) "
                             f"{', '.join(c.run_id for c in configs)}; see the job logs in {Layout(root).sweep_jobs(sid)}")
        revived.append(configs[0].run_id)
        launch(configs, revival=True)

    def fetch(run_ids: list[str]) -> dict[str, dict]:
        return {r["id"]: r for r in store.sweep_runs(sid) if r["id"] in set(run_ids)}

    def on_told(number: int, cfg: RunConfig, row: dict, value: float | None) -> None:
        if told is not None:
            told(Trial(number, params_of(cfg, names), cfg.run_id, value, row["status"]))

    study = tune(spec, sid, n_trials, objective, direction, store=store, url=url,
                 resolve_cell=lambda p: resolve_cell(spec, p), launch=launch, fetch=fetch, revive=revive,
                 parallel=parallel, told=on_told)
    if not any(t.value is not None for t in study.get_trials(deepcopy=False)):
        raise TuneFailed(f"sweep {sid}: no trial finished with a value of {objective}; see `flctl status {sid}`")
    return study
