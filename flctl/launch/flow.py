"""Filling a planned sweep (``fill_sweep``), for `flctl sweep`, `flctl paper` and flctl.api alike: launch its cells
(or run its --tune search), work in this process where asked, wait, sync its Optuna study. What a person sees of
it is the caller's (``Hooks``): the command prints and redraws, the API says nothing."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flctl.launch.plan import Launched, SweepPlan, launch_sweep
from flctl.launch.wait import check_ground, settle


@dataclasses.dataclass
class Hooks:
    """What the caller shows while a sweep fills (each does nothing by default; ``wait`` waits without a word)."""

    plan: Callable[[Any], None] = lambda plan: None                         # a plan, before anything is launched
    launched: Callable[[Launched, str, Any, Any], None] = lambda launched, sid, spec, settings: None  # each launch
    here: Callable[[Any, str], int | None] = lambda here, sid: here()       # a worker of this process, until done
    wait: Callable[[Any, str, Path], dict] = settle                         # (store, sweep id, results) -> ledger
    told: Callable[[Any], None] | None = None                               # a --tune trial, as it is told
    warn: Callable[[str], None] = lambda line: None


@dataclasses.dataclass
class Filled:
    """What filling a sweep did: its id, the launch (None: a --tune search), the ledger waited for (None: not
    waited), the Optuna study of a --tune search, and the exit code of a signal that stopped this process's worker."""

    sweep_id: str
    launched: Launched | None = None
    ledger: dict | None = None
    study: Any = None
    stopped: int | None = None


def fill_sweep(planned: SweepPlan, store: Any, url: str, root: Path, *, wait: bool, direction: str = "min",
               hooks: Hooks = Hooks()) -> Filled:
    """Launch ``planned``'s cells not done (with ``wait``, this process is one of the local launcher's workers and
    returns once the sweep settles), or run its --tune search; then sync the sweep's Optuna study. SweepStopped
    where its database or results folder moved meanwhile."""
    from flctl.launch.tune import run_tune
    from flctl.study import make_study, sync_sweep
    from flctl.study_rdb import check_study

    check_study(store, planned.sweep_id, planned.objective, direction)     # before anything of the sweep is written
    if planned.tune is not None:
        study = run_tune(store, url, root, planned.spec, planned.tune, planned.objective, direction,
                         planned.parallel, planned.settings, told=hooks.told, launched=hooks.launched)
        return Filled(study.study_name.removeprefix("flctl-"), study=study)
    sid = planned.sweep_id
    launched = launch_sweep(store, url, root, sid, planned.spec, planned.configs, planned.settings, join=wait,
                            recorded=lambda: make_study(store, url, sid, planned.configs, planned.objective, direction))
    hooks.launched(launched, sid, planned.spec, planned.settings)
    if launched.here is not None and (stopped := hooks.here(launched.here, sid)) is not None:
        return Filled(sid, launched, stopped=stopped)
    data = hooks.wait(store, sid, root) if wait else None
    check_ground(store, root, sid)                  # nothing synced into a database or folder that is gone
    sync_sweep(store, url, sid, planned.objective, direction)
    return Filled(sid, launched, data)
