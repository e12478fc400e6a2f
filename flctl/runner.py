"""Glue between the training loop and the run database: claim a run, train it, record its outcome.

Used by ``flctl run`` and by sweep workers: ``train_unless_done`` is the one rule of a single run, ``train_claimed``
trains what a process has claimed through flctl.claimed.ClaimedRuns. Training itself lives in flctl.train and knows
no database.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from flctl.claimed import ClaimedRuns
from flctl.config import RunConfig
from flctl.db import STALE_AFTER_S, RunQueue, Store
from flctl.knobs import DEFAULT_CHECKPOINT_EVERY_S
from flctl.layout import Layout
from flctl.loggers import Chosen, Logging
from flctl.outcomes import Ending, Next  # noqa: F401  (what train_claimed's callers read: its Ending's row)
from flctl.shell import KEPT_IGNORED, STOP_SIGNALS, received
from flctl.status import TRAINABLE, Status
from flctl.versions import git_revision


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
def stop_on_signals(signals: Iterable[str] = STOP_SIGNALS) -> Iterator[StopRequest]:
    """One of ``signals`` sets the returned request: training stops at the next epoch boundary, checkpointed, and
    the run is handed back (interrupted). A second signal interrupts at once (KeyboardInterrupt; the run resumes
    from its last checkpoint). A signal of KEPT_IGNORED that is ignored stays so (`nohup`); SIGINT is caught even
    where ignored (`flctl cancel` sends it to workers a script started in the background). Previous handlers come
    back on exit. Main thread only."""
    requested = StopRequest()

    def handler(signum, _frame) -> None:
        received.append(signal.Signals(signum))
        if requested.is_set():
            raise KeyboardInterrupt
        requested.signum = signum

    previous = {sig: signal.signal(sig, handler) for sig in (signal.Signals[name] for name in signals)
                if not (sig.name in KEPT_IGNORED and signal.getsignal(sig) is signal.SIG_IGN)}
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
                      log_to: Sequence[str] | Chosen = ()) -> tuple[Any, Any]:
    """`flctl run`'s and flctl.api.run's one rule: a completed run is found, not trained (``rerun``: trained again,
    from scratch); a diverged one starts from scratch; any other trains or resumes from its checkpoint. Returns
    (the completed run found, None) or (None, ``execute``'s Ending: None when a live worker holds the run)."""
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
            log_to: Sequence[str] | Chosen = ()):
    """Claim ``cfg``'s run, train it and record the outcome. Returns its Ending (train_claimed), or None when the run
    is not claimable (completed, or held by a live worker).

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
                         stop=stop, threads=threads, log_to=log_to)


def train_claimed(cfgs: list[RunConfig], tokens: dict[str, str], store: Store, layout: Layout,
                  on_epoch: Callable | None = None, *, checkpoint_every: float = DEFAULT_CHECKPOINT_EVERY_S,
                  stop: Callable[[], bool] | None = None, max_attempts: int | None = None,
                  threads: int | str | None = None, log_to: Sequence[str] | Chosen = (), sweep_id: str | None = None) -> Ending:
    """Train runs this process has claimed (several together when they can, see flctl.train.train_together) and
    record how each ended: finished, handed back (stopped or interrupted: status interrupted, the attempt not counted,
    resumable from its checkpoint) or failed. Returns the Ending (flctl.outcomes: its row, the runs' results, the
    error): an error is not raised but classified, once; a signal is recorded and goes on up.

    ``tokens`` are the claims' fencing tokens: before each write that matters training asks whether the claim still
    holds the run; a run whose claim was taken over ends "lost", its files and row untouched from then on. Cells whose
    database or results folder went away write nothing more: GroundMoved. ``max_attempts`` (a sweep's worker): cells
    whose device died under them are queued again while attempts are left. ``threads``: torch's threads for CPU cells.
    ``log_to``: the loggers (flctl.loggers) each cell's epochs go to, live (``sweep_id``: the sweep they are cells of);
    what they could not log is said on stderr at the end. Where training's database or results folder went away,
    nothing more is written (the row "ground moved")."""
    with ClaimedRuns(cfgs, tokens, store, layout, Logging(log_to, layout.root, sweep_id), on_epoch=on_epoch,
                     max_attempts=max_attempts) as claimed:
        claimed.start()
        from flctl.train import train_together

        results = train_together(cfgs, layout.records, claimed.run_dirs, on_epoch=claimed.epoch,
                                 checkpoint_every=checkpoint_every, stop=stop, on_done=claimed.done, threads=threads,
                                 fence=claimed.fence)
        claimed.finish(results)
    assert claimed.ending is not None
    return claimed.ending
