"""Runs this process has claimed, while it trains them: one object from the claim to the outcome.

``ClaimedRuns`` is entered once the claims are taken (flctl.db.RunQueue): it records each run's provenance, starts
the heartbeat and opens each run's logs (flctl.loggers). Training calls it back: ``fence(run_id)`` before each write
that matters (is the claim still ours, is the ground still there), ``epoch(stats)`` at each epoch's end (a beat, the
trackers, progress), ``done(result)`` as each run ends (its logs closed, its outcome recorded), and ``finish(results)`` last, inside
the with-block. However it is left, the end is classified once (flctl.outcomes.OUTCOMES) and what the row says is
recorded for the runs still held; ``ending`` is what the caller reads. Training itself (flctl.train) knows none of
this: it gets the callbacks."""

from __future__ import annotations

import contextlib
import math
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from flctl.config import RunConfig
from flctl.db import HEARTBEAT_S, STALE_AFTER_S, Ended, RunQueue, Store
from flctl.errors import GroundMoved
from flctl.layout import Layout
from flctl.loggers import Logging
from flctl.outcomes import Cells, End, Ending, classify
from flctl.status import TRAIN_ALONE, Status, blame, error_line


def provenance(cfg: RunConfig) -> dict[str, Any]:
    """What trains ``cfg`` besides its configuration, as each run records it: its task's and its method's module,
    file, source hash and package (flctl.plugins.Source), the library versions (flctl.versions) and what its data
    came from (flctl.tasks.describe_data)."""
    from flctl.method_info import method_source
    from flctl.tasks import describe_data, task_source
    from flctl.versions import library_versions

    return {"task": task_source(cfg.task).provenance(), "method": method_source(cfg.method).provenance(),
            "libraries": library_versions(), "data": describe_data(cfg)}


def ground_moved(store: Store, root: Path | None) -> str | None:
    """Why this process must stop writing: its database file was deleted or replaced since it opened it, or its
    results folder ``root`` (None: none to watch) is gone. None: both are there."""
    from flctl.db.store import moved

    if (why := moved(store)) is not None:
        return why
    return None if root is None or root.is_dir() else f"the results folder {root} was deleted"


def at_fault(exc: BaseException, ids: Sequence[str]) -> str | None:
    """Which of the cells ``ids`` that trained together and failed with ``exc`` the error is the own of (that cell
    fails, and no other): the only one, or the one whose own work raised it (flctl.status.blamed: its build). None
    where it cannot be told (their shared data, grouped model or step): each of them then goes back to the queue to
    train alone (TRAIN_ALONE), where an error of its own is told apart from its siblings'."""
    if len(ids) == 1:
        return ids[0]
    return own if (own := blame(exc)) in ids else None


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
            beating = dict(self.epochs_done)
            try:      # one statement for all the runs (RunQueue.beat), however many cells train together
                held = self.queue.beat({run_id: self.tokens[run_id] for run_id in beating}, beating)
            except Exception:  # a missed beat is harmless; the next one retries
                continue
            for run_id in beating.keys() - held:
                self.epochs_done.pop(run_id, None)


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


class ClaimedRuns:
    """The runs of ``cfgs``, claimed by this process with fencing ``tokens``, as they train (see the module's
    docstring; a claim as the queue hands it is flctl.db.claims.Claim, a worker's cells claimed at once
    flctl.launch.claims.ClaimedTogether). ``logging``: their trackers (a Logging of no loggers does nothing); ``on_epoch``: progress;
    ``max_attempts`` (a sweep's worker): cells whose device died under them are queued again while attempts are left.

    Left with an Exception, the with-block does not raise: ``ending`` holds the row and the error. A signal
    (KeyboardInterrupt, SystemExit) is recorded by its row and goes on up."""

    def __init__(self, cfgs: Sequence[RunConfig], tokens: dict[str, str], store: Store, layout: Layout,
                 logging: Logging, *, on_epoch: Callable | None = None, max_attempts: int | None = None) -> None:
        self.cfgs, self.tokens, self.store, self.layout, self.logging = list(cfgs), tokens, store, layout, logging
        self.on_epoch, self.max_attempts = on_epoch, max_attempts
        self.ids = [c.run_id for c in self.cfgs]
        self.queue = RunQueue(store)
        self.beat = _Heartbeat(self.queue, tokens, HEARTBEAT_S, lambda: ground_moved(store, layout.root))
        self.fence = _Fence(self.queue, tokens, self.ground)
        self.recorded: set[str] = set()
        self.results: list = []                # of the runs that ended by themselves, as recorded
        self.handed_back: set[str] = set()     # cells of a failed group that were not at fault (``at_fault``)
        self.began = False                     # the claims' provenance recorded, the beat and the logs started
        self.ending: Ending | None = None
        self.started = time.perf_counter()

    @property
    def run_dirs(self) -> list[Path]:
        return [self.layout.run_dir(i) for i in self.ids]

    def ground(self) -> str | None:
        """Why nothing more may be written (ground_moved, or what the heartbeat found); None: all is there."""
        return self.beat.moved or ground_moved(self.store, self.layout.root)

    def spent(self) -> float:
        return time.perf_counter() - self.started

    def __enter__(self) -> ClaimedRuns:
        return self

    def start(self) -> None:
        """Before training: each claim's provenance recorded, the heartbeat and each run's logs started."""
        # torch is imported here, not at CLI start-up; torch._dynamo too, which torch.optim's first step imports
        # whether anything compiles or not: its 1.5 s are the process's start-up, not its first cell's duration
        # (what flctl.cost fits), so the clock starts after it
        import torch._dynamo  # noqa: F401

        self.started = time.perf_counter()
        self.queue.record_provenance({c.run_id: (self.tokens[c.run_id], provenance(c)) for c in self.cfgs})
        self.beat.start()
        for cfg in self.cfgs:
            self.logging.start(cfg)
        self.began = True

    def epoch(self, stats: Any) -> None:
        """A run's epoch ended (flctl.train.EpochStats): its next beat carries the count, its trackers are told."""
        self.beat.epochs_done[stats.run_id] = stats.epoch
        self.logging.epoch(stats)
        if self.on_epoch is not None:
            self.on_epoch(stats)

    def done(self, result: Any) -> None:
        """A run's outcome (flctl.cell.RunResult) into the database as soon as it is known (a cell that leaves the
        others early); ``finish`` records the rest at once."""
        self._record([result])

    def finish(self, results: list) -> None:
        """The runs' outcomes recorded (those ``done`` has not seen), and what the trackers could not log said on
        stderr. Last, inside the with-block."""
        self._record([r for r in results if r.run_id not in self.recorded])
        for line in self.logging.lines():
            print(f"flctl: {line}", file=sys.stderr)

    def _record(self, results: list) -> None:
        """Runs' outcomes into the database, those that finished in one transaction; their time is from the claim to
        now. Stopped runs go back to the queue; a run whose claim was taken over ends LOST, unwritten."""
        if not results:
            return
        for result in results:
            self.beat.epochs_done.pop(result.run_id, None)       # no more beats for it
            self.logging.finish(result.run_id, result.status)
        if (why := self.ground()) is not None:
            raise GroundMoved(why)
        for result in (r for r in results if r.status == Status.STOPPED):
            self.queue.requeue(result.run_id, self.tokens[result.run_id], f"stopped at epoch {result.epochs_done}; "
                               "resumes from its checkpoint", self.spent(), epochs_done=result.epochs_done)
        ended = {r.run_id: Ended(self.tokens[r.run_id], r.status, r.epochs_done, r.metrics, r.diverged_at,
                                 r.lambda_capped, r.artifacts, self.spent(), r.trained_with)
                 for r in results if r.status not in (Status.STOPPED, Status.LOST)}
        try:
            lost = self.queue.finish_runs(ended) | {r.run_id for r in results if r.status == Status.LOST}
        except SQLAlchemyError as exc:
            if (full := self.store.disk_full(exc)) is None:
                raise
            raise full from exc
        self.recorded.update(r.run_id for r in results)      # once written: a failure before leaves them held
        self.results += results
        for result in (r for r in results if r.run_id in lost):
            result.status = Status.LOST
            print(f"flctl: run {result.run_id} was taken over by another worker while this process was presumed "
                  f"lost (no heartbeat for over {STALE_AFTER_S:g} s); stopped without writing", file=sys.stderr)

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> bool:
        self.beat.stopped.set()
        moved = self.ground()
        error = exc
        if moved is not None and not isinstance(exc, GroundMoved):    # whatever happened, nothing more is written
            error = GroundMoved(moved)
            error.__cause__ = exc
        ending = Ending(classify(End(error, self.began, frozenset(r.status for r in self.results))), self.results,
                        error)
        try:
            self._leave(ending)
        finally:
            if error is not None:       # the logs of the runs it ended, closed
                stopped = ending.outcome.cells in (Cells.HAND_BACK, Cells.HAND_BACK_ONCE, Cells.NOTHING)
                for run_id in (i for i in self.ids if i not in self.recorded):
                    self.logging.finish(run_id, Status.INTERRUPTED if stopped or run_id in self.handed_back
                                        else Status.FAILED)
            self.ending = ending
        return isinstance(exc, Exception)     # a signal goes on up; an error is the ending, read by the caller

    def _leave(self, ending: Ending) -> None:
        """What ``ending``'s row records for the runs still held."""
        cells, error = ending.outcome.cells, ending.error
        held = {i: self.tokens[i] for i in self.ids if i not in self.recorded}
        if cells in (Cells.HAND_BACK, Cells.HAND_BACK_ONCE):
            once = cells == Cells.HAND_BACK_ONCE
            with contextlib.suppress(Exception) if once else contextlib.nullcontext():
                self.queue.requeue_all(held, ending.outcome.why, self.spent(), once=once)
        elif cells == Cells.FAIL_ALL:
            self._fail_held(error)
        elif cells in (Cells.FAIL_AT_FAULT, Cells.DEVICE):
            assert error is not None
            self._fail(error, device=cells == Cells.DEVICE)

    def _fail_held(self, exc: BaseException | None) -> None:
        """Every run still held, failed with ``exc``: an error before training began is the same for all of them
        (they share their task, method and data), and so is a database that failed under them. Best-effort: where
        the database itself is what failed (its server stopped), they go stale as a lost worker's do, and ``exc`` is
        what is reported, not a second error."""
        error = "".join(traceback.format_exception(exc, limit=8))
        with contextlib.suppress(Exception):
            for run_id in self.queue.held({i: self.tokens[i] for i in self.ids if i not in self.recorded}):
                self.queue.fail_run(run_id, self.tokens[run_id], error, 0.0)

    def _fail(self, exc: BaseException, device: bool) -> None:
        """A failure is recorded with the epochs done when it struck, on the cell whose own error it is
        (``at_fault``): its siblings go back to the queue, the attempt not counted, and train on without it; where no
        one cell can be blamed, each goes back to train alone (TRAIN_ALONE), so that only a cell that fails alone is
        failed. It is final, except a dead device (``device``: the process's CUDA context died), which another
        process may not meet: a cell alone is queued again while it has attempts left (``max_attempts``), and a
        group goes back to train alone, where the cell that kills the device fails by itself. A cell another worker
        took over stays theirs (the writes are fenced)."""
        spent, error = self.spent(), "".join(traceback.format_exception(exc, limit=8))
        left = [i for i in self.ids if i not in self.recorded]
        retry = self.max_attempts if device else None
        own = (left[0] if len(left) == 1 else None) if device else at_fault(exc, left)
        failing = [own] if own is not None else []
        for run_id in failing:
            self.queue.fail_run(run_id, self.tokens[run_id], error, spent,
                                epochs_done=self.beat.epochs_done.get(run_id), retry_below=retry)
        self.handed_back.update(i for i in left if i not in failing)   # from their checkpoints, the attempt not counted
        if self.handed_back:
            line = error_line(error)[:200]
            self.queue.requeue_all({i: self.tokens[i] for i in self.handed_back}, f"cell {own} of its group failed "
                                   f"with an error of its own ({line})" if own is not None else f"{TRAIN_ALONE}: its "
                                   f"group of {len(left)} " + ("lost its device" if device else "failed with an error "
                                                               "no one cell could be blamed for") + f" ({line})",
                                   spent)
