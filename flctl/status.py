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

from collections import Counter
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


def ledger(store: Any, sweep_id: str) -> dict[str, Any]:
    """Per-method counts of the sweep's cell states (LEDGER_COLUMNS), their total and the number of cells, from
    ``store.sweep_runs`` (a flctl.db.Store)."""
    per_method: dict[str, Counter] = {}
    for r in store.sweep_runs(sweep_id):
        state = "stale" if r["stale"] else r["status"]
        per_method.setdefault(r["method"], Counter())[state] += 1
    total = sum((c for c in per_method.values()), Counter())
    return {"sweep": sweep_id,
            "methods": {m: {k: c.get(k, 0) for k in LEDGER_COLUMNS} for m, c in per_method.items()},
            "total": {k: total.get(k, 0) for k in LEDGER_COLUMNS}, "cells": sum(total.values())}


def settled(data: dict[str, Any]) -> bool:
    """A ledger with no cell a worker holds or will take (running, stale, queued, interrupted)."""
    return not any(data["total"][k] for k in (Status.RUNNING, "stale", *TO_DO))
