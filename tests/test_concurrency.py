"""Many processes writing the run database at once: SQLite (WAL, busy timeout, retries) and PostgreSQL.

16 worker processes race to claim the same 64 queued runs, heartbeat them and finish them, and each bumps a
shared counter 20 times. Every run must be claimed exactly once and no increment may be lost.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from flctl.store import Store
from tests.helpers import config

WORKERS, RUNS, BUMPS = 16, 64, 20

WORKER = r"""
import json, sys
from flctl.store import Store
url, ids = sys.argv[1], json.loads(sys.argv[2])
store = Store.open(url)
claimed = []
for i, run_id in enumerate(ids):
    if store.claim_run(run_id, stale_after=3600):
        claimed.append(run_id)
        store.heartbeat(run_id, 1)
        store.finish_run(run_id, status="completed", epochs_done=1, metrics={"x": 1.0}, diverged_at=None,
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

    from flctl.store import normalize_url

    name = f"flctl_test_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(normalize_url(base), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    admin.dispose()
    return base.rsplit("/", 1)[0] + "/" + name


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_concurrent_writers_lose_no_update(tmp_path: Path, backend: str) -> None:
    url = f"sqlite:///{tmp_path / 'flctl.db'}" if backend == "sqlite" else pg_database()
    store = Store.open(url)
    configs = [config("two-moons", "fl", seed=s) for s in range(RUNS)]
    store.add_runs(configs)
    store.create_sweep("shared", "shared", "two-moons", {}, configs)
    ids = [c.run_id for c in configs]

    procs = [subprocess.Popen([sys.executable, "-c", WORKER, url, json.dumps(ids[k:] + ids[:k])],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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
