"""What it means when claimed runs end: one table (OUTCOMES), the only place a training's end is classified.

Where claimed runs end (flctl.claimed.ClaimedRuns) their end is classified once, into the first row that matches:
what is recorded for each cell still held (``Cells``), what a sweep's worker does next (``Next``), and the line and
exit code `flctl run` gives. The worker (flctl.launch.worker) and the command (flctl.cli.run) read the row; neither
looks at the exception again. A new kind of failure is one row here.

    ground moved      nothing written (there is nowhere left to write)     the worker stops          exit 1
    signal            back to the queue, resumable                         (the signal goes on)      128 + signal
    disk full         back to the queue, one try                           the worker stops          exit 1
    claim lost        the cells still ours back to the queue               goes on                   exit 1
    device lost       alone: failed, retried elsewhere; a group: each      the worker ends, a fresh  exit 1
                      back to train alone                                  one takes its place
    database          every cell still held failed, best effort            the worker stops          exit 1
    before training   every cell failed (the same error for each)          goes on                   exit 1
    own error         the cell at fault fails; its siblings go back        goes on                   exit 1
    asked to stop     (each recorded as it stopped: handed back)           the worker stops          128 + signal
    finished          (each recorded as it ended)                          goes on                   exit 0
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from flctl.errors import ClaimLost, DiskFull, GroundMoved, is_fatal_device_error
from flctl.status import DISK_FILLED, Status


class Cells(StrEnum):
    """What is recorded for the cells a process still holds when training ends."""

    NOTHING = "nothing"                 # each was recorded as it ended, or there is nowhere left to write
    HAND_BACK = "hand back"             # back to the queue, the attempt not counted, resumable from its checkpoint
    HAND_BACK_ONCE = "hand back once"   # the same, one try, errors swallowed (the database may sit on the full disk:
    #                                     then the rows stay running until their worker is seen gone)
    FAIL_AT_FAULT = "fail at fault"     # the cell whose own error it is fails; the others go back (flctl.claimed)
    DEVICE = "device"                   # alone: failed, queued again while attempts are left; a group: each back to
    #                                     train alone, where the cell that kills the device fails by itself
    FAIL_ALL = "fail all"               # every cell still held fails with the error, best effort


class Next(StrEnum):
    """What a sweep's worker does after it."""

    GO_ON = "go on"                     # claims the next cells
    STOP = "stop"                       # stops, saying why in one line
    DISK_FULL = "disk full"             # stops, and tells a waiting command so (flctl.launch.wait.DiskNote)
    GROUND_GONE = "ground gone"         # stops and writes no more
    DEVICE_LOST = "device lost"         # ends; a fresh worker process takes its place (DEVICE_LOST_EXIT)


SIGNAL = -1     # an exit code: the stop signal's, 128 + its number (130 SIGINT, 143 SIGTERM, 129 SIGHUP)


@dataclass(frozen=True)
class End:
    """How training ended, as the table reads it: the error it ended with (None: none), whether training began
    (the claims recorded, the logs open), and the statuses of the runs that ended by themselves."""

    error: BaseException | None
    began: bool = True
    statuses: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Outcome:
    """One row: an end that ``matches``, what is recorded for the cells still held (``cells``, handed back with
    ``why``), what a sweep's worker does next, and `flctl run`'s exit code (SIGNAL: the signal's) and line
    (``{run}``: the run id; ``{error}``: the error's type and text; ``{exc}``: its text; ``{epochs}``: epochs done)."""

    name: str
    matches: Callable[[End], bool] = field(repr=False)
    cells: Cells
    next: Next
    exit_code: int
    line: str
    why: str = ""


def device_lost(end: End) -> bool:
    """A fatal device error whose device really stopped working: the one place the CUDA probe is asked."""
    from flctl.devices import device_works

    return end.error is not None and is_fatal_device_error(end.error) and not device_works()


def _database(end: End) -> bool:
    """The database server stopped answering or its disk failed (the driver's OperationalError, InterfaceError); an
    IntegrityError or a ProgrammingError is flctl's own bug, a cell's failure like any other. By name: SQLAlchemy is
    not imported to ask."""
    return type(end.error).__module__.startswith("sqlalchemy") and any(
        c.__name__ in ("OperationalError", "InterfaceError") for c in type(end.error).__mro__)


RESUME = "`flctl run` with the same options resumes run {run} from its last checkpoint"
OUTCOMES: list[Outcome] = [
    Outcome("ground moved", lambda e: isinstance(e.error, GroundMoved), Cells.NOTHING, Next.GROUND_GONE, 1,
            "{exc}: run {run} stopped and wrote no more"),
    Outcome("signal", lambda e: isinstance(e.error, (KeyboardInterrupt, SystemExit)), Cells.HAND_BACK, Next.STOP,
            SIGNAL, "interrupted: " + RESUME, why="interrupted; resumes from its last checkpoint"),
    Outcome("disk full", lambda e: isinstance(e.error, DiskFull), Cells.HAND_BACK_ONCE, Next.DISK_FULL, 1,
            "{exc}; run {run} is interrupted: free some space, then the same `flctl run` resumes it from its last "
            "checkpoint", why=f"{DISK_FILLED}; resumes from its last checkpoint"),
    Outcome("claim lost", lambda e: isinstance(e.error, ClaimLost) or Status.LOST in e.statuses, Cells.HAND_BACK,
            Next.GO_ON, 1, "run {run} was taken over by another worker while this process was presumed lost (no "
            "heartbeat past the stale bound); it stopped without writing more (see `flctl show {run}`)",
            why="a sibling cell's claim was lost; resumes from its checkpoint"),
    Outcome("device lost", device_lost, Cells.DEVICE, Next.DEVICE_LOST, 1,
            "run {run} failed: {error}; this process's device context is dead: run it again in a new process "
            "(see `flctl show {run}`)"),
    Outcome("database", _database, Cells.FAIL_ALL, Next.STOP, 1,
            "run {run}: the run database failed under it ({error}); what was recorded is kept: the same command "
            "trains it again once the database answers"),
    Outcome("before training", lambda e: isinstance(e.error, Exception) and not e.began, Cells.FAIL_ALL, Next.GO_ON,
            1, "run {run} failed before it trained: {error} (see `flctl show {run}`)"),
    Outcome("own error", lambda e: isinstance(e.error, Exception), Cells.FAIL_AT_FAULT, Next.GO_ON, 1,
            "run {run} failed: {error} (see `flctl show {run}`)"),
    Outcome("asked to stop", lambda e: Status.STOPPED in e.statuses, Cells.NOTHING, Next.STOP, SIGNAL,
            "interrupted after epoch {epochs}, checkpointed: " + RESUME),
    Outcome("finished", lambda e: True, Cells.NOTHING, Next.GO_ON, 0, ""),
]


def classify(end: End) -> Outcome:
    """The first row of OUTCOMES that matches ``end`` (read at each call: a row added to it counts at once)."""
    return next(row for row in OUTCOMES if row.matches(end))


def named(name: str) -> Outcome:
    """The row called ``name``."""
    return next(row for row in OUTCOMES if row.name == name)


@dataclass
class Ending:
    """How a process's claimed runs ended: the row, the results of the runs that ended by themselves
    (flctl.cell.RunResult), and the error training ended with (None: none)."""

    outcome: Outcome
    results: Sequence[Any] = ()
    error: BaseException | None = None

    def line(self, run_id: str) -> str:
        """The row's line for ``run_id``."""
        exc = self.error
        error = "" if exc is None else f"{type(exc).__name__}: {_first_line(exc)}"
        epochs = max((r.epochs_done for r in self.results if r.run_id == run_id), default=0)
        return self.outcome.line.format(run=run_id, error=error, exc="" if exc is None else _first_line(exc),
                                        epochs=epochs)

    def exit_code(self, signal_code: int) -> int:
        """`flctl run`'s exit code; ``signal_code``: that of the stop signal it got (StopRequest.exit_code)."""
        return signal_code if self.outcome.exit_code == SIGNAL else self.outcome.exit_code


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:300]
