"""A sweep's cells read as aggregates: what `flctl status`, `flctl sweeps`, a wait and a launch need to know of a
sweep of 100,000 cells, without loading its rows.

States are counted in SQL by method (GROUP BY), through an index of status, method and id. A running cell is stale
(flctl.db.liveness._is_stale) when its heartbeat is missing or older than the stale bound at the database's clock,
which SQL counts by a cutoff; or when it runs on this host and its process has exited, which is asked of each pid of
this host's running cells (as many as this host's workers, not as many as the sweep has cells). Failed and diverged
cells are counted by error text (GROUP BY), each text with its first run id: flctl.status.count_errors groups the
texts by what they say. Rows are read where a person sees them (running cells, stale ones), and of given ids in chunks.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import and_, case, func, or_, select, true
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from flctl.db.liveness import STALE_AFTER_S, check_stale_after, db_now
from flctl.db.schema import Run, Sweep, SweepCell
from flctl.procs import pid_alive
from flctl.status import DIVERGED_ERROR, STATUSES, Status


class Store(Protocol):
    """What these reads need of a flctl.db.Store (which calls them: a Protocol, not an import of it)."""

    def session(self) -> AbstractContextManager[Session]: ...


# Ids in one IN (...): a query's parameters are bounded (SQLite's 32,766; PostgreSQL's 65,535).
CHUNK = 1000


def chunks(items: Sequence[Any], size: int = CHUNK) -> Iterator[Sequence[Any]]:
    """``items`` in slices of ``size``: one query each."""
    for start in range(0, len(items), size):
        yield items[start:start + size]


@dataclass(frozen=True)
class SweepCounts:
    """A sweep's cells counted (sweep_counts): what flctl.status.ledger makes its ledger of."""

    # method -> state (a Status, or "stale": running, its worker gone) -> cells; methods in the order of their first
    # cell by id (the order a row-by-row read met them in)
    states: dict[str, dict[str, int]]
    # (method, first run id, error text, cells) for each text of failed cells and for the diverged cells of a method
    # (DIVERGED_ERROR): methods in the order of their first such cell, then by first id
    failures: list[tuple[str, str, str | None, int]]
    # cells whose run is not there (a row removed with foreign keys off, or by another tool), or is in a state this
    # flctl does not know: no method to count them under, and no worker will ever take them
    missing: int = 0


def stale_cutoff(s: Session, stale_after: float) -> datetime | None:
    """The heartbeat time before which a running cell is stale, at the database's clock; None where no heartbeat
    grows too old (an infinite bound)."""
    check_stale_after(stale_after)
    at = db_now(s)
    return None if math.isinf(stale_after) else at - timedelta(seconds=stale_after)


def lost_by_heartbeat(cutoff: datetime | None) -> ColumnElement[bool]:
    """A running cell whose heartbeat is missing or older than ``cutoff`` (stale_cutoff)."""
    old = Run.heartbeat_at.is_(None) if cutoff is None else or_(Run.heartbeat_at.is_(None),
                                                                 Run.heartbeat_at < cutoff)
    return and_(Run.status == Status.RUNNING, old)


def _cells(sweep_id: str) -> Any:
    """The sweep's run ids, as the subquery of an ``IN``: each query below is led by its status through an index
    (ix_runs_ledger, ix_runs_status), and a cell's row is read only where its status is a rare one (running, failed,
    diverged, interrupted). A join from sweep_cells instead reads every cell's row (SQLite's planner takes the
    primary key for it), ~1 KB of config each: 0.3 s a query at 100,000 cells."""
    return select(SweepCell.run_id).where(SweepCell.sweep_id == sweep_id)


def _dead_here(s: Session, sweep_id: str, cutoff: datetime | None) -> list[tuple[str, str]]:
    """(id, method) of the sweep's running cells of this host whose heartbeat is fresh and whose process has exited:
    stale too, though no heartbeat says so yet."""
    fresh = Run.heartbeat_at.is_not(None) if cutoff is None else Run.heartbeat_at >= cutoff
    rows = s.execute(select(Run.id, Run.method, Run.pid)
                     .where(Run.status == Status.RUNNING, Run.id.in_(_cells(sweep_id)),
                            Run.host == socket.gethostname(), Run.pid.is_not(None), fresh)).all()
    return [(run_id, method) for run_id, method, pid in rows if pid is not None and not pid_alive(pid)]


def _rare(sweep_id: str, cutoff: datetime | None) -> Any:
    """The sweep's running, failed and diverged cells grouped by what the ledger tells apart: a running cell lost by
    its heartbeat, the pid of one of this host's (its process may have exited), a failed cell's error text; each
    group with its cells and first id. Grouped over a subquery: PostgreSQL would not take a GROUP BY of expressions
    whose parameters are their own."""
    here = and_(Run.status == Status.RUNNING, Run.host == socket.gethostname())
    rows = (select(Run.id, Run.method, Run.status, case((lost_by_heartbeat(cutoff), 1), else_=0).label("by_beat"),
                   case((here, Run.pid)).label("pid"), case((Run.status == Status.FAILED, Run.error)).label("error"))
            .where(Run.status.in_((Status.RUNNING, Status.FAILED, Status.DIVERGED)), Run.id.in_(_cells(sweep_id)))
            .subquery())
    keys = (rows.c.method, rows.c.status, rows.c.by_beat, rows.c.pid, rows.c.error)
    return select(*keys, func.count(), func.min(rows.c.id)).group_by(*keys)


def sweep_counts(store: Store, sweep_id: str, stale_after: float = STALE_AFTER_S) -> SweepCounts:
    """The sweep's cells by method and state, and its failed and diverged cells by error text (SweepCounts): two
    grouped queries in one transaction, each reading the sweep's cell ids once (an IN list: 30 ms at 100,000)."""
    with store.session() as s:
        cutoff = stale_cutoff(s, stale_after)
        grouped = s.execute(select(Run.status, Run.method, func.count(), func.min(Run.id))
                            .where(Run.status.in_(STATUSES), Run.id.in_(_cells(sweep_id)))
                            .group_by(Run.status, Run.method)).all()
        rare = s.execute(_rare(sweep_id, cutoff)).all()
        # sweep_cells' own index, as `flctl sweeps` counts them: the cells above are those whose run was found
        cells = s.scalar(select(func.count()).select_from(SweepCell).where(SweepCell.sweep_id == sweep_id)) or 0
    states: dict[str, dict[str, int]] = {}
    for status, method, n, _ in sorted(grouped, key=lambda g: g[3]):      # methods in the order of their first cell
        states.setdefault(method, {})[status] = n
    lost: dict[str, int] = {}
    bad: list[tuple[str, str, str | None, int]] = []
    diverged: dict[str, tuple[str, int]] = {}
    for method, status, by_beat, pid, error, n, first in rare:
        if status == Status.RUNNING and (by_beat or pid is not None and not pid_alive(pid)):
            lost[method] = lost.get(method, 0) + n
        elif status == Status.FAILED:
            bad.append((method, first, error, n))
        elif status == Status.DIVERGED:
            low, cells = diverged.get(method, (first, 0))
            diverged[method] = (min(low, first), cells + n)
    for method, n in lost.items():
        # PostgreSQL reads each query at its own moment: a cell may have moved between them
        stale = min(n, states.get(method, {}).get(Status.RUNNING, 0))
        if stale:
            states[method][Status.RUNNING] -= stale
            states[method]["stale"] = stale
    bad += [(m, first, DIVERGED_ERROR, n) for m, (first, n) in diverged.items()]
    lead: dict[str, str] = {}
    for method, first, _, _ in sorted(bad, key=lambda b: b[1]):
        lead.setdefault(method, first)
    counted = sum(n for _, _, n, _ in grouped)
    return SweepCounts(states, sorted(bad, key=lambda b: (lead[b[0]], b[1])), max(0, cells - counted))


def stale_ids(store: Store, sweep_id: str, stale_after: float = STALE_AFTER_S) -> list[str]:
    """The sweep's stale cells (running, their worker gone), sorted: as many as its running cells at most."""
    with store.session() as s:
        cutoff = stale_cutoff(s, stale_after)
        lost = s.scalars(select(Run.id).where(lost_by_heartbeat(cutoff), Run.id.in_(_cells(sweep_id)))).all()
        return sorted([*lost, *(run_id for run_id, _ in _dead_here(s, sweep_id, cutoff))])


def running(store: Store, sweep_id: str) -> list[tuple[str, str | None, int | None]]:
    """(id, host, pid) of the sweep's running cells, by id: as many as its workers hold, and the stale ones."""
    with store.session() as s:
        return [(run_id, host, pid) for run_id, host, pid in s.execute(
            select(Run.id, Run.host, Run.pid).where(Run.status == Status.RUNNING, Run.id.in_(_cells(sweep_id)))
            .order_by(Run.id)).all()]


def lost_cells(store: Store, sweep_id: str) -> tuple[list[str], set[tuple[str | None, int | None]]]:
    """The sweep's stale cells (stale_ids) and the workers holding them (host, pid), read at one moment: a frozen
    worker's process lives on and its worker file says it is live, but it trains nothing (a launch counts it out)."""
    lost = set(stale_ids(store, sweep_id))
    return sorted(lost), {(host, pid) for run_id, host, pid in running(store, sweep_id) if run_id in lost}


def run_states(store: Store, run_ids: Iterable[str]) -> dict[str, tuple[str, int]]:
    """Each of ``run_ids`` in the database, with its (status, attempts): read in chunks of CHUNK ids, in one
    transaction."""
    ids, found = list(dict.fromkeys(run_ids)), dict[str, tuple[str, int]]()
    with store.session() as s:
        for chunk in chunks(ids):
            found.update((i, (status, attempts)) for i, status, attempts in
                         s.execute(select(Run.id, Run.status, Run.attempts).where(Run.id.in_(chunk))).all())
    return found


def epochs_started(store: Store, task: str, run_ids: Iterable[str]) -> dict[str, int]:
    """The epochs done of those of ``run_ids`` (all of ``task``) that resume from a checkpoint when trained again:
    neither completed nor diverged (which trains afresh), with an epoch done. One indexed look first: a task with no
    such run (the usual case) reads no id."""
    resumes = (Run.task == task, Run.status.not_in([Status.COMPLETED, Status.DIVERGED]), Run.epochs_done > 0)
    found: dict[str, int] = {}
    with store.session() as s:
        if s.execute(select(Run.id).where(*resumes).limit(1)).first() is None:
            return found
        for chunk in chunks(list(dict.fromkeys(run_ids))):
            # a whole count only: SQLite keeps what another tool wrote (text, 2.5), which resumes nothing
            found.update((i, n) for i, n in s.execute(select(Run.id, Run.epochs_done).where(Run.id.in_(chunk), *resumes))
                         if isinstance(n, int) and not isinstance(n, bool))
    return found


def has_error(store: Store, sweep_id: str, status: str, prefix: str) -> bool:
    """Whether a cell of the sweep in ``status`` has an error that begins with ``prefix`` (matched literally)."""
    with store.session() as s:
        return s.execute(select(Run.id).where(Run.status == status, Run.id.in_(_cells(sweep_id)),
                                              Run.error.startswith(prefix, autoescape=True)).limit(1)).first() is not None


def list_sweeps(store: Store, limit: int | None = None) -> list[dict[str, Any]]:
    """The sweeps, newest first (the ``limit`` newest), each with its cells and completed cells counted: the cells
    from sweep_cells' own index, the completed ones through the status index (ix_runs_ledger), no run's row read."""
    with store.session() as s:
        q = select(Sweep).order_by(Sweep.created_at.desc())
        sweeps = s.scalars(q if limit is None else q.limit(limit)).all()
        listed = SweepCell.sweep_id.in_([w.id for w in sweeps]) if limit is not None else true()
        cells = dict(s.execute(select(SweepCell.sweep_id, func.count()).where(listed)
                               .group_by(SweepCell.sweep_id)).all())
        completed = select(Run.id).where(Run.status == Status.COMPLETED)
        done = dict(s.execute(select(SweepCell.sweep_id, func.count()).where(listed, SweepCell.run_id.in_(completed))
                              .group_by(SweepCell.sweep_id)).all())
        return [{"id": w.id, "name": w.name, "task": w.task, "created_at": w.created_at.isoformat(),
                 "cells": cells.get(w.id, 0), Status.COMPLETED: done.get(w.id, 0), "submissions": w.submissions}
                for w in sweeps]


def newest_sweep(store: Store) -> str | None:
    """The id of the sweep made last (`flctl status` without one named); None where there is none."""
    with store.session() as s:
        return s.scalars(select(Sweep.id).order_by(Sweep.created_at.desc()).limit(1)).first()


def count_sweeps(store: Store) -> int:
    with store.session() as s:
        return s.scalar(select(func.count()).select_from(Sweep)) or 0
