"""`flctl sweep`'s plan and launch: every check first (plan_sweep), then record the sweep, re-queue the cells of
lost workers and start the workers still needed (launch_sweep)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from flctl.config import RunConfig
from flctl.db import STALE_AFTER_S, RunQueue, Store, chunks, lost_cells, run_states
from flctl.devices import resolve_device
from flctl.errors import ConfigError, DeviceLost
from flctl.launch.backends import Slot
from flctl.launch.jobs import live_controllers, live_workers, sweep_jobs
from flctl.launch.settings import LaunchFlags, LaunchSettings
from flctl.launch.worker import Worker, WorkerRecipe, submit
from flctl.loggers import prepare as prepare_loggers
from flctl.status import TRAINABLE, Status

# A --tune sweep adds its next trial's cell a moment after the last one finished: its workers wait this long for
# one before they exit, so that one worker serves trial after trial instead of a new process (torch start-up,
# seconds) per trial.
TUNE_LINGER_S = 10.0


@dataclass
class Launched:
    """What `flctl sweep` did: the sweep's cells, what was already there, and the workers it started."""

    cells: int
    added: int
    completed: int
    requeued: list[str]
    gave_up: list[str]
    todo: int
    live: int
    jobs: list[Any]                # the launcher's jobs, each with a job_id
    here: _Here | None = None


def launch_sweep(store: Store, url: str, root: Path, sid: str, spec, configs: Sequence[RunConfig],
                 settings: LaunchSettings, join: bool = False, recorded: Callable[[], None] | None = None) -> Launched:
    """Record the sweep, re-queue cells of lost workers, and start workers for the cells still to do: never more
    live workers than the settings ask for, counting those of an earlier launch still running.

    With ``join`` (``flctl sweep --wait`` on the local executor) one of the W workers is this process, which would
    otherwise only wait: it has its imports done and needs no start-up; ``Launched.here`` runs it.

    ``recorded``: what is done once the sweep is recorded and before any worker starts (its grid's Optuna study).

    ConfigError, before anything is written, when results/jobs cannot be made private (another user's folder)."""
    sweep_jobs(root, sid)
    added = store.create_sweep(sid, spec.name, spec.task, spec.to_json(), list(configs))
    if recorded is not None:
        recorded()
    ids = [c.run_id for c in configs]
    lost = lost_cells(store, sid)[1] if len(added) < len(ids) else set()
    cells, requeued, gave_up = _requeued(store, ids, set(added), settings.max_attempts)
    todo = [i for i in ids if cells[i][0] in TRAINABLE and cells[i][1] < settings.max_attempts]
    device = configs[0].device if configs else "cpu"
    live, jobs, here = _start(store, url, root, sid, spec, device, len(todo), settings, join, lost)
    return Launched(len(configs), len(added), sum(cells[i][0] == Status.COMPLETED for i in ids), requeued,
                    gave_up, len(todo), live, jobs, here)


def take_over(store: Store, url: str, root: Path, sid: str, spec, device: str, settings: LaunchSettings,
              join: bool = False) -> Launched:
    """A wait's take-over of the sweep's stale cells (their workers lost: no heartbeat for the stale bound, frozen,
    cut off, or dead on this host): re-queued (a frozen worker that wakes finds its claim gone and writes nothing),
    failed where their attempts are used up, and workers started for them as a launch starts them, the lost workers
    not counted as live though their processes may be. ``join`` as launch_sweep's. The Launched of those cells."""
    lost, holders = lost_cells(store, sid)
    cells, requeued, gave_up = _requeued(store, lost, set(), settings.max_attempts)
    todo = [i for i in lost if cells[i][0] in TRAINABLE and cells[i][1] < settings.max_attempts]
    live, jobs, here = _start(store, url, root, sid, spec, device, len(todo), settings, join, lost=holders)
    return Launched(len(lost), 0, 0, requeued, gave_up, len(todo), live, jobs, here)


def _start(store: Store, url: str, root: Path, sid: str, spec, device: str, todo: int, settings: LaunchSettings,
           join: bool, lost: Collection[tuple[str | None, int | None]] = ()) -> tuple[int, list[Any], _Here | None]:
    """Workers started for ``todo`` cells: never more live than the settings ask for, counting those of an earlier
    launch still running but not the ``lost`` ones (host, pid: holders of stale cells). (live, jobs, here)."""
    registered = live_workers(root, sid)
    # a job started by an earlier launch whose worker has not registered yet (a second or so) counts as one; a lost
    # worker's job (its controller lives on too) counts as none
    started = {w["job_id"] for w in registered}
    registered = [w for w in registered if (w["host"], w["pid"]) not in lost]
    live = len(registered) + sum(str(c.pid) not in started for c in live_controllers(root, sid))
    slots = settings.slots(todo, device)
    slots = slots[:max(0, len(slots) - live)] if todo else []
    launcher = settings.launcher
    # what the workers would all make at once (an MLflow store), made here; nothing to train, nothing to set up
    log_to = prepare_loggers(settings.log_to, root, sid) if todo else settings.log_to
    recipe = WorkerRecipe(url, str(root), sid, settings.executor, settings.options, settings.max_attempts,
                          checkpoint_every=settings.checkpoint_every,
                          batch_runs=settings.together(spec.task, todo, len(slots), device),
                          linger_s=TUNE_LINGER_S if spec.tune and not launcher.in_process else 0.0,
                          db_inode=None if store.file is None else store.file.inode, log_to=log_to)
    here = None
    if join and launcher.joins and slots and slots[0].cuda is None:
        # the waiting command syncs the study once all is done; its worker stops with the sweep (no linger)
        here = _Here(Worker(replace(recipe, sync_study=False, linger_s=0.0)), slots[0])
        slots = slots[1:]
    jobs = submit(Worker(recipe), slots)
    if jobs or here:
        store.count_submission(sid)
    return live, jobs, here


def _requeued(store: Store, ids: list[str], added: set[str], max_attempts: int) -> tuple[
        dict[str, tuple[str, int]], list[str], list[str]]:
    """The launch's cells made ready: those of lost workers re-queued (or failed, their attempts used up: reap) and
    the failed ones with attempts left queued again (a new launch tries them again: retry_failed). Returns each
    cell's (status, attempts) after that, the re-queued cells and those given up on. Those just ``added`` are queued
    with no attempt; the others are read by id in chunks, three columns each, and only the running and failed ones
    are handed to the queue: a sweep of 100,000 cells is not loaded with its configs."""
    cells = dict.fromkeys(added, (Status.QUEUED, 0)) | run_states(store, [i for i in ids if i not in added])
    queue, requeued, gave_up = RunQueue(store), list[str](), list[str]()
    for chunk in chunks([i for i in ids if cells[i][0] == Status.RUNNING]):
        back, lost = queue.reap(run_ids=chunk, max_attempts=max_attempts, stale_after=STALE_AFTER_S)
        requeued, gave_up = requeued + back, gave_up + lost
    failed = [i for i in ids if cells[i][0] == Status.FAILED and cells[i][1] < max_attempts]
    retried = [run_id for chunk in chunks(failed) for run_id in queue.retry_failed(chunk, max_attempts=max_attempts)]
    for run_id in (*requeued, *retried):
        cells[run_id] = (Status.QUEUED, cells[run_id][1])
    for run_id in gave_up:
        cells[run_id] = (Status.FAILED, cells[run_id][1])
    return cells, requeued, gave_up


@dataclass
class _Here:
    """A worker to run in this process (see launch_sweep's ``join``)."""

    worker: Worker
    slot: Slot

    def __call__(self) -> int | None:
        """Work until no cell is left; the exit code of the signal that stopped it first (130, 143), else None.
        After a fatal device error this process trains no more (its device context is dead) and only waits: the
        worker started a fresh process in its place and said so on stderr."""
        self.worker.in_caller = True     # the waiting command tells what stopped it
        try:
            self.worker(self.slot)
        except DeviceLost:
            return None
        return self.worker.stopped


@dataclass(frozen=True)
class SweepPlan:
    """A sweep ready to launch (plan_sweep): nothing of it is written yet."""

    spec: Any                     # flctl.sweep.SweepSpec, its device resolved; a grid's names its study's objective
    configs: list[RunConfig]
    sweep_id: str                 # the grid's id; a --tune search's, flctl.sweep.tune_id of its spec
    settings: LaunchSettings
    objective: str
    tune: int | None              # trials of a TPE search; None: the grid
    parallel: int = 1             # trials of a search launched at once


def plan_sweep(spec: Any, flags: LaunchFlags, *, results_root: Path, dry_run: bool = False, allow_large: bool = False, objective: str | None = None, direction: str = "min",
               tune: int | None = None, parallel: int = 1,
               progress: Callable[[int, int], None] | None = None) -> SweepPlan:
    """`flctl sweep`'s plan of ``spec`` (a flctl.sweep.SweepSpec) with the launch ``flags`` over its [launch] table,
    checked in the order a user meets the errors: launch settings, device (flctl.devices.resolve_device), grid (with its data unless ``dry_run``; over MAX_CELLS
    only with ``allow_large``), objective and search space, Slurm script path, and unless ``dry_run`` that the
    executor and the workers' devices are there. The objective and trial count fall back to the spec's.
    ConfigError (TypeError from a malformed [launch] table) before anything is written."""
    from flctl.study import DEFAULT_OBJECTIVE, check_objective, search_space
    from flctl.sweep import plan, seed_note, sweep_id, tune_id

    settings = LaunchSettings.resolve(spec.launch, flags)
    # every worker would fail on a device that does not exist (here: Slurm's nodes are not this machine)
    launcher = settings.launcher
    spec = replace(spec, device=resolve_device(spec.device, here=launcher.runs_here, planning=dry_run))
    configs = plan(spec, check_data=not dry_run, allow_large=allow_large, progress=progress)
    spec = replace(spec, notes=spec.notes + seed_note(spec))
    objective = objective or spec.objective or DEFAULT_OBJECTIVE
    tune = tune if tune is not None else spec.tune
    sid = sweep_id(spec, configs) if tune is None else tune_id(replace(spec, tune=tune, objective=objective))
    check_objective(objective, direction)
    if tune is None:   # the workers mirror finished cells into the sweep's Optuna study with this objective
        spec = replace(spec, objective=objective)
    if tune is not None and (tune < 1 or parallel < 1):
        raise ConfigError(f"--tune and --parallel must be at least 1, got {tune} and {parallel}")
    if tune is not None:
        search_space(spec)     # a search needs a range or a list to search
    launcher.check(results_root, dry_run=dry_run)
    if not dry_run:
        settings.slots(len(configs), configs[0].device)     # e.g. --device cuda without a GPU: fail now
    return SweepPlan(spec, configs, sid, settings, objective, tune, parallel)
