"""A PostgreSQL server that stops under `flctl sweep --wait`: one line and exit 1 within a bounded time (it was 167
lines of SQLAlchemy traceback), nothing recorded is lost, and once the server is back the same command completes
every cell. The server is this test's own (started and stopped by .ci/postgres.sh on a port of its own), never the
suite's shared one."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from flctl.db import Store
from tests import warm
from tests.helpers import bound, wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PORT = 55400 + os.getpid() % 90      # apart from CI's server (55432) and from another xdist worker's


@pytest.fixture
def own_server():
    if not glob.glob("/usr/lib/postgresql/*/bin/initdb") or os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("CI must be able to start a PostgreSQL server (.ci/postgres.sh)")
        pytest.skip("no PostgreSQL server to start here (Debian's postgresql, as root)")
    # not under tmp_path: the server runs as the postgres user, who cannot enter pytest's private folders
    folder = Path(tempfile.mkdtemp(prefix="flctl-test-pg-"))

    def start() -> None:
        subprocess.run(["bash", str(ROOT / ".ci/postgres.sh"), str(folder)], check=True, capture_output=True,
                       env={**os.environ, "FLCTL_PG_PORT": str(PORT)})

    def stop() -> None:
        subprocess.run(["bash", str(ROOT / ".ci/postgres.sh"), "stop", str(folder)], check=True, capture_output=True)

    start()
    yield f"postgresql://postgres@127.0.0.1:{PORT}/flctl", start, stop
    stop()
    shutil.rmtree(folder, ignore_errors=True)


def test_a_database_server_that_stops_under_a_wait_is_one_line_and_nothing_is_lost(own_server, tmp_path: Path):
    url, start, stop = own_server
    results = tmp_path / "results"
    command = [sys.executable, "-m", "flctl", "sweep", "two-moons", "-m", "erm,fl", "--epochs", "3000",
               "--executor", "debug", "--wait", "--db", url, "--results-dir", str(results)]
    # a heartbeat every half second: the epochs done reach the database with it (every 30 s by default), and the
    # two cells end in about 15 s; the test waited on the moment between their end and the command's (a CI run
    # missed it and timed out)
    env = {**os.environ, "FLCTL_HEARTBEAT": "0.5"}
    sweep = warm.Popen(command, stdout=warm.PIPE, stderr=warm.PIPE, text=True, env=env)

    def checkpointed() -> bool:
        store = Store.open(url, readonly=True)
        try:
            return any((r.epochs_done or 0) > 0 or r.status == "completed" for r in store.list_runs())
        finally:
            store.close()

    wait_until(lambda: sweep.poll() is None and (results / "runs").is_dir() and checkpointed(),
               "a cell under way", timeout=bound(240), interval=0.5)   # the launch makes the study first
    stop()
    stopped = time.monotonic()
    out, err = sweep.communicate(timeout=120)
    lines = err.strip().splitlines()
    assert sweep.returncode == 1, (out, err)
    assert time.monotonic() - stopped < bound(60), "the wait noticed the server gone late"
    assert len(lines) == 1 and lines[0].startswith("error: the run database failed under this command"), err
    assert "Traceback" not in err and "run the command again" in lines[0], err

    start()                                # the server back: the same command completes every cell
    again = warm.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0, again.stderr
    store = Store.open(url, readonly=True)
    try:
        assert sorted(r.status for r in store.list_runs()) == ["completed", "completed"]
    finally:
        store.close()
