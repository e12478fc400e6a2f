"""A sweep's ledger counted by the database (flctl.db.counts) is the ledger the cells read one by one would give:
every state, stale cells of either kind (an old heartbeat; a dead process of this host with a fresh one), failures
counted by error, on SQLite and on PostgreSQL; and what a terminal shows of a long list says how much more there is."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import update

from flctl.db import Store
from flctl.db.counts import run_states, running, stale_ids
from flctl.db.schema import Run, now
from flctl.status import DIVERGED_ERROR, LEDGER_COLUMNS, Status, count_errors, ledger
from tests.helpers import config, in_process
from tests.test_concurrency import pg_database

pytestmark = pytest.mark.notorch

TRACE = "Traceback (most recent call last):\n  File \"/tmp/x{n}/a.py\", line {n}, in f\n    g()\nValueError: bad step {n}\n"


def row_by_row(store: Store, sweep_id: str) -> dict:
    """The ledger as flctl counted it before the database did: every cell read (Store.sweep_runs, its staleness
    judged row by row by flctl.db.liveness._is_stale) and counted in Python."""
    per_method: dict[str, Counter] = {}
    bad: dict[str, list[tuple[str, str]]] = {}
    for r in store.sweep_runs(sweep_id):
        state = "stale" if r["stale"] else r["status"]
        per_method.setdefault(r["method"], Counter())[state] += 1
        if state in (Status.FAILED, Status.DIVERGED):
            bad.setdefault(r["method"], []).append(
                (r["id"], DIVERGED_ERROR if state == Status.DIVERGED else r["error"] or ""))
    total = sum((c for c in per_method.values()), Counter())
    return {"sweep": sweep_id,
            "methods": {m: {k: c.get(k, 0) for k in LEDGER_COLUMNS} for m, c in per_method.items()},
            "total": {k: total.get(k, 0) for k in LEDGER_COLUMNS}, "cells": sum(total.values()),
            "errors": count_errors(pair for pairs in bad.values() for pair in pairs),
            "method_errors": {m: count_errors(pairs) for m, pairs in bad.items()}}


def dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout)


def set_cells(store: Store, values: dict[str, dict]) -> None:
    with store.session() as s:
        for run_id, v in values.items():
            s.execute(update(Run).where(Run.id == run_id).values(**v))


def every_state(store: Store) -> tuple[list[str], dict[str, str]]:
    """A sweep "all" of 60 cells of three methods in every state, and a sweep "other" whose cells must not count:
    its ids, and what each cell of "all" was made (its kind)."""
    configs = [config("two-moons", m, seed=s) for s in range(20) for m in ("fl", "erm", "rfl")]
    store.create_sweep("all", "all", "two-moons", {}, configs)
    store.create_sweep("other", "other", "two-moons", {}, [config("two-moons", "fl", seed=99)])
    ids = sorted(c.run_id for c in configs)
    dead, old, fresh = dead_pid(), now() - timedelta(hours=1), now()
    here, me = socket.gethostname(), os.getpid()
    kinds = ["queued", "interrupted", "completed", "failed-trace", "failed-trace", "failed-none", "failed-lost",
             "diverged", "running-live", "running-old", "running-dead-here", "running-dead-elsewhere",
             "running-no-beat", "failed-empty", "completed"]
    made, values = {}, {}
    for i, run_id in enumerate(ids):
        kind = made[run_id] = kinds[i % len(kinds)]
        status = kind.split("-")[0]
        v: dict = {"status": status, "attempts": 1 + i % 3}
        if kind == "failed-trace":
            v["error"] = TRACE.format(n=i)          # one error, its numbers and folders set aside
        elif kind == "failed-lost":
            v["error"] = "worker lost (heartbeat stale); gave up after 3 attempts"
        elif kind == "failed-empty":
            v["error"] = ""
        elif kind == "diverged":
            v["error"] = f"diverged at epoch {i}"
        if status == "running":
            v.update(host=here, pid=me, heartbeat_at=fresh)
            v.update({"running-old": {"heartbeat_at": old}, "running-dead-here": {"pid": dead},
                      "running-dead-elsewhere": {"host": "another-node", "pid": dead},
                      "running-no-beat": {"heartbeat_at": None}}.get(kind, {}))
        values[run_id] = v
    set_cells(store, values)
    return ids, made


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'flctl.db'}" if request.param == "sqlite" else pg_database()
    opened = Store.open(url)
    yield opened
    opened.close()


def test_the_ledger_counted_in_sql_is_the_ledger_counted_row_by_row(store: Store) -> None:
    ids, made = every_state(store)
    data = ledger(store, "all")
    assert json.dumps(data) == json.dumps(row_by_row(store, "all"))      # the same, in the same order (--json)
    assert data["cells"] == 60 and set(data["methods"]) == {"fl", "erm", "rfl"}
    kinds = Counter(made.values())
    stale = kinds["running-old"] + kinds["running-dead-here"] + kinds["running-no-beat"]
    assert data["total"]["stale"] == stale and data["total"][Status.RUNNING] == kinds["running-live"] + \
        kinds["running-dead-elsewhere"]          # another host's pid is not this host's to judge
    assert data["total"][Status.FAILED] == sum(n for k, n in kinds.items() if k.startswith("failed"))
    trace = next(e for e in data["errors"] if e["message"].startswith("ValueError"))
    assert trace["count"] == kinds["failed-trace"] and trace["message"] == f"ValueError: bad step {ids.index(trace['run'])}"
    assert {e["message"] for e in data["errors"]} >= {DIVERGED_ERROR, "(no error recorded)"}
    # the few rows a wait, a cancel and a launch read: running cells, stale ones, the states of given ids
    assert stale_ids(store, "all") == sorted(i for i, k in made.items() if k in (
        "running-old", "running-dead-here", "running-no-beat"))
    assert [i for i, _, _ in running(store, "all")] == sorted(i for i, k in made.items() if k.startswith("running"))
    assert run_states(store, [ids[0], "0" * 16]) == {ids[0]: (made[ids[0]].split("-")[0], 1)}


def test_a_sweep_without_cells_and_a_stale_bound_without_end(store: Store) -> None:
    store.create_sweep("empty", None, "two-moons", {}, [])
    assert ledger(store, "empty") == row_by_row(store, "empty") and ledger(store, "empty")["cells"] == 0
    _, made = every_state(store)
    forever = store.sweep_counts("all", stale_after=float("inf")).states
    # no heartbeat is too old: a cell without one, and one whose process here has exited, are stale all the same
    assert sum(states.get("stale", 0) for states in forever.values()) == sum(
        k in ("running-no-beat", "running-dead-here") for k in made.values())


def test_a_long_list_on_a_terminal_says_how_much_more_there_is(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture) -> None:
    """`flctl sweeps` shows the newest SWEEPS_SHOWN sweeps and the count of the others; after a wait, the
    ERRORS_SHOWN most frequent kinds of error, and how many kinds and cells are left out (--json has them all)."""
    from flctl.cli.ledger import ERRORS_SHOWN, SWEEPS_SHOWN, error_summary

    store = Store.open(f"sqlite:///{tmp_path / 'flctl.db'}")
    for k in range(SWEEPS_SHOWN + 3):
        store.create_sweep(f"{k:012x}", f"s{k}", "two-moons", {}, [])
    store.close()
    res = in_process("sweeps", "--db", f"sqlite:///{tmp_path / 'flctl.db'}")
    assert res.returncode == 0, res.stderr
    assert "and 3 more sweep(s), older: `flctl sweeps --json` lists them all" in res.stdout
    listed = in_process("sweeps", "--db", f"sqlite:///{tmp_path / 'flctl.db'}", "--json")
    assert listed.stdout.count('"submissions"') == SWEEPS_SHOWN + 3

    errors = [{"message": f"E{k}", "count": 2, "run": f"{k:016x}"} for k in range(ERRORS_SHOWN + 4)]
    data = {"sweep": "s", "cells": 99, "total": {Status.FAILED: 2 * len(errors), Status.DIVERGED: 0},
            "errors": errors}
    import typer

    with pytest.raises(typer.Exit):
        error_summary(data)
    said = capsys.readouterr().out
    assert said.count(" × E") == ERRORS_SHOWN
    assert "and 4 more kind(s) of error in 8 cell(s): `flctl status s --json` lists them all" in said
