"""The fenced claim protocol of workers: ``RunQueue(store)`` takes a run (compare-and-swap on status, attempts and
claim token), beats its heartbeat, hands it back, finishes or fails it, and reaps runs whose worker is gone.

Every write of a claim's holder names the claim's token and takes effect only while the run still carries it, so
a worker presumed lost (frozen, stalled past the stale bound) whose run was taken over writes nothing more. Only
the runner and sweep workers use it; readers get a Store.
"""

from __future__ import annotations

import socket
from collections.abc import Collection, Iterable
from typing import Any, NamedTuple

from sqlalchemy import case, func, select, update
from sqlalchemy.orm import Session

from flctl.db.claims import Claim, Want, take_claim, take_next
from flctl.db.liveness import STALE_AFTER_S, _is_stale, check_stale_after, db_now
from flctl.db.schema import Artifact, Run, SweepCell, now
from flctl.db.sqlite import READ_ONLY
from flctl.db.store import Store
from flctl.errors import ClaimLost
from flctl.status import TO_DO, TRAINABLE, Status


class Ended(NamedTuple):
    """How a claimed run ended, as RunQueue.finish_runs records it, with the claim's fencing token."""

    token: str
    status: str
    epochs_done: int
    metrics: dict[str, float]
    diverged_at: dict | None
    lambda_capped: int
    artifacts: dict[str, str]
    duration_s: float
    trained_with: dict[str, Any] | None = None


def _fenced(s: Session, run_id: str, token: str, values: dict[str, Any]) -> bool:
    """Update the run with ``values`` only while the claim ``token`` holds it (running under that claim); whether it
    did. Every write of a claim's holder goes through here or checks the same in its transaction."""
    res = s.execute(update(Run).where(Run.id == run_id, Run.status == Status.RUNNING, Run.claim_token == token)
                    .values(**values).execution_options(synchronize_session=False))
    return res.rowcount == 1  # type: ignore[attr-defined]  # an UPDATE's CursorResult


class RunQueue:
    """A worker's side of the run database: the claim protocol over a Store's transactions."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.engine, self.session, self.write = store.engine, store.session, store.write

    def claim_run(self, run_id: str, *, stale_after: float = STALE_AFTER_S, max_attempts: int | None = None,
                  allow: Iterable[str] = TRAINABLE, job_id: str | None = None,
                  git_sha: str | None = None, device: str | None = None) -> str | None:
        """Atomically take a run for this process; returns the claim's fencing token, or None if someone else
        holds it or it is not claimable.

        Claimable: status in ``allow``, or running with a stale heartbeat (or a dead pid on this host).
        The update is a compare-and-swap on (status, attempts, token), so two workers never both win; the token
        is new at every claim, and the writes of the claim's holder (heartbeat, finish, hand-back, and through
        ``holds`` its files) take effect only while the run still carries it.
        """
        allow = set(allow)
        check_stale_after(stale_after)
        return self.write(lambda s: take_claim(s, run_id, allow, stale_after, max_attempts, job_id, git_sha, device))

    def held(self, tokens: dict[str, str]) -> set[str]:
        """The runs of ``tokens`` (run id -> claim token) whose claims still hold them: ``holds`` for a group of
        cells in one query."""
        if not tokens:
            return set()
        with self.engine.connect().execution_options(**{READ_ONLY: True}) as conn, conn.begin():
            rows = conn.execute(select(Run.id, Run.claim_token).where(Run.id.in_(list(tokens)),
                                                                      Run.status == Status.RUNNING))
            return {run_id for run_id, token in rows if token == tokens[run_id]}

    def holds(self, run_id: str, token: str) -> bool:
        """Whether the claim with ``token`` still holds the run (it is running under that claim). A read that takes
        no write lock: training asks it before its writes, and a preemption handler interrupting it on the same
        thread (submitit's checkpoint, which hands the run back) must not wait for a lock its own thread holds."""
        return run_id in self.held({run_id: token})

    def claim_next(self, sweep_id: str, *, max_attempts: int, stale_after: float = STALE_AFTER_S,
                   job_id: str | None = None, git_sha: str | None = None, most: int = 1,
                   together: str | None = None, held: dict[str, str] | None = None) -> list[Claim]:
        """Up to ``most`` of the sweep's cells still to do, claimed for a pull worker ([] when none is left). A claim
        without ``together`` takes one cell (``most`` 1), even one handed back to train alone (Claim.alone); with it
        (a run id this worker holds), the cells that train together with that run (RunConfig.together_id), none to
        train alone. ``held`` (run id -> token) gets the claims as soon as they are made: a signal after them finds
        them all. To do: interrupted or queued with attempts left, then running with a lost worker. A failed cell is
        not: its error (a task's exception) would come again; a new launch of the sweep queues it again
        (``retry_failed``). One transaction that reads only the cells it takes (flctl.db.claims.take_next), so
        workers racing for the same cells never both win one, and a claim costs the same whatever the sweep's size."""
        if together is None and most != 1:
            raise ValueError("the first of cells together is claimed alone (most=1), the others with `together`")
        check_stale_after(stale_after)
        want = Want(sweep_id, most, max_attempts, stale_after, together)
        claimed = self.write(lambda s: take_next(s, want, job_id, git_sha))
        if held is not None:
            held.update((c.cfg.run_id, c.token) for c in claimed)
        return claimed

    def has_to_do(self, sweep_id: str, *, max_attempts: int) -> bool:
        """Whether the sweep has a cell no worker holds that a claim may take: queued or interrupted, with attempts
        left."""
        with self.session() as s:
            return s.execute(select(Run.id).join(SweepCell, SweepCell.run_id == Run.id)
                             .where(SweepCell.sweep_id == sweep_id, Run.attempts < max_attempts,
                                    Run.status.in_(TO_DO)).limit(1)).first() is not None

    def retry_failed(self, run_ids: Iterable[str], *, max_attempts: int) -> list[str]:
        """Queue the failed runs among ``run_ids`` that have attempts left (a new launch of their sweep tries them
        again: the user may have fixed the cause; within one launch a failure is not retried). Returns their ids."""
        ids = list(run_ids)

        def fn(s: Session) -> list[str]:
            found = s.scalars(select(Run.id).where(Run.id.in_(ids), Run.status == Status.FAILED,
                                                   Run.attempts < max_attempts)).all()
            if found:
                s.execute(update(Run).where(Run.id.in_(found), Run.status == Status.FAILED)
                          .values(status=Status.QUEUED).execution_options(synchronize_session=False))
            return list(found)
        return self.write(fn)

    def hand_back(self, sweep_id: str, reason: str, *, pids: Collection[int] = frozenset(),
                  job_prefixes: Collection[str] = frozenset(), stale_after: float = STALE_AFTER_S) -> list[str]:
        """Hand back the sweep's running cells held by the given local pids or Slurm jobs (by array id), or by
        any lost worker: interrupted, the attempt not counted. Returns their ids."""
        host = socket.gethostname()

        def fn(s: Session) -> list[str]:
            q = (select(Run).join(SweepCell, SweepCell.run_id == Run.id)
                 .where(SweepCell.sweep_id == sweep_id, Run.status == Status.RUNNING))
            ids = []
            at = db_now(s)
            for run in s.scalars(q).all():
                ours = ((run.host == host and run.pid in pids)
                        or (run.job_id is not None and run.job_id.split("_")[0] in job_prefixes))
                if not (ours or _is_stale(run, stale_after, at)):
                    continue
                res = s.execute(update(Run).where(Run.id == run.id, Run.status == Status.RUNNING,
                                                  Run.attempts == run.attempts)
                                .values(status=Status.INTERRUPTED, error=reason, attempts=max(run.attempts - 1, 0))
                                .execution_options(synchronize_session=False))
                if res.rowcount == 1:  # type: ignore[attr-defined]  # an UPDATE's CursorResult
                    ids.append(run.id)
            return ids
        return self.write(fn)

    def reap(self, *, stale_after: float = STALE_AFTER_S, max_attempts: int | None = None,
             run_ids: Iterable[str] | None = None) -> tuple[list[str], list[str]]:
        """Re-queue running runs whose worker is gone (stale heartbeat, or dead pid on this host).

        Runs that already used ``max_attempts`` are marked failed instead. Returns (requeued, failed).
        """
        def fn(s: Session) -> tuple[list[str], list[str]]:
            q = select(Run).where(Run.status == Status.RUNNING)
            if run_ids is not None:
                q = q.where(Run.id.in_(list(run_ids)))
            requeued: list[str] = []
            failed: list[str] = []
            at = db_now(s)
            for run in s.scalars(q).all():
                if not _is_stale(run, stale_after, at):
                    continue
                give_up = max_attempts is not None and run.attempts >= max_attempts
                res = s.execute(
                    update(Run).where(Run.id == run.id, Run.status == Status.RUNNING, Run.attempts == run.attempts)
                    .values(status=Status.FAILED if give_up else Status.QUEUED,
                            error=(f"worker lost (heartbeat stale); gave up after {run.attempts} attempts"
                                   if give_up else "worker lost (heartbeat stale); re-queued"))
                    .execution_options(synchronize_session=False))
                if res.rowcount == 1:  # type: ignore[attr-defined]  # an UPDATE's CursorResult
                    (failed if give_up else requeued).append(run.id)
            return requeued, failed
        return self.write(fn)

    def requeue(self, run_id: str, token: str, reason: str, duration_s: float = 0.0,
                epochs_done: int | None = None) -> bool:
        """Hand a running run back (stopped, preempted, timed out): interrupted, and the next claim resumes it
        from its checkpoint. The time it trained counts towards its duration. False (nothing written) when the
        claim ``token`` no longer holds the run.

        A handed-back attempt is not a failed one, so it is given back too; otherwise a cell preempted
        ``max_attempts`` times would stay queued with no attempt left to claim it.
        """
        return run_id in self.requeue_all({run_id: token}, reason, duration_s, epochs_done=epochs_done)

    def requeue_all(self, tokens: dict[str, str], reason: str, duration_s: float = 0.0, *,
                    epochs_done: int | None = None, once: bool = False) -> set[str]:
        """``requeue`` for a group of runs (run id -> claim token) in one transaction; the ids it handed back. ``once``:
        one retry (a lock conflict), not eight: after the disk filled up, each would wait for room (5 s a write)."""
        values: dict[str, Any] = {"status": Status.INTERRUPTED, "error": reason, "attempts": Run.attempts - 1,
                                  "duration_s": func.coalesce(Run.duration_s, 0.0) + duration_s}
        if epochs_done is not None:
            values["epochs_done"] = epochs_done

        def fn(s: Session) -> set[str]:
            return {run_id for run_id, token in tokens.items() if _fenced(s, run_id, token, values)}
        return self.write(fn, attempts=2) if once else self.write(fn)

    def heartbeat(self, run_id: str, token: str, epochs_done: int | None = None) -> bool:
        """Refresh the claim's heartbeat (the database's clock); False when the claim no longer holds the run."""
        return run_id in self.beat({run_id: token}, {run_id: epochs_done})

    def beat(self, tokens: dict[str, str], epochs: dict[str, int | None] | None = None) -> set[str]:
        """Refresh the heartbeats of the runs of ``tokens`` (run id -> claim token) at the database's clock, each with
        its latest epoch count where ``epochs`` gives one, in one statement whatever their number; the runs whose
        claims still hold them (nothing is written for the others: taken over). The ids and the tokens are matched
        as two sets: a token is random and new at each claim, so no run carries one of ours unless we claimed it."""
        if not tokens:
            return set()
        counts = {run_id: n for run_id, n in (epochs or {}).items() if n is not None and run_id in tokens}

        def fn(s: Session) -> set[str]:
            mine = (Run.id.in_(list(tokens)), Run.claim_token.in_(set(tokens.values())), Run.status == Status.RUNNING)
            values: dict[str, Any] = {"heartbeat_at": db_now(s)}
            if counts:
                values["epochs_done"] = case(counts, value=Run.id, else_=Run.epochs_done)
            stmt = update(Run).where(*mine).values(**values).execution_options(synchronize_session=False)
            if s.get_bind().dialect.update_returning:      # SQLite from 3.35, PostgreSQL
                return set(s.scalars(stmt.returning(Run.id)))
            s.execute(stmt)
            return set(s.scalars(select(Run.id).where(*mine)))
        return self.write(fn)

    def _fenced_update(self, run_id: str, token: str, values: dict[str, Any]) -> bool:
        return self.write(lambda s: _fenced(s, run_id, token, values))

    def start_afresh(self, run_id: str, token: str) -> bool:
        """The claimed run starts from scratch (--rerun, a diverged run trained again): the earlier life's time and
        attempts stop counting, or its duration (and the seconds per epoch that cost estimates read) would add
        up over reruns."""
        return self._fenced_update(run_id, token, {"attempts": 1, "duration_s": None, "epochs_done": 0})

    def record_provenance(self, claims: dict[str, tuple[str, dict[str, Any]]]) -> set[str]:
        """Where the code that trains each claimed run comes from (run id -> (claim token, provenance); flctl.runner,
        as cells together start training), in one transaction for them all; returns the runs whose claims still held."""
        def fn(s: Session) -> set[str]:
            return {run_id for run_id, (token, prov) in claims.items() if _fenced(s, run_id, token, {"provenance": prov})}
        return self.write(fn)

    def finish_run(self, run_id: str, token: str, *, status: str, epochs_done: int, metrics: dict[str, float],
                   diverged_at: dict | None, lambda_capped: int, artifacts: dict[str, str],
                   duration_s: float, trained_with: dict[str, Any] | None = None) -> None:
        """Record how a run ended. ClaimLost (nothing written) when the claim ``token`` no longer holds it."""
        ended = Ended(token, status, epochs_done, metrics, diverged_at, lambda_capped, artifacts, duration_s,
                      trained_with)
        if self.finish_runs({run_id: ended}):
            raise ClaimLost(f"run {run_id}: another worker holds it now; its outcome here is not recorded")

    def finish_runs(self, ended: dict[str, Ended]) -> set[str]:
        """Record how runs ended (run id -> Ended), in one transaction: cells together that end at once are one
        write, not one each. Returns the runs whose claims no longer held them: nothing is written for those."""
        def fn(s: Session) -> set[str]:
            lost = set()
            # locked as read (PostgreSQL; SQLite's writer holds the database): a claim taken over between the read and
            # the write would otherwise be overwritten by this outcome
            runs = list(s.scalars(select(Run).where(Run.id.in_(list(ended))).order_by(Run.id).with_for_update()))
            assert len(runs) == len(ended), sorted(ended)      # a claimed run is never deleted
            for run in runs:
                end = ended[run.id]
                if run.status != Status.RUNNING or run.claim_token != end.token:
                    lost.add(run.id)
                    continue
                run.status, run.epochs_done, run.metrics = end.status, end.epochs_done, end.metrics
                run.trained_with = end.trained_with or None
                run.diverged_at, run.lambda_capped = end.diverged_at, end.lambda_capped
                run.finished_at = run.heartbeat_at = now()
                run.duration_s = (run.duration_s or 0.0) + end.duration_s
                run.artifacts = [Artifact(kind=k, path=p) for k, p in sorted(end.artifacts.items())]
            return lost
        return self.write(fn) if ended else set()

    def fail_run(self, run_id: str, token: str, error: str, duration_s: float, *, epochs_done: int | None = None,
                 retry_below: int | None = None) -> bool:
        """Record the claimed run's failure. ``retry_below``: a failure another process may not meet (a device that
        died under it) queues the run again, its attempt counted, while it has used fewer attempts than this.
        Only a run still running under this claim fails: one handed back by a preempted job stays interrupted, and
        one another worker took over is theirs."""
        status: Any = Status.FAILED if retry_below is None else \
            case((Run.attempts < retry_below, Status.QUEUED), else_=Status.FAILED)
        values: dict[str, Any] = {"status": status, "error": error, "finished_at": now(),
                                  "duration_s": func.coalesce(Run.duration_s, 0.0) + duration_s}
        if epochs_done is not None:
            values["epochs_done"] = epochs_done
        return self._fenced_update(run_id, token, values)
