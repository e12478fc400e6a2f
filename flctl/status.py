"""A run's states, in the order tables list them, and the sets of them that mean something to flctl. Kept apart from
flctl.db (and torch) so the CLI can name them in its help without importing SQLAlchemy.

- queued: waiting for a worker (never started, or re-queued after its worker was lost)
- running: held by a live worker (or a lost one, until it is found stale)
- interrupted: stopped partway (a signal, `flctl cancel`, a preemption) with a checkpoint; the next claim resumes it
- completed, failed, diverged: finished

A cell that trains in this process has its own words too (flctl.cell.RunResult): training while it runs, then
completed or diverged, or stopped (asked to, checkpointed) or lost (its claim was taken over). Code names every
state through ``Status``, never as a bare string, so that a state is spelled once.
"""

from __future__ import annotations

import contextlib
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    """A run's state in the database, and a training cell's outcome (equal to its string: stored and compared as
    text)."""

    QUEUED = "queued"
    RUNNING = "running"
    INTERRUPTED = "interrupted"
    COMPLETED = "completed"
    FAILED = "failed"
    DIVERGED = "diverged"
    # a cell in this process (flctl.cell.RunResult), never stored
    TRAINING = "training"
    STOPPED = "stopped"
    LOST = "lost"


STATUSES = (Status.QUEUED, Status.RUNNING, Status.INTERRUPTED, Status.COMPLETED, Status.FAILED, Status.DIVERGED)
TO_DO = (Status.QUEUED, Status.INTERRUPTED)      # any claim takes both
# What a worker may claim (a sweep's: a failed cell until it has used its attempts).
TRAINABLE = (*TO_DO, Status.FAILED)
# No worker holds the run and none will take it up on its own: what a wait on a run waits for.
TERMINAL = (Status.COMPLETED, Status.FAILED, Status.DIVERGED)
# Finished with a result: reports and the Optuna mirror show these (a diverged run's result is its divergence).
REPORTABLE = (Status.COMPLETED, Status.DIVERGED)

# A sweep's ledger: the states, with "stale" (marked running, its worker gone) beside running.
LEDGER_COLUMNS = (Status.COMPLETED, Status.RUNNING, "stale",
                  *(s for s in STATUSES if s not in (Status.COMPLETED, Status.RUNNING)), "missing")


# A sweep whose cells failed or diverged (for good: nothing will train them again in this invocation) ends `sweep
# --wait`, `paper` and `status --watch` with this code: apart from a usage error (2), an interruption (130, 143) and
# a worker's lost device (flctl.errors.DEVICE_LOST_EXIT).
CELLS_FAILED_EXIT = 3
# How a cell handed back by a worker whose disk filled up begins its reason (flctl.runner; a wait reads it).
DISK_FILLED = "the disk filled up"
# How a cell handed back to train alone begins its reason: its group failed with an error that no one cell of it could
# be blamed for (flctl.claimed.at_fault), so its next claim takes it alone (flctl.db.queue.RunQueue.claim_next), where an
# error of its own fails it and no other.
TRAIN_ALONE = "to train alone"
DIVERGED_ERROR = "diverged: a non-finite loss (flctl show RUN says where)"


def ledger(store: Any, sweep_id: str) -> dict[str, Any]:
    """Per-method counts of the sweep's cell states (LEDGER_COLUMNS), their total and the number of cells; and the
    failed and diverged cells counted by error (``count_errors``), overall and per method. Counted by the database
    (``store.sweep_counts``, a flctl.db.Store's: flctl.db.counts), not row by row: a sweep of 100,000 cells is read
    as a few dozen rows."""
    counts = store.sweep_counts(sweep_id)
    per_method = {method: Counter(states) for method, states in counts.states.items()}
    bad: dict[str, list[tuple[str, str | None, int]]] = {}
    for method, run_id, text, cells in counts.failures:
        bad.setdefault(method, []).append((run_id, text, cells))
    total = sum((c for c in per_method.values()), Counter()) + Counter(missing=counts.missing)
    return {"sweep": sweep_id,
            "methods": {m: {k: c.get(k, 0) for k in LEDGER_COLUMNS} for m, c in per_method.items()},
            "total": {k: total.get(k, 0) for k in LEDGER_COLUMNS}, "cells": sum(total.values()),
            "errors": count_errors(error for errors in bad.values() for error in errors),
            "method_errors": {m: count_errors(errors) for m, errors in bad.items()}}


def failed_for_good(data: dict[str, Any]) -> int:
    """A settled ledger's cells that failed or diverged."""
    return data["total"][Status.FAILED] + data["total"][Status.DIVERGED]


def error_line(text: str) -> str:
    """The line that names an error. In a traceback, the exception line: the first unindented line after the last
    frame (the exception raised last; a CUDA error's advice lines follow it and say the same for every error).
    Elsewhere (flctl's one-line reasons), the first non-blank line."""
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    frames = [i for i, line in enumerate(lines) if line.startswith("  File ")]
    after = [line for line in lines[frames[-1] + 1:] if not line[0].isspace()] if frames else []
    return (after or lines or [""])[0]


def error_key(line: str) -> str:
    """``line`` with what differs between occurrences of one error replaced (addresses, run ids and shas, folders,
    numbers: an index, a size, a count of attempts), so that one error counts once."""
    line = re.sub(r"0x[0-9a-fA-F]+", "<addr>", line)
    line = re.sub(r"(?<![\w.])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,64}(?!\w)", "<id>", line)
    line = re.sub(r"(?<![\w.~-])(?:/[^/\s'\"():,]+)+/", ".../", line)
    line = re.sub(r"(?<!\w)(?<!\d\.)\d+(?:\.\d+)?(?:e[-+]?\d+)?", "N", line)
    return line[:300]


def count_errors(errors: Iterable[tuple[str, str | None] | tuple[str, str | None, int]]) -> list[dict[str, Any]]:
    """(run id, error text) pairs counted by error (error_line, then error_key), most frequent first: each as
    {message (the first such error's own line), key, count, run (the first id with it), error (its whole text,
    tail-cut to 3,000 characters)}. A triple (run id, error text, cells) stands for that many cells of one text, the
    id the first of them (the database counts a sweep's errors by text: flctl.db.counts)."""
    groups: dict[str, dict[str, Any]] = {}
    for ident, text, *cells in errors:
        line = error_line(text or "") or "(no error recorded)"
        group = groups.setdefault(error_key(line), {"message": line[:300], "key": error_key(line), "count": 0,
                                                    "run": ident, "error": (text or "")[-3000:]})
        group["count"] += cells[0] if cells else 1
    return sorted(groups.values(), key=lambda g: (-g["count"], g["key"]))


def settled(data: dict[str, Any]) -> bool:
    """A ledger with no cell a worker holds or will take (running, stale, queued, interrupted)."""
    return not any(data["total"][k] for k in (Status.RUNNING, "stale", *TO_DO))


# The attribute an exception gets where one cell's own work raised it: that cell's run id.
_BLAMED = "flctl_cell"


@contextlib.contextmanager
def blamed(run_id: str) -> Iterator[None]:
    """An exception raised inside is the cell ``run_id``'s own (its build: its task's model may fail for its seed or
    options alone): of cells together that fail with it, that cell fails and no other (flctl.claimed.at_fault). The
    innermost cell named keeps the blame."""
    try:
        yield
    except Exception as exc:
        if blame(exc) is None:
            with contextlib.suppress(AttributeError, TypeError):     # an exception type that takes no attribute
                setattr(exc, _BLAMED, run_id)
        raise


def blame(exc: BaseException) -> str | None:
    """The run id of the cell whose own work raised ``exc`` (``blamed``); None where no one cell's did."""
    run_id = getattr(exc, _BLAMED, None)
    return run_id if isinstance(run_id, str) else None
