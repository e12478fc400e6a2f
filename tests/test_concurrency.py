"""Many processes writing the run database at once: SQLite (WAL, busy timeout, retries), PostgreSQL, and PostgreSQL
through PgBouncer in transaction pooling (each transaction of a client on any of the server's connections).

16 worker processes race to claim the same 64 queued runs, heartbeat them and finish them, and each bumps a
shared counter 20 times. Every run must be claimed exactly once and no increment may be lost. The processes are
forked warm (tests/warm.py): separate processes with their own connections, without 16 interpreters' imports.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path

import pytest

from flctl.db import RunQueue, Store, existing_storage
from tests import warm
from tests.helpers import config

# Slow (pyproject.toml's markers; `pytest -m "not slow"` is the fast loop): many processes writing one database at
# once (and again on PostgreSQL in CI): 12 s of the suite's 904 s of test time (2 cores, xdist -n 2).
pytestmark = pytest.mark.slow

WORKERS, RUNS, BUMPS = 16, 64, 20

WORKER = r"""
import json, sys
from flctl.db import RunQueue, Store
url, ids = sys.argv[1], json.loads(sys.argv[2])
store = Store.open(url)
claimed = []
for i, run_id in enumerate(ids):
    token = RunQueue(store).claim_run(run_id, stale_after=3600)
    if token:
        claimed.append(run_id)
        assert RunQueue(store).heartbeat(run_id, token, 1)
        RunQueue(store).finish_run(run_id, token, status="completed", epochs_done=1, metrics={"x": 1.0}, diverged_at=None,
                         lambda_capped=0, artifacts={"records": "r"}, duration_s=0.0)
    if i % 3 == 0 and i < 60:  # 20 increments, interleaved with the claims
        store.count_submission("shared")
print(json.dumps(claimed))
"""


def pg_database() -> str:
    """A fresh database on the test PostgreSQL server (FLCTL_TEST_PG); skipped without one, except in CI."""
    base = os.environ.get("FLCTL_TEST_PG")
    if not base:
        if os.environ.get("CI"):
            pytest.fail("CI must provide a PostgreSQL server (FLCTL_TEST_PG, see .ci/postgres.sh)")
        pytest.skip("no PostgreSQL server: run .ci/postgres.sh and export FLCTL_TEST_PG")
    import sqlalchemy as sa

    from flctl.db import normalize_url

    name = f"flctl_test_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(normalize_url(base), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    admin.dispose()
    return base.rsplit("/", 1)[0] + "/" + name


def bouncer_database() -> str:
    """A fresh database on the test PostgreSQL server reached through PgBouncer in transaction pooling
    (FLCTL_TEST_PGBOUNCER, .ci/pgbouncer.sh: it routes every database name to the server); skipped without one,
    except in CI."""
    bouncer = os.environ.get("FLCTL_TEST_PGBOUNCER")
    if not bouncer:
        if os.environ.get("CI"):
            pytest.fail("CI must provide a PgBouncer (FLCTL_TEST_PGBOUNCER, see .ci/pgbouncer.sh)")
        pytest.skip("no PgBouncer: run .ci/pgbouncer.sh and export FLCTL_TEST_PGBOUNCER")
    return bouncer.rsplit("/", 1)[0] + "/" + pg_database().rsplit("/", 1)[1]


def database_url(backend: str, tmp_path: Path) -> str:
    """A fresh run database of ``backend``: "sqlite" (a file under ``tmp_path``), "postgresql" (the test server) or
    "pgbouncer" (the test server through PgBouncer in transaction pooling, as clusters run it)."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'flctl.db'}"
    return pg_database() if backend == "postgresql" else bouncer_database()


# Each database engine a test of many writers runs on.
BACKENDS = ["sqlite", "postgresql", "pgbouncer"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_concurrent_writers_lose_no_update(tmp_path: Path, backend: str) -> None:
    url = database_url(backend, tmp_path)
    store = Store.open(url)
    configs = [config("two-moons", "fl", seed=s) for s in range(RUNS)]
    store.add_runs(configs)
    store.create_sweep("shared", "shared", "two-moons", {}, configs)
    ids = [c.run_id for c in configs]

    procs = [warm.Popen([sys.executable, "-c", WORKER, url, json.dumps(ids[k:] + ids[:k])],
                        stdout=warm.PIPE, stderr=warm.PIPE)
             for k in range(0, WORKERS * 4, 4)]
    claimed: list[str] = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        claimed += json.loads(out)

    assert sorted(claimed) == sorted(ids)                       # each run claimed by exactly one worker
    runs = store.list_runs()
    assert len(runs) == RUNS and all(r.status == "completed" and r.attempts == 1 for r in runs)
    assert all(r.artifacts == {"records": "r"} for r in runs)
    assert store.get_sweep("shared")["submissions"] == WORKERS * BUMPS   # no lost increment


SYNC = r"""
import sys, time
from flctl.db import Store
from flctl.study import sync_sweep
url, sweep_id, start_at = sys.argv[1], sys.argv[2], float(sys.argv[3])
store = Store.open(url)
while time.time() < start_at:      # every process is connected and past its imports: they sync at once
    time.sleep(0.001)
print(sync_sweep(store, url, sweep_id))
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_concurrent_first_syncs_give_one_trial_per_cell(tmp_path: Path, backend: str) -> None:
    # Three processes sync one sweep's finished cells into its (not yet existing) Optuna study at the same moment,
    # on a database without Optuna's tables: the schema is created once, and each cell becomes exactly one trial.
    import time

    import optuna

    url = database_url(backend, tmp_path)
    store = Store.open(url)
    configs = [config("two-moons", "fl", seed=s, lr=lr) for s in range(3) for lr in (1e-3, 1e-2)]
    store.create_sweep("grid", "grid", "two-moons", {}, configs)
    for i, cfg in enumerate(configs):
        token = RunQueue(store).claim_run(cfg.run_id)
        assert token
        RunQueue(store).finish_run(cfg.run_id, token, status="completed", epochs_done=1, metrics={"train.avg_loss": float(i)},
                         diverged_at=None, lambda_capped=0, artifacts={}, duration_s=1.0)
    start_at = time.time() + 3                  # warm processes (tests/warm.py) are past their imports in ~1 s
    procs = [warm.Popen([sys.executable, "-c", SYNC, url, "grid", str(start_at)], stdout=warm.PIPE, stderr=warm.PIPE)
             for _ in range(3)]
    added = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        added.append(int(out.strip().splitlines()[-1]))
    assert sorted(added) == [0, 0, len(configs)]               # one process added them all, the others none
    study = optuna.load_study(study_name="flctl-grid", storage=existing_storage(url))
    assert sorted(t.user_attrs["run_id"] for t in study.get_trials()) == sorted(c.run_id for c in configs)
    store.close()


OPEN = r"""
import sys, time
from flctl.db import Store
url, start_at = sys.argv[1], float(sys.argv[2])
while time.time() < start_at:
    time.sleep(0.001)
Store.open(url).close()
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_concurrent_first_opens_create_the_schema_once(tmp_path: Path, backend: str) -> None:
    import time

    url = database_url(backend, tmp_path)
    start_at = time.time() + 3
    procs = [warm.Popen([sys.executable, "-c", OPEN, url, str(start_at)], stdout=warm.PIPE, stderr=warm.PIPE)
             for _ in range(4)]
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
    store = Store.open(url, readonly=True)
    assert store.list_runs() == []
    store.close()
