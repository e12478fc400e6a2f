"""Run claiming, reaping and hand-back: the rules that keep a sweep from losing or duplicating work."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import update

from flctl.db import RunQueue, Store
from flctl.db.schema import Run, now
from tests.helpers import config

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.notorch


def store_with_run(tmp_path: Path):
    store = Store.open(f"sqlite:///{tmp_path / 'flctl.db'}")
    cfg = config("two-moons", "fl")
    store.add_runs([cfg])
    return store, cfg.run_id


def age_heartbeat(store: Store, run_id: str, seconds: float, pid: int | None = None) -> None:
    with store.session() as s:
        s.execute(update(Run).where(Run.id == run_id)
                  .values(heartbeat_at=now() - timedelta(seconds=seconds), **({"pid": pid} if pid else {})))


def test_a_run_is_claimed_once_until_its_worker_is_lost(tmp_path: Path) -> None:
    store, rid = store_with_run(tmp_path)
    assert RunQueue(store).claim_run(rid, stale_after=60)
    assert not RunQueue(store).claim_run(rid, stale_after=60)           # held by a live worker (this process)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    age_heartbeat(store, rid, 0, pid=int(dead.stdout))         # its pid is gone: stale at once
    assert RunQueue(store).claim_run(rid, stale_after=60)
    assert store.get_run(rid).attempts == 2


def test_reap_requeues_stale_runs_and_gives_up_after_max_attempts(tmp_path: Path) -> None:
    store, rid = store_with_run(tmp_path)
    assert RunQueue(store).claim_run(rid)
    age_heartbeat(store, rid, 10)
    assert RunQueue(store).reap(stale_after=60) == ([], [])              # recent heartbeat: still alive
    age_heartbeat(store, rid, 120)
    assert RunQueue(store).reap(stale_after=60, max_attempts=3) == ([rid], [])
    assert store.get_run(rid).status == "queued"
    assert RunQueue(store).claim_run(rid) and RunQueue(store).claim_run(rid, allow=("queued",)) is None
    age_heartbeat(store, rid, 120)
    assert RunQueue(store).reap(stale_after=60, max_attempts=2) == ([], [rid])
    row = store.get_run(rid)
    assert row.status == "failed" and "gave up after 2 attempts" in row.error
    assert not RunQueue(store).claim_run(rid, max_attempts=2)


def test_heartbeats_are_judged_to_the_millisecond_on_sqlite(tmp_path: Path) -> None:
    # SQLite's CURRENT_TIMESTAMP is truncated to the second: by it a beat 0.6 s old was 0 or 1 s old, and a 2 s
    # stale bound (test_fencing's) held for anywhere between 1 and 3 s.
    import time

    from flctl.db.liveness import db_now

    store, rid = store_with_run(tmp_path)
    with store.session() as s:
        first = db_now(s)
        time.sleep(0.25)
        gap = (db_now(s) - first).total_seconds()
    assert 0.2 <= gap < 0.6
    assert RunQueue(store).claim_run(rid)
    age_heartbeat(store, rid, 0.1)
    assert RunQueue(store).reap(stale_after=0.6) == ([], [])
    age_heartbeat(store, rid, 0.9)
    assert RunQueue(store).reap(stale_after=0.6) == ([rid], [])


def test_a_preempted_attempt_does_not_count(tmp_path: Path) -> None:
    store, rid = store_with_run(tmp_path)
    token = RunQueue(store).claim_run(rid, max_attempts=1)
    assert token and RunQueue(store).requeue(rid, token, "preempted")
    row = store.get_run(rid)
    assert (row.status, row.attempts) == ("interrupted", 0)
    assert RunQueue(store).claim_run(rid, max_attempts=1)                # the requeued job can take it again


def test_completed_runs_are_never_claimed_again(tmp_path: Path) -> None:
    store, rid = store_with_run(tmp_path)
    token = RunQueue(store).claim_run(rid)
    assert token
    RunQueue(store).finish_run(rid, token, status="completed", epochs_done=1, metrics={}, diverged_at=None, lambda_capped=0,
                     artifacts={}, duration_s=1.0)
    age_heartbeat(store, rid, 10_000)
    assert not RunQueue(store).claim_run(rid) and RunQueue(store).reap(stale_after=1) == ([], [])
    assert not RunQueue(store).fail_run(rid, token, "late failure report", 1.0)   # only a running run can fail
    assert store.get_run(rid).status == "completed"


def test_a_groups_cells_finish_in_one_transaction_and_a_lost_claim_writes_nothing(tmp_path: Path) -> None:
    from sqlalchemy import event

    from flctl.db import Ended

    store = Store.open(f"sqlite:///{tmp_path / 'flctl.db'}")
    cfgs = [config("two-moons", "fl", seed=s) for s in range(3)]
    store.add_runs(cfgs)
    queue = RunQueue(store)
    tokens = {c.run_id: queue.claim_run(c.run_id) for c in cfgs}
    taken = cfgs[2].run_id
    age_heartbeat(store, taken, 10_000)
    assert queue.claim_run(taken, stale_after=1)                 # another worker took the third over
    commits: list[int] = []
    event.listen(store.engine, "commit", lambda conn: commits.append(1))
    lost = queue.finish_runs({c.run_id: Ended(tokens[c.run_id], "completed", 4, {"train.avg_loss": 0.5 + i}, None,
                                              0, {"records": f"records/{c.run_id}"}, 2.0) for i, c in enumerate(cfgs)})
    assert lost == {taken} and len(commits) == 1
    done = [store.get_run(c.run_id) for c in cfgs]
    assert [(r.status, r.epochs_done, r.metrics) for r in done[:2]] == \
        [("completed", 4, {"train.avg_loss": 0.5}), ("completed", 4, {"train.avg_loss": 1.5})]
    assert done[0].artifacts == {"records": f"records/{cfgs[0].run_id}"} and done[2].status == "running"
    assert queue.finish_runs({}) == set()


def test_run_record_fields_are_the_runs_table_columns() -> None:
    # RunRecord is what the store hands out; it mirrors the table, so a new column shows up in both or fails here.
    import dataclasses

    from sqlalchemy import inspect

    from flctl.db import RunRecord
    from flctl.db.schema import Run

    columns = [c.key for c in inspect(Run).column_attrs]
    assert [f.name for f in dataclasses.fields(RunRecord)] == [*columns, "artifacts"]


def test_id_prefixes_are_hex_matched_literally_and_an_ambiguous_one_lists_candidates(tmp_path: Path) -> None:
    import sqlalchemy as sa

    from flctl.errors import ConfigError
    store = Store.open(f"sqlite:///{tmp_path / 'flctl.db'}")
    with store.session() as s:
        for tail in ("1", "2"):
            s.execute(sa.insert(Run).values(id="abcd00000000000" + tail, config_hash="abcd" + "0" * 59 + tail,
                                            task="two-moons", method="fl", seed=0, config={}, status="queued",
                                            epochs_done=0, attempts=0, created_at=now()))
    with pytest.raises(ConfigError, match=r"matches several runs \(abcd000000000001, abcd000000000002\)"):
        store.get_run("abcd")
    assert store.get_run("ABCD000000000002").id == "abcd000000000002"
    assert store.get_run("abcd0000000000019") is None
    for bad in ("abc", "abc%", "ab_d", "%", "", "g" * 8, "a" * 65):
        with pytest.raises(ConfigError, match="give 4 to 64 hex digits"):
            store.get_run(bad)
    assert store.get_sweep("%") is None and store.get_sweep("") is None


def test_a_reader_opened_beside_a_writer_in_one_process_leaves_the_writers_lock_alone(tmp_path: Path) -> None:
    """Closing any descriptor of a file drops every POSIX lock the process holds on it. A read-only open in a process
    that has the database open for writing (`flctl run`, then a report, through the Python API or one test) must not
    open and close the file itself: the writer's shared lock would go, another process's last connection would
    checkpoint and delete the -wal file under it, and it would read "database disk image is malformed"."""
    from flctl.db.sqlite import _SQLITE_SHARED_FIRST, _SQLITE_SHARED_SIZE

    path = tmp_path / "flctl.db"
    probe = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR)\n"
             "try:\n"
             f"    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, {_SQLITE_SHARED_SIZE}, {_SQLITE_SHARED_FIRST})\n"
             "    print('free')\n"
             "except OSError:\n"
             "    print('held')")

    def shared_range() -> str:        # what another process finds: can it write-lock SQLite's shared bytes?
        return subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True).stdout.strip()

    writer = Store.open(f"sqlite:///{path}")
    try:
        writer.add_runs([config("two-moons", "fl")])       # WAL; the pooled connection stays open with its lock
        assert (tmp_path / "flctl.db-wal").exists() and shared_range() == "held"
        for _ in range(2):
            reader = Store.open(f"sqlite:///{path}", readonly=True)
            assert len(reader.list_runs()) == 1
            reader.close()
        assert shared_range() == "held"
    finally:
        writer.close()
    assert shared_range() == "free"


def test_open_existing_makes_no_database_and_is_the_one_check_of_a_file_not_there(tmp_path: Path) -> None:
    """Store.open_existing: None where the database is a file not made yet (a listing, a report, a dry run before
    the first run), with nothing written; the database where it is. No command checks a sqlite:/// URL's file
    itself (the dialect says where a database's file is)."""
    import re

    url = f"sqlite:///{tmp_path / 'sub' / 'flctl.db'}"
    assert Store.open_existing(url) is None
    assert Store.open_existing(url + "?timeout=5") is None                 # a query does not hide the file
    assert not (tmp_path / "sub").exists()
    Store.open(f"sqlite:///{tmp_path / 'flctl.db'}").close()
    store = Store.open_existing(f"sqlite:///{tmp_path / 'flctl.db'}")
    assert store is not None and store.readonly and store.list_runs() == []
    store.close()
    checks = [f"{p.relative_to(ROOT)}" for p in sorted((ROOT / "flctl").rglob("*.py"))
              if re.search(r"""startswith\(["']sqlite:///""", p.read_text())]
    assert checks == []


@pytest.mark.parametrize("damage", ["{broken", "[1, 2]"], ids=["not-json", "a-list"])
def test_a_damaged_row_is_named_and_left_out_of_listings(tmp_path: Path, damage: str, capfd) -> None:
    """One run's metrics column made invalid (text that is not JSON, JSON of another shape): the checked read of
    rows leaves that run out of list_runs and runs_of with one warning naming it and the column, the other runs are
    read; get_run of it (by id or prefix) is DamagedRow naming the same, exit code 1."""
    import sqlite3

    from flctl.db.reads import runs_of
    from flctl.errors import DamagedRow

    store = Store.open(f"sqlite:///{tmp_path / 'flctl.db'}")
    first, second = config("two-moons", "erm", seed=1), config("two-moons", "erm", seed=2)
    store.add_runs([first, second])
    store.close()
    with sqlite3.connect(tmp_path / "flctl.db") as db:
        db.execute("UPDATE runs SET metrics = ? WHERE id = ?", (damage, first.run_id))
    store = Store.open(f"sqlite:///{tmp_path / 'flctl.db'}", readonly=True)
    capfd.readouterr()
    assert [r.id for r in store.list_runs()] == [second.run_id]
    warned = capfd.readouterr().err.strip().splitlines()
    assert len(warned) == 1 and warned[0].startswith(f"flctl: warning: run {first.run_id}'s metrics column is "
                                                     "damaged"), warned
    assert "restore that row from a backup" in warned[0]
    assert runs_of(store, second.run_id)[0][0].id == second.run_id
    for ref in (first.run_id, first.run_id[:6]):
        with pytest.raises(DamagedRow, match=f"run {first.run_id}'s metrics column is damaged") as caught:
            store.get_run(ref)
        assert caught.value.exit_code == 1 and caught.value.column == "metrics"
