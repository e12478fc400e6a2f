"""A claim's compare-and-swap (RunQueue.claim_run, claim_next): which of a sweep's cells a claim may try, and taking
one in a transaction, so that two workers never both win a cell."""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any, NamedTuple

from sqlalchemy import update
from sqlalchemy.orm import Session

from flctl.config import RunConfig
from flctl.db.liveness import _is_stale, db_now
from flctl.db.schema import Run
from flctl.status import TO_DO, TRAIN_ALONE, TRAINABLE, Status


class Claim(NamedTuple):
    """A cell a pull worker claimed (RunQueue.claim_next): its config, the claim's fencing token, and whether it is
    to train alone (handed back as TRAIN_ALONE)."""

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
    return token if res.rowcount == 1 else None  # type: ignore[attr-defined]  # an UPDATE's CursorResult


def claimable(rows: Iterable[Any], stale_after: float, at: Any,
                together: Callable[[RunConfig], bool] | None) -> Iterator[Claim]:
    """RunQueue.claim_next's cells that a claim may try, unclaimed (token ""), read outside the write lock: a config
    parsed, ``together`` asked."""
    for r in rows:
        alone = r.status in TO_DO and (r.error or "").startswith(TRAIN_ALONE)   # why it was handed back
        if r.status == Status.RUNNING and not _is_stale(r, stale_after, at) or alone and together is not None:
            continue
        cfg = RunConfig.from_json(r.config)
        if together is None or together(cfg):
            yield Claim(cfg, "", alone)


def take_first(s: Session, *, batch: list[Claim], need: int,
                claim: tuple[float, int | None, str | None, str | None]) -> list[Claim]:
    """The first ``need`` of ``batch`` this transaction wins (``take_claim`` each, with ``claim``: the stale bound, the
    most attempts, the job id and git revision it records), with their tokens."""
    stale_after, max_attempts, job_id, git_sha = claim
    won: list[Claim] = []
    for c in batch:
        token = take_claim(s, c.cfg.run_id, TRAINABLE, stale_after, max_attempts, job_id, git_sha, c.cfg.device)
        if token is not None:
            won.append(c._replace(token=token))
            if len(won) >= need:
                break
    return won
