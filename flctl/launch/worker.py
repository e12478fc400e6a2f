"""The job body of a sweep: a pull worker that claims the sweep's next cell (RunQueue's compare-and-swap), trains
it, and repeats until none is left, then exits. Cells of different lengths balance themselves, and interpreter and
torch start-up are paid once per worker, not per cell. A cell whose worker died (kill -9, lost node) is claimed
again by any worker once it is stale.

A fatal device error (a device-side assert, an illegal address: the process's CUDA context is dead, and every later
CUDA call in it fails, even a CPU run's seeding) ends the worker: the cells it was training are recorded failed (the
attempt counted; another worker retries them while attempts are left), it starts a fresh worker in its place through
the same executor, and its process exits with DEVICE_LOST_EXIT. Before, such a worker went on claiming cells and failed
each in milliseconds, until every cell's attempts were used up.

Stopping: a worker that gets SIGINT (and SIGTERM and SIGHUP, except under Slurm) finishes the epoch it is in,
checkpoints, hands its cell back (interrupted, attempt not counted) and exits. Under Slurm, SIGTERM keeps submitit's meaning
(preemption: USR2 follows and ``Worker.checkpoint`` hands the cell back and requeues the job)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import submitit
from sqlalchemy.exc import SQLAlchemyError

import flctl.plugins
from flctl.claimed import ground_moved
from flctl.db import RunQueue, Store, not_the_one, poll_delays
from flctl.errors import DEVICE_LOST_EXIT, DatabaseDeleted, DeviceLost
from flctl.launch.backends import Slot
from flctl.launch.claims import ClaimedTogether, TaskUnavailable, claim_together
from flctl.launch.jobs import registered, remember_jobs, sweep_jobs
from flctl.launch.recipe import WorkerRecipe
from flctl.launch.wait import DiskNote
from flctl.layout import Layout
from flctl.results import open_sweep
from flctl.runner import Ending, Next, git_revision, stop_on_signals, train_claimed
from flctl.study import sync_sweep

_LINGER_POLL_S = 0.2
# Workers in a row (each the replacement of the last) that may lose their device before one of them finishes a cell.
MAX_DEVICE_LOSSES_IN_A_ROW = 3


class Worker(submitit.helpers.Checkpointable):
    """The job body: pull the sweep's cells one at a time until none is left. Picklable; holds only plain data."""

    def __init__(self, recipe: WorkerRecipe) -> None:
        self.recipe = recipe
        self.slot: Slot | None = None            # where it runs (set when called): its cells' device follows it
        self.current: dict[str, str] = {}        # the cells training now: run id -> claim token
        self.stopped: int | None = None          # the exit code of the signal that stopped it (130, 143)
        self.device_lost: str | None = None      # the fatal device error that ended this worker
        self.failed_cells: list[str] = []        # the cells it was training then
        self.losses_in_a_row = recipe.losses_in_a_row
        self.trained_together = False            # cells together trained to their end (the device worked)
        self.ground_moved: str | None = None     # its database or results folder went away: it stopped
        self.disk_full: str | None = None        # the disk filled up: it stopped
        self.disk_note: DiskNote | None = None   # where it tells a waiting command so, while it works
        # it runs inside the command that launched it (the debug launcher, `sweep --wait`'s own worker), which tells
        # a database failure itself at its next read of the same database: the worker's line would say it twice
        # (any other reason it stops, the command does not know: the worker says it)
        self.in_caller = recipe.launcher.in_process

    @property
    def name(self) -> str:
        """The name its jobs are listed under (squeue, submitit's folders)."""
        return f"flctl-{self.recipe.sweep_id}"

    def __call__(self, slot: Slot) -> dict[str, str]:
        if slot.cuda is not None:   # before CUDA is initialised; submitit's local executor hides every GPU
            os.environ["CUDA_VISIBLE_DEVICES"] = slot.cuda
        self.slot = slot
        flctl.plugins.add(self.recipe.plugins)
        with _torch_threads(slot.threads or self.recipe.launcher.cpus_here()):
            outcome = self._work()
        if self.device_lost is not None:
            self._end_on_device_loss(slot)
        return outcome

    def _work(self) -> dict[str, str]:
        r = self.recipe
        if (store := self._open_store()) is None:
            return {}
        layout = Layout(Path(r.results_root))
        job_id, git_sha = r.launcher.current_job(), git_revision()
        outcome: dict[str, str] = {}
        with registered(Path(r.results_root), r.sweep_id, job_id, r.executor), \
                DiskNote.reserved(Path(r.results_root), r.sweep_id) as self.disk_note, \
                stop_on_signals(r.launcher.stop_signals) as stop:
            try:
                while not stop.is_set() and self._next_cells(store, layout, job_id, git_sha, stop, outcome):
                    pass
                if r.sync_study and outcome and self.ground_moved is None:
                    _sync_study_once(store, r.db_url, r.sweep_id)
            except (KeyboardInterrupt, SystemExit):
                # a second signal (a terminal's Ctrl-C reaches a local job twice: from the terminal and through its
                # controller) between a claim and its training: the cells claimed go back, never left running
                # until the stale bound (train_claimed hands back what it trains itself)
                if self.current:
                    RunQueue(store).requeue_all(dict(self.current), "interrupted before it trained; claim it again")
                raise
            finally:
                store.close()
                self.stopped = stop.exit_code if stop.is_set() else None
                self.disk_note = None        # a worker is pickled (submitit's checkpoint): plain data only
        return outcome

    def _open_store(self) -> Store | None:
        """The sweep's database, as the launch left it; None (and why, said) where it was deleted or replaced."""
        r = self.recipe
        try:
            store = open_sweep(r.db_url)
        except DatabaseDeleted as exc:
            self._ground_gone(str(exc))
            return None
        if (replaced := not_the_one(store, r.db_inode)) is not None:
            store.close()
            self._ground_gone(replaced)
            return None
        return store

    def _ground_gone(self, why: str) -> bool:
        """Its database or results folder went away: said, and kept; False (this worker stops)."""
        print(f"flctl worker: {why}; this worker stops and writes no more", file=sys.stderr)
        self.ground_moved = why
        return False

    def _next_cells(self, store: Store, layout: Layout, job_id: str | None, git_sha: str | None, stop: Any,
                    outcome: dict[str, str]) -> bool:
        """Claim the next cells and train them, their outcomes into ``outcome``; False: this worker stops (nothing
        left to claim, or what it met would stop the next cells alike)."""
        r = self.recipe
        if (moved := ground_moved(store, layout.root)) is not None:     # claim nothing in a new file
            return self._ground_gone(moved)
        try:
            claimed = self._claim(store, job_id, git_sha) or self._linger(store, job_id, git_sha, stop)
        except TaskUnavailable as exc:   # the next cells would fail alike: leave them to other workers
            outcome[exc.run_id] = "failed: task unavailable"
            print(f"flctl worker: {exc}", file=sys.stderr)
            return False
        except SQLAlchemyError as exc:  # the database's disk is full: one line, not a traceback
            if (full := store.disk_full(exc)) is None:
                raise
            self._stop_on_full_disk(full)
            return False
        if not claimed:
            return False
        self.current = {c.run_id: token for c, token in claimed}
        try:
            ending = train_claimed([c for c, _ in claimed], dict(self.current), store, layout,
                                   checkpoint_every=r.checkpoint_every, stop=stop.is_set,
                                   max_attempts=r.max_attempts, log_to=r.log_to, sweep_id=r.sweep_id)
        finally:
            self.current = {}
        return self._after(ending, [c.run_id for c, _ in claimed], outcome)

    def _after(self, ending: Ending, ids: list[str], outcome: dict[str, str]) -> bool:
        """What this worker does once its cells ended, as their row says (flctl.outcomes.OUTCOMES: the cells are
        recorded already); False: it stops."""
        error = ending.error
        outcome.update((result.run_id, result.status) for result in ending.results)
        if error is not None:
            outcome.update((i, f"failed: {type(error).__name__}") for i in ids if i not in outcome)
        match ending.outcome.next:
            case Next.GO_ON:
                self.trained_together = self.trained_together or error is None
                return True
            case Next.DISK_FULL:
                self._stop_on_full_disk(error if isinstance(error, OSError) else OSError(str(error)))
            case Next.GROUND_GONE:
                return self._ground_gone(str(error))
            case Next.DEVICE_LOST:
                self.device_lost = f"{type(error).__name__}: {_first_line(error)}" if error else "?"
                self.failed_cells = ids
            case Next.STOP if error is not None and not (self.in_caller and ending.outcome.name == "database"):
                print(f"flctl worker: {ending.line(ids[0])}; this worker stops", file=sys.stderr)
        return False

    def _claim(self, store: Store, job_id: str | None, git_sha: str | None) -> ClaimedTogether:
        """The next cell, and up to ``batch_runs - 1`` more that can train together with it (flctl.launch.claims)."""
        self.current = {}               # held from each claim on: a second signal hands them back (_work)
        return claim_together(RunQueue(store), self.recipe, self.slot, self.current, job_id=job_id, git_sha=git_sha)

    def _linger(self, store: Store, job_id: str | None, git_sha: str | None, stop) -> ClaimedTogether:
        """Wait up to ``linger_s`` for a cell to be added (a --tune sweep's next trial); [] when none came."""
        deadline = time.monotonic() + self.recipe.linger_s
        for delay in poll_delays(_LINGER_POLL_S):   # the next trial comes a tell and an ask after this cell's end
            if time.monotonic() >= deadline or stop.is_set():
                break
            time.sleep(delay)
            if claimed := self._claim(store, job_id, git_sha):
                return claimed
        return []

    def _stop_on_full_disk(self, exc: OSError) -> None:
        """Stop, and say why where a waiting command reads it with no disk write (DiskNote): the database may be on
        the full disk, and the cells this worker held then stay marked running under its pid."""
        self.disk_full = str(exc)
        if self.disk_note is not None:
            self.disk_note.tell(str(exc))
        print(f"flctl worker: {exc}; this worker stops: free some space, then `flctl sweep` again resumes the "
              "sweep's cells from their checkpoints", file=sys.stderr)

    def _end_on_device_loss(self, slot: Slot) -> None:
        """After a fatal device error: start a fresh worker in this one's place while the sweep has cells to do, then
        end this process with DEVICE_LOST_EXIT (a submitit job), or raise DeviceLost (a worker in the calling
        process of `sweep --wait`, which must not exit, goes on waiting)."""
        # A fresh process that also loses its device before it finishes a cell is replaced too, but not for ever: a
        # GPU that is broken (not one cell's fault) would otherwise start worker after worker.
        self.losses_in_a_row = 1 if self.trained_together else self.losses_in_a_row + 1
        in_process = self.recipe.launcher.in_process
        replaced = (not in_process and self.losses_in_a_row < MAX_DEVICE_LOSSES_IN_A_ROW
                    and self._cells_left() and self._start_replacement(slot))
        then = ("a fresh worker takes its place" if replaced else
                f"no worker was started in its place ({self.losses_in_a_row} workers in a row lost their device "
                "without finishing a cell)" if self.losses_in_a_row >= MAX_DEVICE_LOSSES_IN_A_ROW else
                "no worker was started in its place")
        message = (f"fatal device error in cells {', '.join(self.failed_cells) or '?'} ({self.device_lost}); this "
                   f"process's device context is dead: it stops claiming cells, {then}")
        print(f"flctl worker: {message} (exit {DEVICE_LOST_EXIT})", file=sys.stderr, flush=True)
        if not in_process and self.recipe.launcher.current_job() is not None:     # a job of its own (not in the launching process)
            sys.stdout.flush()
            # Not sys.exit: interpreter teardown would make CUDA calls on the dead context (and can hang in them).
            os._exit(DEVICE_LOST_EXIT)
        if not in_process:    # submitit's debug jobs open a debugger on an exception: return instead
            raise DeviceLost(message)

    def _cells_left(self) -> bool:
        store = open_sweep(self.recipe.db_url)
        try:
            return RunQueue(store).has_to_do(self.recipe.sweep_id, max_attempts=self.recipe.max_attempts)
        finally:
            store.close()

    def _start_replacement(self, slot: Slot) -> bool:
        """One worker like this one, for the same slot, through the same executor (a new process: a new context)."""
        try:
            # one worker, for this slot (a per-gpu Slurm job of K tasks would start K)
            submit(Worker(replace(self.recipe, losses_in_a_row=self.losses_in_a_row)), [replace(slot, shared=1)])
        except Exception as exc:        # the sweep goes on with its other workers; `flctl sweep` again starts more
            print(f"flctl worker: could not start a worker in this one's place: {_first_line(exc)}", file=sys.stderr)
            return False
        return True

    def checkpoint(self, slot: Slot) -> submitit.helpers.DelayedSubmission:
        # Called from submitit's signal handler on preemption/timeout, while runs train in this process: hand
        # them back (their epoch checkpoints are on disk) so the requeued worker, or any other, resumes them.
        if self.current:
            store = open_sweep(self.recipe.db_url)
            try:
                for run_id, token in self.current.items():
                    RunQueue(store).requeue(run_id, token, "preempted or timed out; job requeued")
            finally:
                store.close()
        return submitit.helpers.DelayedSubmission(Worker(self.recipe), slot)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:300]


def _sync_study_once(store: Store, url: str, sweep_id: str) -> None:
    """The sweep's finished cells into its Optuna study (flctl.study.sync_sweep: one sync at a time per database;
    while another runs, this one returns at once and leaves them to it). A failed sync is not the worker's failure."""
    try:
        sync_sweep(store, url, sweep_id, wait=False)
    except Exception as exc:
        # the database not answering (its server gone, SQLite's lock held past its wait): the next sync catches up,
        # and a database that is gone for good is told by the worker's next write, in one line
        if any(c.__name__ in ("OperationalError", "InterfaceError") for c in type(exc).__mro__):
            return
        print(f"flctl worker: could not sync the Optuna study of sweep {sweep_id}: {_first_line(exc)}",
              file=sys.stderr)


@contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    """torch's intra-op threads set to ``threads`` (when given) while the worker works, then put back: a worker may
    run in the calling process (the debug executor, `flctl sweep --wait`, `flctl paper`, flctl.api), whose later
    work would otherwise keep them; on 2 cores beside another busy process, 2 threads made a test 4-13x slower."""
    if not threads:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def submit(worker: Worker, slots: Sequence[Slot]) -> list[Any]:
    """Start ``worker`` once per slot through its recipe's launcher, and record the jobs (submitted.json) before
    returning, so that `flctl cancel` finds them at once. Returns without waiting, except for a launcher whose
    workers run in this process."""
    if not slots:
        return []
    recipe = worker.recipe
    launcher, layout, root = recipe.launcher, Layout(Path(recipe.results_root)), Path(recipe.results_root)
    folder = sweep_jobs(root, recipe.sweep_id)
    jobs = launcher.start(worker, slots, folder, layout.controllers_log(recipe.sweep_id))
    if not launcher.in_process:
        remember_jobs(layout.submitted(recipe.sweep_id), recipe.executor, jobs)
    return jobs
