"""Filling a planned sweep (``fill_sweep``), for `flctl sweep`, `flctl paper` and flctl.api alike: launch its cells
(or run its --tune search), work in this process where asked, wait, sync its Optuna study. What a person sees of
it is the caller's (``Hooks``): the command prints and redraws, the API says nothing."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flctl.db import STALE_AFTER_S
from flctl.launch.plan import Launched, SweepPlan, launch_sweep, take_over
from flctl.launch.wait import CellsLost, check_ground, settle


@dataclasses.dataclass
class Hooks:
    """What the caller shows while a sweep fills (each does nothing by default; ``wait`` waits without a word)."""

    plan: Callable[[Any], None] = lambda plan: None                         # a plan, before anything is launched
    launched: Callable[[Launched, str, Any, Any], None] = lambda launched, sid, spec, settings: None  # each launch
    here: Callable[[Any, str], int | None] = lambda here, sid: here()       # a worker of this process, until done
    # (store, sweep id, results, take_over=...) -> ledger: flctl.launch.wait.settle's
    wait: Callable[..., dict] = settle
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
    data, stopped = _wait(planned, store, url, root, hooks) if wait else (None, None)
    if stopped is not None:
        return Filled(sid, launched, stopped=stopped)
    check_ground(store, root, sid)                  # nothing synced into a database or folder that is gone
    sync_sweep(store, url, sid, planned.objective, direction)
    return Filled(sid, launched, data)


def _wait(planned: SweepPlan, store: Any, url: str, root: Path, hooks: Hooks) -> tuple[dict | None, int | None]:
    """A launch's wait for its sweep: (its settled ledger, None), or (None, the exit code of a signal that stopped a
    worker of this process). Cells of a lost worker met meanwhile (stale: one frozen, cut off, or dead) are taken
    over (flctl.launch.plan.take_over) and said in one line; the worker of its own ``--wait`` would take them only
    once nothing else is left, and a frozen worker's process still counts as live, so no launch would start one.
    A take-over that frees no cell is not tried again in this wait (the next would free none either)."""
    sid, again = planned.sweep_id, True
    while True:
        try:
            return hooks.wait(store, sid, root, take_over=again), None
        except CellsLost as lost:
            stale = lost.stale
            taken = take_over(store, url, root, sid, planned.spec, planned.configs[0].device, planned.settings,
                              join=True)
        again = bool(taken.requeued or taken.gave_up)
        started = len(taken.jobs) + (taken.here is not None)
        hooks.warn(f"sweep {sid}: took over {stale} cell(s) of a lost worker (no heartbeat for "
                   f"{STALE_AFTER_S:g} s, or its process gone): {len(taken.requeued)} re-queued"
                   + (f", {len(taken.gave_up)} failed (attempts used up)" if taken.gave_up else "")
                   + (f", {started} worker(s) started for them" if started else ""))
        if taken.here is not None and (stopped := hooks.here(taken.here, sid)) is not None:
            return None, stopped
