"""A sweep's cells read as aggregates: what `flctl status`, `flctl sweeps`, a wait and a launch need to know of a
sweep of 100,000 cells, without loading its rows.

States are counted in SQL by method (GROUP BY). A running cell is stale (flctl.db.liveness._is_stale) when its
heartbeat is missing or older than the stale bound at the database's clock, which the same query counts by a
cutoff; or when it runs on this host and its process has exited, which only the running cells of this host with a
fresh heartbeat are read for (as many as this host's workers hold, not as many as the sweep has). Failed and diverged
cells are counted by error text (GROUP BY), each text with its first run id: flctl.status.count_errors groups the
texts by what they say. Rows are read where a person sees them (running cells, stale ones), and of given ids in chunks.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, case, func, or_, select
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from flctl.db.liveness import STALE_AFTER_S, check_stale_after, db_now
from flctl.db.schema import Run, Sweep, SweepCell
from flctl.procs import pid_alive
from flctl.status import DIVERGED_ERROR, Status

if TYPE_CHECKING:
    from flctl.db.store import Store

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


def _of_sweep(q: Any, sweep_id: str) -> Any:
    return q.join(SweepCell, SweepCell.run_id == Run.id).where(SweepCell.sweep_id == sweep_id)


def _dead_here(s: Session, sweep_id: str, cutoff: datetime | None) -> list[tuple[str, str]]:
    """(id, method) of the sweep's running cells of this host whose heartbeat is fresh and whose process has exited:
    stale too, though no heartbeat says so yet."""
    fresh = Run.heartbeat_at.is_not(None) if cutoff is None else Run.heartbeat_at >= cutoff
    rows = s.execute(_of_sweep(select(Run.id, Run.method, Run.pid), sweep_id)
                     .where(Run.status == Status.RUNNING, Run.host == socket.gethostname(), Run.pid.is_not(None),
                            fresh)).all()
    return [(run_id, method) for run_id, method, pid in rows if not pid_alive(pid)]


def sweep_counts(store: Store, sweep_id: str, stale_after: float = STALE_AFTER_S) -> SweepCounts:
    """The sweep's cells by method and state, and its failed and diverged cells by error text (SweepCounts): three
    grouped queries and a read of this host's running cells, in one transaction."""
    with store.session() as s:
        cutoff = stale_cutoff(s, stale_after)
        # in a subquery: PostgreSQL would not take a GROUP BY of an expression whose parameters are its own
        cells = _of_sweep(select(Run.id, Run.method, case((lost_by_heartbeat(cutoff), "stale"), else_=Run.status)
                                 .label("state")), sweep_id).subquery()
        grouped = s.execute(select(cells.c.method, cells.c.state, func.count(), func.min(cells.c.id))
                            .group_by(cells.c.method, cells.c.state)).all()
        dead = _dead_here(s, sweep_id, cutoff)
        failed = s.execute(_of_sweep(select(Run.method, func.min(Run.id), Run.error, func.count()), sweep_id)
                           .where(Run.status == Status.FAILED).group_by(Run.method, Run.error)).all()
        diverged = s.execute(_of_sweep(select(Run.method, func.min(Run.id), func.count()), sweep_id)
                             .where(Run.status == Status.DIVERGED).group_by(Run.method)).all()
    states: dict[str, dict[str, int]] = {}
    for method, state, n, _ in sorted(grouped, key=lambda g: g[3]):
        states.setdefault(method, {})[state] = n
    for _, method in dead:          # PostgreSQL reads each query at its own moment: a cell may have moved since
        if states.get(method, {}).get(Status.RUNNING, 0) > 0:
            states[method][Status.RUNNING] -= 1
            states[method]["stale"] = states[method].get("stale", 0) + 1
    bad = [(m, first, text, n) for m, first, text, n in failed]
    bad += [(m, first, DIVERGED_ERROR, n) for m, first, n in diverged]
    lead: dict[str, str] = {}
    for method, first, _, _ in sorted(bad, key=lambda b: b[1]):
        lead.setdefault(method, first)
    return SweepCounts(states, sorted(bad, key=lambda b: (lead[b[0]], b[1])))


def stale_ids(store: Store, sweep_id: str, stale_after: float = STALE_AFTER_S) -> list[str]:
    """The sweep's stale cells (running, their worker gone), sorted: as many as its running cells at most."""
    with store.session() as s:
        cutoff = stale_cutoff(s, stale_after)
        lost = s.scalars(_of_sweep(select(Run.id), sweep_id).where(lost_by_heartbeat(cutoff))).all()
        return sorted([*lost, *(run_id for run_id, _ in _dead_here(s, sweep_id, cutoff))])


def running(store: Store, sweep_id: str) -> list[tuple[str, str | None, int | None]]:
    """(id, host, pid) of the sweep's running cells, by id: as many as its workers hold, and the stale ones."""
    with store.session() as s:
        return [tuple(r) for r in s.execute(_of_sweep(select(Run.id, Run.host, Run.pid), sweep_id)
                                            .where(Run.status == Status.RUNNING).order_by(Run.id)).all()]


def run_states(store: Store, run_ids: Iterable[str]) -> dict[str, tuple[str, int]]:
    """Each of ``run_ids`` in the database, with its (status, attempts): read in chunks of CHUNK ids, in one
    transaction."""
    ids, found = list(dict.fromkeys(run_ids)), {}
    with store.session() as s:
        for chunk in chunks(ids):
            found.update((i, (status, attempts)) for i, status, attempts in
                         s.execute(select(Run.id, Run.status, Run.attempts).where(Run.id.in_(chunk))).all())
    return found


def has_error(store: Store, sweep_id: str, status: str, prefix: str) -> bool:
    """Whether a cell of the sweep in ``status`` has an error that begins with ``prefix`` (matched literally)."""
    with store.session() as s:
        return s.execute(_of_sweep(select(Run.id), sweep_id)
                         .where(Run.status == status, Run.error.startswith(prefix, autoescape=True))
                         .limit(1)).first() is not None


def list_sweeps(store: Store, limit: int | None = None) -> list[dict[str, Any]]:
    """The sweeps, newest first (the ``limit`` newest), each with its cells and completed cells counted: one grouped
    query over the cells of those listed."""
    with store.session() as s:
        q = select(Sweep).order_by(Sweep.created_at.desc())
        sweeps = s.scalars(q if limit is None else q.limit(limit)).all()
        q = (select(SweepCell.sweep_id, func.count(), func.count(Run.id).filter(Run.status == Status.COMPLETED))
             .outerjoin(Run, Run.id == SweepCell.run_id).group_by(SweepCell.sweep_id))
        if limit is not None:
            q = q.where(SweepCell.sweep_id.in_([w.id for w in sweeps]))
        counts = {sid: (cells, done) for sid, cells, done in s.execute(q).all()}
        return [{"id": w.id, "name": w.name, "task": w.task, "created_at": w.created_at.isoformat(),
                 "cells": counts.get(w.id, (0, 0))[0], Status.COMPLETED: counts.get(w.id, (0, 0))[1],
                 "submissions": w.submissions} for w in sweeps]


def count_sweeps(store: Store) -> int:
    with store.session() as s:
        return s.scalar(select(func.count()).select_from(Sweep)) or 0
