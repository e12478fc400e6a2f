"""Glue between the training loop and the run database: claim a run, heartbeat it, record its outcome.

Used by ``flctl run`` and by sweep workers. Training itself lives in flctl.train and knows no database.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from flctl.config import RunConfig
from flctl.db import HEARTBEAT_S, STALE_AFTER_S, RunQueue, Store
from flctl.errors import ClaimLost, DiskFull, GroundMoved, is_fatal_device_error
from flctl.knobs import DEFAULT_CHECKPOINT_EVERY_S
from flctl.layout import Layout
from flctl.loggers import Logging
from flctl.status import DISK_FILLED, TRAIN_ALONE, TRAINABLE, Status, blame, error_line
from flctl.versions import git_revision, library_versions


def provenance(cfg: RunConfig) -> dict[str, Any]:
    """What trains ``cfg`` besides its configuration, as each run records it: its task's and its method's module,
    file, source hash and package (flctl.plugins.Source), the library versions (flctl.versions) and what its data
    came from (flctl.tasks.describe_data)."""
    from flctl.method_info import method_source
    from flctl.tasks import describe_data, task_source

    return {"task": task_source(cfg.task).provenance(), "method": method_source(cfg.method).provenance(),
            "libraries": library_versions(), "data": describe_data(cfg)}


def ground_moved(store: Store, root: Path | None) -> str | None:
    """Why this process must stop writing: its database file was deleted or replaced since it opened it, or its
    results folder ``root`` (None: none to watch) is gone. None: both are there."""
    from flctl.db.store import moved

    if (why := moved(store)) is not None:
        return why
    return None if root is None or root.is_dir() else f"the results folder {root} was deleted"


def device_works() -> bool:
    """Whether this process's CUDA context still runs a kernel (False where CUDA was never used: then an error's
    text is all there is to go by). Some errors that name CUDA leave the context usable (a cuBLAS handle that could
    not be made for lack of memory, an invalid argument): those are a cell's own failure."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return False
    try:
        torch.cuda.synchronize()
        return torch.ones(1, device="cuda").add_(1).item() == 2.0
    except Exception:
        return False


class _Heartbeat(threading.Thread):
    """Beats every ``period`` seconds while runs train, with each one's latest epoch count: at most one database
    write per run and period however short the epochs, and long epochs do not look like a lost worker. A beat
    that finds the claim gone (another worker took the run over) stops beating for that run; one that finds the
    database or the results folder gone (``ground``) stops beating for good, and training stops at its next write."""

    def __init__(self, queue: RunQueue, tokens: dict[str, str], period: float,
                 ground: Callable[[], str | None] = lambda: None) -> None:
        super().__init__(daemon=True, name="heartbeat")
        self.queue, self.period, self.tokens, self.ground = queue, period, tokens, ground
        self.epochs_done: dict[str, int | None] = dict.fromkeys(tokens)
        self.stopped = threading.Event()
        self.moved: str | None = None

    def run(self) -> None:
        while not self.stopped.wait(self.period):
            if (moved := self.ground()) is not None:
                self.moved = moved
                return
            for run_id, epochs in list(self.epochs_done.items()):
                try:
                    if not self.queue.heartbeat(run_id, self.tokens[run_id], epochs):
                        self.epochs_done.pop(run_id, None)
                except Exception:  # a missed beat is harmless; the next one retries
                    pass


class _Fence:
    """``fence(run_id)``: whether this process still holds the run's claim and its ground is there (training asks
    before each write, flctl.train). The ground (two stats) is looked at each time; the claims in one query for the
    whole group, which holds for ``fresh`` seconds: fifty grouped cells that evaluate at one epoch (and the writer
    thread before each of their files) ask the database once, not a hundred times, each a connection and a query
    (7 % of a fifty-cell two-moons worker's time). A look at the claims can be that old: a claim is taken over only
    after STALE_AFTER_S without a heartbeat, and a frozen process's clock moves on, so its first ask after it wakes
    looks again. A claim found lost stays lost."""

    def __init__(self, queue: RunQueue, tokens: dict[str, str], ground: Callable[[], str | None],
                 fresh: float = 0.2) -> None:
        self.queue, self.tokens, self.ground, self.fresh = queue, tokens, ground, fresh
        self.held = set(tokens)
        self.looked = -math.inf
        self.lock = threading.Lock()       # the training thread and the writer's ask

    def __call__(self, run_id: str) -> bool:
        if self.ground() is not None:
            return False
        with self.lock:
            if time.monotonic() - self.looked > self.fresh:
                self.held = self.queue.held({r: self.tokens[r] for r in self.held})
                self.looked = time.monotonic()
            return run_id in self.held


class StopRequest:
    """Set by the first stop signal; remembers which one, for the exit code (128 + its number)."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def is_set(self) -> bool:
        return self.signum is not None

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or signal.SIGINT)


@contextlib.contextmanager
def stop_on_signals(signals: Iterable[str] = ("SIGINT", "SIGTERM")) -> Iterator[StopRequest]:
    """One of ``signals`` sets the returned request: training stops at the next epoch boundary, checkpointed, and
    the run is handed back (interrupted). A second signal interrupts at once (KeyboardInterrupt; the run resumes
    from its last checkpoint). Previous handlers come back on exit. Main thread only."""
    requested = StopRequest()

    def handler(signum, _frame) -> None:
        if requested.is_set():
            raise KeyboardInterrupt
        requested.signum = signum

    previous = {sig: signal.signal(sig, handler) for sig in (getattr(signal, name) for name in signals)}
    try:
        yield requested
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def completed(cfg: RunConfig, store: Store, rerun: bool = False) -> Any:
    """The run of ``cfg`` when it is completed and not to be trained again (``rerun``); else None."""
    previous = store.get_run(cfg.run_id)
    return previous if previous is not None and previous.status == Status.COMPLETED and not rerun else None


def train_unless_done(cfg: RunConfig, store: Store, layout: Layout, *, rerun: bool = False,
                      on_epoch: Callable | None = None, checkpoint_every: float = DEFAULT_CHECKPOINT_EVERY_S,
                      stop: Callable[[], bool] | None = None, threads: int | str | None = None,
                      log_to: Sequence[str] = ()) -> tuple[Any, Any]:
    """`flctl run`'s and flctl.api.run's one rule: a completed run is found, not trained (``rerun``: trained again,
    from scratch); a diverged one starts from scratch; any other trains or resumes from its checkpoint. Returns
    (the completed run found, None) or (None, ``execute``'s RunResult: None when a live worker holds the run)."""
    if (done := completed(cfg, store, rerun)) is not None:
        return done, None
    previous = store.get_run(cfg.run_id)
    # --rerun and a diverged run start from scratch: execute clears their old files once the claim is ours
    fresh = rerun or (previous is not None and previous.status == Status.DIVERGED)
    allow = (*TRAINABLE, Status.DIVERGED, Status.COMPLETED) if rerun else (*TRAINABLE, Status.DIVERGED)
    return None, execute(cfg, store, layout, on_epoch, allow=allow, checkpoint_every=checkpoint_every, stop=stop,
                         fresh=fresh, threads=threads, log_to=log_to)


def execute(cfg: RunConfig, store: Store, layout: Layout, on_epoch: Callable | None = None, *,
            allow: Iterable[str] = TRAINABLE, max_attempts: int | None = None,
            stale_after: float = STALE_AFTER_S, job_id: str | None = None, checkpoint_every: float = DEFAULT_CHECKPOINT_EVERY_S,
            stop: Callable[[], bool] | None = None, fresh: bool = False, threads: int | str | None = None,
            log_to: Sequence[str] = ()):
    """Claim ``cfg``'s run, train it and record the outcome. Returns the RunResult, or None when the run is
    not claimable (completed, or held by a live worker). Exceptions mark the run failed and propagate.

    ``fresh``: start from scratch (--rerun, a diverged run): its old records and files are cleared once the claim
    is ours, never before, so a run another process is training is never cleared."""
    store.add_runs([cfg])
    queue = RunQueue(store)
    token = queue.claim_run(cfg.run_id, allow=allow, max_attempts=max_attempts, stale_after=stale_after,
                            job_id=job_id, git_sha=git_revision(), device=cfg.device)
    if token is None:
        return None
    if fresh:
        layout.clear(cfg.run_id)
        queue.start_afresh(cfg.run_id, token)
    return train_claimed([cfg], {cfg.run_id: token}, store, layout, on_epoch, checkpoint_every=checkpoint_every,
                         stop=stop, threads=threads, log_to=log_to)[0]


def train_claimed(cfgs: list[RunConfig], tokens: dict[str, str], store: Store, layout: Layout,
                  on_epoch: Callable | None = None, *, checkpoint_every: float = DEFAULT_CHECKPOINT_EVERY_S,
                  stop: Callable[[], bool] | None = None, max_attempts: int | None = None,
                  threads: int | str | None = None, log_to: Sequence[str] = (), sweep_id: str | None = None) -> list:
    """Train runs this process has claimed (several together when they can, see flctl.train.train_together) and
    record how each ended: finished, handed back (stopped or interrupted: status interrupted, the attempt not counted,
    resumable from its checkpoint) or failed.

    ``tokens`` are the claims' fencing tokens. Before each write that matters (an epoch's records, a checkpoint,
    the final files) training asks whether the claim still holds the run; a run whose claim was taken over (this
    process was presumed lost: frozen, stalled past the stale bound) ends "lost" at once, and neither its files nor
    its row are touched again from here. Cells whose database or results folder went away (``ground_moved``) write
    nothing more: GroundMoved.

    A failure is recorded with the epochs done when it struck, on the cell whose own error it is (``at_fault``):
    its siblings go back to the queue, the attempt not counted, and train on without it; where no one cell can be
    blamed, each goes back to train alone (TRAIN_ALONE), so that only a cell that fails alone is failed. It is final,
    except a fatal device error (the process's CUDA context died: flctl.errors.is_fatal_device_error), which another
    process may not meet: with ``max_attempts`` (a sweep's worker) such cells are queued again while they have
    attempts left. ``threads``: torch's threads for CPU cells (flctl.train.train_together). ``log_to``: the loggers
    (flctl.loggers) each cell's epochs go to, live, each cell's log closed with its outcome (``sweep_id``: the sweep
    they are cells of); what they could not log is said on stderr at the end."""
    # torch is imported here, not at CLI start-up; torch._dynamo too, which torch.optim's first step imports whether
    # anything compiles or not: its 1.5 s are the process's start-up, not its first cell's duration (what flctl.cost fits)
    import torch._dynamo  # noqa: F401

    from flctl.train import train_together

    ids = [c.run_id for c in cfgs]
    started = time.perf_counter()
    logging = Logging(log_to, layout.root, sweep_id) if log_to else None
    queue = RunQueue(store)
    queue.record_provenance({cfg.run_id: (tokens[cfg.run_id], provenance(cfg)) for cfg in cfgs})   # one transaction
    def ground() -> str | None:
        return beat.moved or ground_moved(store, layout.root)

    beat = _Heartbeat(queue, tokens, HEARTBEAT_S, lambda: ground_moved(store, layout.root))
    beat.start()

    def epoch_done(stats) -> None:
        beat.epochs_done[stats.run_id] = stats.epoch
        if logging is not None:
            logging.epoch(stats)
        if on_epoch is not None:
            on_epoch(stats)

    if logging is not None:
        for cfg in cfgs:
            logging.start(cfg)

    recorded: set[str] = set()
    handed_back: set[str] = set()      # cells of a failed group that were not at fault (``at_fault``)

    def record(result) -> None:
        """A cell's outcome into the database, as soon as it is known (its time: from the claim to now)."""
        beat.epochs_done.pop(result.run_id, None)       # no more beats for it
        if logging is not None:
            logging.finish(result.run_id, result.status)
        if (why := ground()) is not None:
            raise GroundMoved(why)
        recorded.add(result.run_id)
        token = tokens[result.run_id]
        if result.status == Status.STOPPED:
            queue.requeue(result.run_id, token, f"stopped at epoch {result.epochs_done}; resumes from its checkpoint",
                          time.perf_counter() - started, epochs_done=result.epochs_done)
            return
        try:
            if result.status == Status.LOST:
                raise ClaimLost(f"run {result.run_id}: another worker holds it now")
            queue.finish_run(result.run_id, token, status=result.status, epochs_done=result.epochs_done,
                             metrics=result.metrics, diverged_at=result.diverged_at,
                             lambda_capped=result.lambda_capped, artifacts=result.artifacts,
                             duration_s=time.perf_counter() - started, trained_with=result.trained_with)
        except SQLAlchemyError as exc:
            full = database_full(store, exc)
            if full is None:
                raise
            raise full from exc
        except ClaimLost:
            result.status = Status.LOST
            print(f"flctl: run {result.run_id} was taken over by another worker while this process was presumed "
                  f"lost (no heartbeat for over {STALE_AFTER_S:g} s); stopped without writing", file=sys.stderr)

    def train() -> list:
        try:
            return train_together(cfgs, layout.records, [layout.run_dir(i) for i in ids], on_epoch=epoch_done,
                                  checkpoint_every=checkpoint_every, stop=stop, on_done=record, threads=threads,
                                  fence=_Fence(queue, tokens, ground))
        except BaseException as exc:     # whatever it was, with the ground gone nothing more is written
            if (why := ground()) is not None:
                raise GroundMoved(why) from exc
            raise

    try:
        results = train()
        if (why := ground()) is not None:
            raise GroundMoved(why)
    except GroundMoved:
        raise
    except (KeyboardInterrupt, SystemExit):   # cells recorded already are no longer running: left as they are
        queue.requeue_all(tokens, "interrupted; resumes from its last checkpoint", time.perf_counter() - started)
        raise
    except DiskFull:        # free space, run again: each cell resumes from its last checkpoint
        # The database may sit on the full disk too: then the rows stay running until their worker is seen gone
        # (dead pid, stale heartbeat) and the next claim takes them over; a sweep's worker tells a wait so at once
        # (flctl.launch.wait.DiskNote), after this one write, tried once.
        with contextlib.suppress(Exception):
            queue.requeue_all(tokens, f"{DISK_FILLED}; resumes from its last checkpoint",
                              time.perf_counter() - started, once=True)
        raise
    except ClaimLost:       # a write found a claim gone (see flctl.writer.Writer): hand back the cells still ours
        queue.requeue_all(tokens, "a sibling cell's claim was lost; resumes from its checkpoint",
                          time.perf_counter() - started)
        raise
    except BaseException as exc:   # fenced: a cell another worker took over stays theirs
        spent, error = time.perf_counter() - started, traceback.format_exc(limit=8)
        # the device died under the cells (another process may not meet it): queued again, the attempt counted
        retry = max_attempts if is_fatal_device_error(exc) and not device_works() else None
        left = [i for i in ids if i not in recorded]
        own = None if retry is not None else at_fault(exc, left)
        failing = left if retry is not None else [own] if own is not None else []
        for run_id in failing:
            queue.fail_run(run_id, tokens[run_id], error, spent, epochs_done=beat.epochs_done.get(run_id),
                           retry_below=retry)
        handed_back.update(i for i in left if i not in failing)    # from their checkpoints, the attempt not counted
        line = error_line(error)[:200]
        if handed_back:
            queue.requeue_all({i: tokens[i] for i in handed_back}, f"cell {own} of its group failed with an error "
                              f"of its own ({line})" if own is not None else f"{TRAIN_ALONE}: its group of "
                              f"{len(left)} failed with an error no one cell could be blamed for ({line})", spent)
        raise
    finally:
        beat.stopped.set()
        if logging is not None and (ended := sys.exc_info()[1]) is not None:    # logs of cells it ended, closed
            for run_id in ids:
                logging.finish(run_id, Status.INTERRUPTED if isinstance(ended, (KeyboardInterrupt, SystemExit))
                               or run_id in handed_back else Status.FAILED)
    for result in results:
        if result.run_id not in recorded:
            record(result)
    for line in logging.lines() if logging is not None else ():
        print(f"flctl: {line}", file=sys.stderr)
    return results


def at_fault(exc: BaseException, ids: Sequence[str]) -> str | None:
    """Which of the cells ``ids`` that trained together and failed with ``exc`` the error is the own of (that cell
    fails, and no other): the only one, or the one whose own work raised it (flctl.status.blamed: its build). None
    where it cannot be told (their shared data, grouped model or step): each of them then goes back to the queue to
    train alone (TRAIN_ALONE), where an error of its own is told apart from its siblings'."""
    if len(ids) == 1:
        return ids[0]
    return own if (own := blame(exc)) in ids else None


def database_full(store: Store, exc: BaseException) -> DiskFull | None:
    """A database write that found no room, as a DiskFull naming the database (SQLite: `database or disk is
    full`; PostgreSQL: disk_full, `could not extend file`); None for any other database error."""
    text = str(getattr(exc, "orig", exc))
    if not any(sign in text for sign in ("database or disk is full", "could not extend file",
                                          "No space left on device")):
        return None
    where = store.dialect.file(store.engine.url) or "the run database"
    return DiskFull(errno.ENOSPC, os.strerror(errno.ENOSPC), str(where))
