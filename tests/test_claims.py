"""A pull worker's claim of a sweep's next cells (RunQueue.claim_next, flctl.db.claims.take_next): what it takes and
in which order, that it reads through the index whatever the sweep's size, that 16 processes racing over a sweep of
100,000 cells never both win one, and that a worker killed in the middle of a claim or a heartbeat loses nothing and
trains nothing twice. SQLite and the real PostgreSQL (FLCTL_TEST_PG) alike."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import text, update

from flctl.config import RunConfig
from flctl.db import RunQueue, Store
from flctl.db.claims import Want, _candidates
from flctl.db.liveness import db_now
from flctl.db.queue import Ended
from flctl.db.schema import Run
from flctl.status import TRAIN_ALONE, Status
from tests import warm
from tests.helpers import config
from tests.test_concurrency import BACKENDS, database_url

SID = "claimsweep01"


def url_of(backend: str, tmp_path: Path) -> str:
    return database_url(backend, tmp_path)


def sweep(store: Store, cfgs: list[RunConfig], sid: str = SID) -> list[str]:
    store.create_sweep(sid, None, "two-moons", {}, cfgs)
    return [c.run_id for c in cfgs]


def set_rows(store: Store, ids: list[str], **values) -> None:
    store.write(lambda s: s.execute(update(Run).where(Run.id.in_(ids)).values(**values)))


def cells(n: int, **overrides) -> list[RunConfig]:
    base = config("two-moons", "erm", **{"epochs": 1, **overrides})
    return [dataclasses.replace(base, lr=1e-4 * (1 + i)) for i in range(n)]


def ended(token: str) -> Ended:
    return Ended(token, Status.COMPLETED, 1, {"x": 1.0}, None, 0, {"records": "r"}, 0.0)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_claim_takes_interrupted_then_queued_then_lost_cells_and_never_a_live_one(tmp_path: Path,
                                                                                   backend: str) -> None:
    store = Store.open(url_of(backend, tmp_path))
    ids = sorted(sweep(store, cells(9)))
    interrupted, queued, stale, dead, alive, failed, spent = ids[0], ids[1:3], ids[3], ids[4], ids[5], ids[6], ids[7]
    outside = sweep(store, cells(1, seed=5), sid="othersweep01")        # another sweep's cell is never ours
    with store.session() as s:
        long_ago = db_now(s) - timedelta(hours=1)
    set_rows(store, [interrupted], status=Status.INTERRUPTED, attempts=1)
    set_rows(store, [stale], status=Status.RUNNING, attempts=1, heartbeat_at=long_ago, host="elsewhere", pid=1)
    set_rows(store, [dead], status=Status.RUNNING, attempts=1, heartbeat_at=db_now_of(store), host=socket.gethostname(),
             pid=dead_pid())
    set_rows(store, [alive], status=Status.RUNNING, attempts=1, heartbeat_at=db_now_of(store),
             host=socket.gethostname(), pid=os.getpid(), claim_token="f" * 32)
    set_rows(store, [failed], status=Status.FAILED, attempts=1)
    set_rows(store, [spent, ids[8]], status=Status.QUEUED, attempts=3)            # no attempt left (of 3)
    queue = RunQueue(store)
    taken = []
    while got := queue.claim_next(SID, max_attempts=3, stale_after=60):
        [c] = got
        taken.append(c.cfg.run_id)
    # interrupted first (they resume from a checkpoint), then queued, then the lost workers' (stale, then dead pid)
    assert taken == [interrupted, *queued, stale, dead]
    runs = {r.id: r for r in store.list_runs()}
    assert all(runs[i].status == "running" and runs[i].pid == os.getpid() for i in taken)
    assert [runs[i].attempts for i in taken] == [2, 1, 1, 2, 2]
    assert len({runs[i].claim_token for i in taken}) == len(taken)               # a new token at every claim
    assert runs[alive].claim_token == "f" * 32 and runs[failed].status == "failed"
    assert runs[spent].status == "queued" and runs[outside[0]].status == "queued"


def db_now_of(store: Store):
    with store.session() as s:
        return db_now(s)


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_grouped_claims_take_only_the_leads_kind_and_none_handed_back_to_train_alone(tmp_path: Path,
                                                                                    backend: str) -> None:
    store = Store.open(url_of(backend, tmp_path))
    one, two = cells(6, epochs=1), cells(6, epochs=2)         # epochs is shared: two kinds that cannot train together
    sweep(store, one + two)
    alone = one[5].run_id
    set_rows(store, [alone], status=Status.INTERRUPTED, error=f"{TRAIN_ALONE}: its group failed")
    queue = RunQueue(store)
    with pytest.raises(ValueError):
        queue.claim_next(SID, max_attempts=3, most=2)
    held: dict[str, str] = {}
    [lead] = queue.claim_next(SID, max_attempts=3, held=held)
    assert lead.cfg.run_id == alone and lead.alone          # handed back to train alone: claimed first, alone
    [lead] = queue.claim_next(SID, max_attempts=3, held=held)
    kind = {c.run_id for c in (one if lead.cfg.epochs == 1 else two)} - {alone}
    more = queue.claim_next(SID, max_attempts=3, most=10, together=lead.cfg.run_id, held=held)
    assert {c.cfg.run_id for c in more} == kind - {lead.cfg.run_id} and not any(c.alone for c in more)
    assert set(held) == kind | {alone}
    assert {c.cfg.together_id for c in more} == {lead.cfg.together_id}
    # the held cells beat in one statement; a cell taken over by another claim is no longer ours
    other = next(iter(kind - {lead.cfg.run_id}))
    set_rows(store, [other], claim_token="0" * 32)
    assert queue.beat(held, dict.fromkeys(held, 4)) == set(held) - {other}
    assert store.get_run(lead.cfg.run_id).epochs_done == 4 and store.get_run(other).epochs_done == 0


ROUNDS = 6
RACER = r"""
import json, sys
from flctl.db import RunQueue, Store
from flctl.db.queue import Ended
url, sid, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
queue = RunQueue(Store.open(url))
mine = []
for _ in range(rounds):
    held = {}
    lead = queue.claim_next(sid, max_attempts=3, stale_after=3600, held=held)
    if not lead:
        break
    queue.claim_next(sid, max_attempts=3, stale_after=3600, most=7, together=lead[0].cfg.run_id, held=held)
    assert queue.beat(held, dict.fromkeys(held, 1)) == set(held)
    assert not queue.finish_runs({r: Ended(t, "completed", 1, {"x": 1.0}, None, 0, {}, 0.0) for r, t in held.items()})
    mine += held
print(json.dumps(mine))
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_at_100000_cells_a_claim_reads_through_the_index_and_16_racing_processes_never_both_win_one(
        tmp_path: Path, backend: str) -> None:
    """The plan of a claim's read at 100,000 cells: the index ix_runs_claim, in its order (no sort of the cells to
    do), so a claim costs the same as at a thousand (benchmarks/bench_scale.py measures it), with the statistics the
    launch leaves (flctl.db.bulk.fresh_statistics). Then 16 processes claim groups of that sweep at once."""
    url = url_of(backend, tmp_path)
    store = Store.open(url)
    ids = sweep(store, cells(50_000, epochs=1) + cells(50_000, epochs=2))
    for want in (Want(SID, 1, 3, 300.0), Want(SID, 7, 3, 300.0, ids[0])):
        with store.session() as s:
            stmt = _candidates(want, Run.status == Status.QUEUED).limit(want.need)
            sql = str(stmt.compile(dialect=s.get_bind().dialect, compile_kwargs={"literal_binds": True}))
            plan = "\n".join(str(r) for r in s.execute(text(("EXPLAIN QUERY PLAN " if backend == "sqlite"
                                                              else "EXPLAIN ") + sql)))
        assert "ix_runs_claim" in plan and "TEMP B-TREE" not in plan and "Sort" not in plan, plan

    procs = [warm.Popen([sys.executable, "-c", RACER, url, SID, str(ROUNDS)], stdout=warm.PIPE, stderr=warm.PIPE)
             for _ in range(16)]
    claimed: list[str] = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        claimed += json.loads(out)
    assert len(claimed) == 16 * ROUNDS * 8 and len(set(claimed)) == len(claimed)     # no cell won twice
    with store.session() as s:
        done = dict(s.execute(text("SELECT id, attempts FROM runs WHERE status = 'completed'")).all())
    assert set(done) == set(claimed) and set(done.values()) == {1}


# A worker frozen at one point of its claim or heartbeat (an event on its engine), then killed with SIGKILL there.
FROZEN = r"""
import os, sys, time
from sqlalchemy import event
from flctl.db import RunQueue, Store
url, sid, where = sys.argv[1], sys.argv[2], sys.argv[3]
store = Store.open(url)
queue = RunQueue(store)
def freeze(*_):
    print("frozen", flush=True)
    time.sleep(3600)
def at(statement):
    return lambda conn, cursor, sql, *rest: sql.lstrip().upper().startswith(statement) and freeze()
if where == "claim-read":
    event.listen(store.engine, "after_cursor_execute", at("SELECT RUNS.ID, RUNS.STATUS"))
elif where == "claim-write":
    event.listen(store.engine, "after_cursor_execute", at("UPDATE RUNS SET STATUS"))
held = {}
queue.claim_next(sid, max_attempts=3, stale_after=2, held=held)
queue.claim_next(sid, max_attempts=3, stale_after=2, most=3, together=next(iter(held)), held=held)
if where == "beat":
    event.listen(store.engine, "after_cursor_execute", at("UPDATE RUNS SET HEARTBEAT_AT"))
    queue.beat(held)
freeze()      # "claimed": the claims are committed, the worker dies before it trains
"""


@pytest.mark.parametrize("where", ["claim-read", "claim-write", "beat", "claimed"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_worker_killed_inside_a_claim_or_a_heartbeat_loses_nothing_and_trains_nothing_twice(
        tmp_path: Path, backend: str, where: str) -> None:
    url = url_of(backend, tmp_path)
    store = Store.open(url)
    ids = sweep(store, cells(8))
    proc = warm.Popen([sys.executable, "-c", FROZEN, url, SID, where], stdout=warm.PIPE, stderr=warm.PIPE)
    deadline = time.monotonic() + 60
    while "frozen" not in proc.peek():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    proc.kill()
    proc.wait(30)
    # A worker left: it drains the sweep, taking back what the killed one held once its heartbeat is 2 s old.
    queue, trained = RunQueue(Store.open(url)), []
    deadline = time.monotonic() + 60
    while len(trained) < len(ids):
        assert time.monotonic() < deadline, trained
        held: dict[str, str] = {}
        if not queue.claim_next(SID, max_attempts=3, stale_after=2, held=held):
            time.sleep(0.2)
            continue
        queue.claim_next(SID, max_attempts=3, stale_after=2, most=7, together=next(iter(held)), held=held)
        assert not queue.finish_runs({r: ended(t) for r, t in held.items()})
        trained += held
    assert sorted(trained) == sorted(ids)                       # each trained once, none lost
    runs = store.list_runs()
    assert {r.status for r in runs} == {"completed"}
    # a claim killed before its commit left no trace; one committed counts the killed worker's attempt
    taken_back = {r.id for r in runs if r.attempts == 2}
    assert (len(taken_back) == 4) == (where in ("beat", "claimed")) and {r.attempts for r in runs} <= {1, 2}
