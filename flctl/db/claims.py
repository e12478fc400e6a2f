"""A claim's compare-and-swap (RunQueue.claim_run) and a pull worker's claim of a sweep's next cells (take_next,
RunQueue.claim_next): one transaction that reads at most the cells it takes, through an index, and takes them, so
that two workers never both win a cell and a claim costs the same whatever the sweep's size."""

from __future__ import annotations

import json
import math
import os
import secrets
import socket
from collections.abc import Collection
from datetime import timedelta
from typing import Any, NamedTuple

from sqlalchemy import Text, and_, exists, or_, select, type_coerce, update
from sqlalchemy.orm import Session

from flctl.config import RunConfig
from flctl.db.liveness import _is_stale, db_now
from flctl.db.schema import Run, SweepCell
from flctl.procs import pid_alive
from flctl.status import REPORTABLE, TO_DO, TRAIN_ALONE, Status


class Claim(NamedTuple):
    """A cell a pull worker claimed (RunQueue.claim_next): its config, the claim's fencing token, and whether it is
    to train alone (handed back as TRAIN_ALONE). One row won; a worker's cells claimed at once are
    flctl.launch.claims.ClaimedTogether, and runs while they train flctl.claimed.ClaimedRuns."""

    cfg: RunConfig
    token: str
    alone: bool = False


def take_claim(s: Session, run_id: str, allow: Collection[str], stale_after: float, max_attempts: int | None,
          job_id: str | None, git_sha: str | None, device: str | None) -> str | None:
    """RunQueue.claim_run's compare-and-swap, in the transaction ``s``: the new claim's token, or None."""
    run = s.get(Run, run_id)
    if run is None:
        return None
    stamp = db_now(s)
    if not (run.status in allow or (run.status == Status.RUNNING and _is_stale(run, stale_after, stamp))):
        return None
    if max_attempts is not None and run.attempts >= max_attempts:
        return None
    token = secrets.token_hex(16)
    res = s.execute(
        update(Run).where(Run.id == run_id, Run.status == run.status, Run.attempts == run.attempts,
                          Run.claim_token.is_(None) if run.claim_token is None
                          else Run.claim_token == run.claim_token)
        .values(status=Status.RUNNING, attempts=run.attempts + 1, error=None, host=socket.gethostname(),
                pid=os.getpid(), job_id=job_id, git_sha=git_sha, device=device, started_at=stamp,
                heartbeat_at=stamp, finished_at=None, claim_token=token)
        .execution_options(synchronize_session=False))
    if res.rowcount != 1:  # type: ignore[attr-defined]  # an UPDATE's CursorResult
        return None
    if run.status in REPORTABLE:      # a finished run trained again (`flctl run --rerun`)
        retrain(s, [run_id])
    return token


class Want(NamedTuple):
    """What RunQueue.claim_next takes: up to ``need`` cells of ``sweep_id``, with attempts left below ``max_attempts``;
    ``with_run``: only cells that train together with that run (its Run.together key), none handed back to train
    alone; ``stale_after``: a running cell whose heartbeat is older is its lost worker's, and may be taken back."""

    sweep_id: str
    need: int
    max_attempts: int
    stale_after: float
    with_run: str | None = None


def take_next(s: Session, want: Want, job_id: str | None, git_sha: str | None) -> list[Claim]:
    """The cells ``want`` names that this transaction wins, claimed, with their tokens: RunQueue.claim_next.

    Reads only what it takes. The cells still to do are read through the index ix_runs_claim (status, together, id)
    a status at a time, interrupted first (they resume from a checkpoint), at most ``need`` of them, so a claim costs
    the same on a sweep of a thousand cells or of a hundred thousand. On PostgreSQL the read locks them FOR UPDATE
    SKIP LOCKED: a worker racing for the same rows skips to the next free ones instead of waiting, and never wins a
    row another holds. On SQLite the whole transaction holds the one write lock (flctl.db.sqlite, BEGIN IMMEDIATE),
    so nobody moves between the read and the write either. Cells of lost workers are taken back only when nothing
    is left to do (a queue drains before it retries), as each worker's own claims find them."""
    won: list[Claim] = []
    by_device: dict[str | None, list[str]] = {}
    token, stamp = secrets.token_hex(16), db_now(s)
    for _ in range(want.need + MOST_DAMAGED):      # a damaged cell is failed and the next one read in its place
        rows: list[Any] = []
        for status in (Status.INTERRUPTED, Status.QUEUED):
            if len(rows) < want.need - len(won):
                rows += s.execute(_candidates(want, Run.status == status).limit(want.need - len(won) - len(rows))).all()
        if len(rows) < want.need - len(won):
            rows += _lost(s, want, want.need - len(won) - len(rows))
        if not rows:
            break
        damaged = {}
        for r in rows:
            try:
                cfg = RunConfig.from_json(json.loads(r.config) if isinstance(r.config, str) else r.config)
            except Exception as exc:      # noqa: BLE001  (any way a stored config can be unreadable)
                damaged[r.id] = f"{DAMAGED}: {type(exc).__name__}: {str(exc)[:200]}"
                continue
            by_device.setdefault(cfg.device, []).append(r.id)
            won.append(Claim(cfg, token, r.status in TO_DO and (r.error or "").startswith(TRAIN_ALONE)))
        for run_id, why in damaged.items():   # failed now: one unreadable row must not stall every claim after it
            s.execute(update(Run).where(Run.id == run_id).values(status=Status.FAILED, error=why, finished_at=stamp)
                      .execution_options(synchronize_session=False))
        if not damaged:
            break
    for device, ids in by_device.items():   # one statement a device (one, in any sweep flctl plans)
        s.execute(update(Run).where(Run.id.in_(ids))
                  .values(status=Status.RUNNING, attempts=Run.attempts + 1, error=None, host=socket.gethostname(),
                          pid=os.getpid(), job_id=job_id, git_sha=git_sha, device=device, started_at=stamp,
                          heartbeat_at=stamp, finished_at=None, claim_token=token)
                  .execution_options(synchronize_session=False))
    return won


def retrain(s: Session, run_ids: list[str]) -> None:
    """The claimed runs' cells to be mirrored again when they finish (flctl.study replaces a cell's Optuna trial: a
    diverged cell completed by a rerun is no longer a FAIL trial). Only a finished run's cell is marked mirrored,
    and only a claim that takes a finished run (take_claim's ``allow``) trains one again: a pull worker's claims
    (take_next) take none. After the run's own update, in its transaction: a mirror that read the run before this
    claim sees it changed under its lock (flctl.study_rdb) and leaves its cell unmarked."""
    s.execute(update(SweepCell).where(SweepCell.run_id.in_(run_ids), SweepCell.mirrored).values(mirrored=False)
              .execution_options(synchronize_session=False))


# The config read as its stored text where the engine keeps JSON as text (SQLite), so that a row that is not JSON is
# one failed cell here, not a decoding error of the whole read (PostgreSQL's driver hands JSON over parsed).
_READ = (Run.id, Run.status, type_coerce(Run.config, Text).label("config"), Run.error)
# Damaged cells a claim fails before it gives up looking further (the rest wait for the next claim).
MOST_DAMAGED = 16
DAMAGED = "its stored config cannot be read (the database row was damaged; restore it from a backup)"


def _candidates(want: Want, which: Any) -> Any:
    """The statement that reads ``which`` of ``want``'s cells in the index's order, locked where the engine can
    (PostgreSQL's FOR UPDATE SKIP LOCKED; SQLAlchemy leaves it out on SQLite, whose writer holds the database)."""
    q = (select(*_READ).where(which, Run.attempts < want.max_attempts,
                              exists().where(SweepCell.sweep_id == want.sweep_id, SweepCell.run_id == Run.id)))
    if want.with_run is not None:     # cells that train with it, none handed back to train alone
        q = q.where(Run.together == select(Run.together).where(Run.id == want.with_run).scalar_subquery(),
                    or_(Run.error.is_(None), ~Run.error.startswith(TRAIN_ALONE, autoescape=True)))
    return q.order_by(Run.together, Run.id).with_for_update(of=Run, skip_locked=True)


def _lost(s: Session, want: Want, need: int) -> list[Any]:
    """Up to ``need`` of ``want``'s running cells whose worker is lost: a heartbeat older than the stale bound at the
    database's clock (found through the index), or a worker of this host whose process has exited. Both read only
    running cells, which are as many as the workers hold, not as many as the sweep has."""
    if math.isinf(want.stale_after):
        beat_lost: Any = Run.heartbeat_at.is_(None)
    else:
        beat_lost = or_(Run.heartbeat_at.is_(None),
                        Run.heartbeat_at < db_now(s) - timedelta(seconds=want.stale_after))
    rows = list(s.execute(_candidates(want, and_(Run.status == Status.RUNNING, beat_lost)).limit(need)).all())
    if len(rows) < need:
        here = s.execute(select(Run.id, Run.pid).where(Run.status == Status.RUNNING,
                                                       Run.host == socket.gethostname())).all()
        gone = [run_id for run_id, pid in here if pid is not None and not pid_alive(pid)
                and run_id not in {r.id for r in rows}]
        if gone:
            rows += s.execute(_candidates(want, and_(Run.status == Status.RUNNING, Run.id.in_(gone)))
                              .limit(need - len(rows))).all()
    return rows
