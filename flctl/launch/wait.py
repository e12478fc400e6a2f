"""Waiting for a sweep to settle (`flctl sweep --wait`, `flctl paper`, ``flctl.api.sweep``): its ledger polled until
no cell is left to train, or until nothing is left that could train one (its database moved, no worker left)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from flctl.launch.jobs import live_controllers, live_workers, queued_jobs
from flctl.runner import ground_moved
from flctl.status import DISK_FILLED, Status, ledger, settled

# A wait ends when no worker is left to take the cells still to do, once that has held this long: a worker that is
# starting (a new interpreter) registers within a second or two.
NO_WORKER_GRACE_S = 5.0


class SweepStopped(Exception):
    """A wait that cannot end with the sweep done: one line, and the exit code a command ends with (130: its workers
    were stopped and their cells handed back; 1: the disk filled, no worker is left, or the database moved)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def stopped_line(root: Path, sid: str) -> str:
    """What `flctl sweep --wait` says when a signal stopped its own worker: its cell went back, and whether the
    sweep's other workers go on (Ctrl-C on this command) or were stopped too (`flctl cancel` since this command
    started: it says so in the sweep's jobs folder before its first signal)."""
    import os

    from flctl.layout import Layout
    from flctl.procs import started_at

    try:
        cancelled = float(Layout(root).cancelled(sid).read_text())
    except (OSError, ValueError):
        cancelled = None
    started = started_at(os.getpid())
    others = [] if cancelled is not None and (started is None or cancelled >= started) else live_workers(root, sid)
    if not others:
        return (f"sweep {sid}'s workers were stopped; their cells went back to the queue, and `flctl sweep` with the "
                "same axes resumes it")
    return (f"this process's worker of sweep {sid} was stopped; its cell went back to the queue and the other "
            f"{len(others)} worker(s) go on (`flctl cancel {sid}` stops them)")


def check_ground(store: Any, root: Path | None, sid: str) -> None:
    """SweepStopped (exit 1) where the sweep's database or results folder ``root`` moved while it ran (its workers
    told it and stopped): what follows would write into a file that is gone, or make one in its place."""
    if (moved := ground_moved(store, root)) is not None:
        raise SweepStopped(f"{moved} while sweep {sid} ran: its workers stop and write no more", 1)


def no_worker_left(root: Path, sid: str, data: dict) -> bool:
    """Whether the sweep being waited for has cells to do that no worker will take: none running, some queued,
    handed back (`flctl cancel`, a signal, a full disk) or left by workers now gone, and no worker, job controller or
    scheduler's job left. A sweep with a scheduler's jobs is never judged so: squeue may not answer, and a job may
    pend for hours."""
    total = data["total"]
    if total[Status.RUNNING] or not (total["stale"] or total[Status.INTERRUPTED] or total[Status.QUEUED]):
        return False
    if queued_jobs(root, sid):
        return False
    return not (live_workers(root, sid) or live_controllers(root, sid))


class Settling:
    """The polls of one wait: ``poll()`` returns the sweep's ledger (flctl.status.ledger), or raises SweepStopped."""

    def __init__(self, store: Any, sid: str, root: Path, until_done: bool = True) -> None:
        self.store, self.sid, self.root, self.until_done = store, sid, root, until_done
        self.folder = root if root.is_dir() else None    # a --db elsewhere, its results folder not here: the database
        self.idle_since: float | None = None

    def poll(self) -> dict:
        check_ground(self.store, self.folder, self.sid)     # a query now would make an empty database
        data = ledger(self.store, self.sid)
        if not (self.until_done and not settled(data) and no_worker_left(self.root, self.sid, data)):
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = time.monotonic()
        elif time.monotonic() - self.idle_since >= NO_WORKER_GRACE_S:
            raise self._stopped(data)
        return data

    def _stopped(self, data: dict) -> SweepStopped:
        back, stale, queued = (data["total"][k] for k in (Status.INTERRUPTED, "stale", Status.QUEUED))
        errors = [r["error"] or "" for r in self.store.sweep_runs(self.sid) if r["status"] == Status.INTERRUPTED]
        if any(e.startswith(DISK_FILLED) for e in errors):
            return SweepStopped(f"the disk filled up under sweep {self.sid}: its workers stopped, {back} cell(s) handed "
                                "back; free some space, then `flctl sweep` with the same axes resumes them from their "
                                "checkpoints", 1)
        if back:
            return SweepStopped(f"sweep {self.sid}'s workers were stopped (`flctl cancel`, a signal); {back} cell(s) "
                                "handed back, `flctl sweep` with the same axes resumes it", 130)
        return SweepStopped(f"no worker is left for sweep {self.sid} ({stale + queued + back} cell(s) to do: their "
                            "workers stopped or are gone, see its logs under results/jobs/); `flctl sweep` with the "
                            "same axes starts workers again", 1)


def settle(store: Any, sid: str, root: Path, interval: float = 0.5,
           on_poll: Callable[[dict], None] | None = None) -> dict:
    """Wait until sweep ``sid`` settles; its last ledger. SweepStopped when it cannot."""

    settling, delays = Settling(store, sid, root), poll_delays(interval)
    data = settling.poll()
    while not settled(data):
        if on_poll is not None:
            on_poll(data)
        time.sleep(next(delays))
        data = settling.poll()
    return data


def poll_delays(most: float, first: float = 0.02) -> Iterator[float]:
    """The sleeps of a loop that waits on other processes: ``first`` and then half as long again each time, up to
    ``most``. What is waited on is often done within a moment (a --tune trial of a few epochs, the next trial's cell);
    a flat ``most`` was then most of the wait, and a long wait still costs one look (a query) per ``most``."""
    delay = min(first, most)
    while True:
        yield delay
        delay = min(most, delay * 1.5)
