"""flctl behind PgBouncer in transaction pooling, as clusters put it in front of a shared PostgreSQL: each transaction
of a client may run on another server connection, so nothing a command relies on may live in a connection's session
(a prepared statement, a startup parameter). Many writers through it: tests/test_concurrency.py's BACKENDS."""

from __future__ import annotations

import json
import threading
import time

import pytest
import sqlalchemy as sa

from flctl.db import RunQueue, Store, normalize_url
from flctl.db.postgres import POOL_SIZE
from flctl.db.schema import Run
from tests.helpers import bound, config, in_process
from tests.test_concurrency import bouncer_database, pg_database

pytestmark = pytest.mark.notorch


def test_a_read_only_command_works_through_pgbouncer_and_writes_nothing() -> None:
    url = bouncer_database()
    store = Store.open(url)
    store.create_sweep("s1", "grid", "two-moons", {}, [config("two-moons", "erm", seed=s) for s in range(3)])
    store.close()

    res = in_process("status", "grid", "--json", "--db", url)
    assert res.returncode == 0, res.stderr
    assert "3" in json.dumps(json.loads(res.stdout))
    reader = Store.open(url, readonly=True)
    for _ in range(8):            # past psycopg's threshold (5 runs) for preparing a statement on the server
        assert len(reader.list_runs()) == 3
    with pytest.raises(sa.exc.InternalError, match="read-only transaction"), reader.session() as s:
        s.execute(sa.update(Run).values(error="written"))
    assert all(r.error is None for r in reader.list_runs())
    reader.close()


def server_connections(url: str) -> int:
    """How many connections the server has open to ``url``'s database, besides the one that asks."""
    engine = sa.create_engine(normalize_url(url))
    with engine.connect() as conn:
        found = conn.execute(sa.text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                     "AND pid <> pg_backend_pid()")).scalar_one()
    engine.dispose()
    return int(found)


def test_a_worker_reuses_one_connection_and_its_heartbeat_one_more() -> None:
    url = pg_database()
    launcher = Store.open(url)        # makes the schema (a session under the schema lock: two connections)
    launcher.create_sweep("s1", "grid", "two-moons", {}, [config("two-moons", "erm", seed=s) for s in range(12)])
    launcher.close()
    store = Store.open(url)           # a worker's
    queue = RunQueue(store)
    for claim in (queue.claim_next("s1", max_attempts=3)[0] for _ in range(6)):     # one thread: one connection
        assert queue.heartbeat(claim.cfg.run_id, claim.token, 1)
        queue.finish_run(claim.cfg.run_id, claim.token, status="completed", epochs_done=1, metrics={},
                         diverged_at=None, lambda_capped=0, artifacts={}, duration_s=0.0)
    assert server_connections(url) == 1

    # A heartbeat thread beating while the main thread holds the database-wide lock and opens sessions under it
    # (a worker's Optuna sync as it exits): the pool lends both without a wait, and keeps POOL_SIZE afterwards.
    claim = queue.claim_next("s1", max_attempts=3)[0]
    stop, beats = threading.Event(), []
    beater = threading.Thread(target=lambda: [beats.append(queue.heartbeat(claim.cfg.run_id, claim.token))
                                              for _ in iter(lambda: stop.wait(0.01), True)])
    started = time.monotonic()
    beater.start()
    for _ in range(20):
        with store.exclusive("flctl-test"):
            assert store.get_sweep("s1") is not None and len(store.sweep_runs("s1")) == 12
    stop.set()
    beater.join()
    assert time.monotonic() - started < bound(10) and beats and all(beats)
    assert server_connections(url) <= POOL_SIZE
    store.close()
