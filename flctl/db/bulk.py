"""Rows written in bulk, inside the caller's transaction: a sweep's new runs and its cells, as plain dicts in chunks,
through Core ``insert()`` (an executemany) or, on PostgreSQL, a COPY. ORM objects cost several times as much a row,
and a sweep of 100,000 cells is recorded in one go."""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Sequence
from typing import Any, cast

from sqlalchemy import JSON, Table, insert, select, text
from sqlalchemy.orm import Session

from flctl.db.counts import chunks
from flctl.db.schema import Run, Sweep, SweepCell, now
from flctl.status import Status

# The tables themselves (Core: no ORM bookkeeping a row), typed as Table for insert().
RUNS, CELLS = cast(Table, Run.__table__), cast(Table, SweepCell.__table__)
# Rows per executemany: the dicts of one chunk are made just before it is sent, not all 100,000 at once.
ROWS = 5000
# SQLite's page cache while it writes a sweep's runs (_room), in KB.
CACHE_KB = 65536
# New rows past which PostgreSQL's statistics are brought up to date at once (see fresh_statistics).
ANALYZE_AFTER = 1000
# The key of the PostgreSQL advisory lock the writers of new runs hold (one_writer), as flctl.db.postgres keys its own.
NEW_RUNS_LOCK = zlib.crc32(b"flctl:new-runs")


def one_writer(s: Session) -> None:
    """Hold, until the transaction ``s`` ends, PostgreSQL's lock on writing new runs: the writers of runs (a launch's
    plan, `flctl run`) read which exist and then write the others (a COPY, which has no ON CONFLICT), and under READ
    COMMITTED two launches of one grid both found them missing and the second died in runs_pkey's UniqueViolation.
    Held, the second reads after the first commits and finds its rows. SQLite's writer holds the whole database
    already (BEGIN IMMEDIATE)."""
    if s.get_bind().dialect.name == "postgresql":
        s.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": NEW_RUNS_LOCK})


def fresh_statistics(s: Session, table: str, added: int) -> None:
    """Bring PostgreSQL's planner statistics of ``table`` up to date after ``added`` new rows. Until autovacuum's next
    pass (a minute or more) the planner believes the table as it was: at 100,000 new queued cells it expected a few
    hundred and sorted them for every claim (160 ms a claim) instead of reading the claim's index in order (8 ms).
    ANALYZE samples the table (about 0.1 s at 100,000 rows) and sees this transaction's own rows."""
    if added >= ANALYZE_AFTER and s.get_bind().dialect.name == "postgresql":
        s.execute(text(f"ANALYZE {table}"))


def _in_id_order(s: Session, run_ids: list[str]) -> list[str]:
    """A sweep's new cells in run id order on SQLite: the indexes of sweep_cells then grow at their end, not at random
    places. Not its runs: rows of one moment are listed in the order they were written (list_runs: the plan's order).
    As they come on PostgreSQL: a table in id order leads its planner (ANALYZE's correlation) to read a claim's cells
    by primary key instead of ix_runs_claim."""
    return sorted(run_ids) if s.get_bind().dialect.name == "sqlite" else run_ids


def _write(s: Session, table: Table, rows: list[dict[str, Any]]) -> None:
    """``rows`` (dicts of the same keys) into ``table``: Core insert()'s executemany; on PostgreSQL a COPY, as psycopg
    sends an executemany as one INSERT a row, which its server parses one by one (100,000 runs: ~10 s -> ~4 s)."""
    if not rows:
        return
    if s.get_bind().dialect.name != "postgresql":
        s.execute(insert(table), rows)
        return
    names = list(rows[0])
    kinds = {c.name: c.type for c in table.columns}
    texts = {n for n in names if isinstance(kinds[n], JSON)}       # as SQLAlchemy's JSON type writes it (json.dumps)
    driver = s.connection().connection.driver_connection           # psycopg's, in this session's transaction
    assert driver is not None
    with driver.cursor() as cursor, cursor.copy(f"COPY {table.name} ({', '.join(names)}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row([json.dumps(row[n]) if n in texts else row[n] for n in names])


def _room(s: Session, rows: int) -> None:
    """Before SQLite takes many rows in one transaction: a page cache of CACHE_KB for this connection. Runs come in
    the plan's order (their ids at random), and each index of runs takes them at random places: with SQLite's
    default 2 MB the transaction's dirty pages spill into the WAL and are written again and again (100,000 runs:
    3.4 s -> 2.1 s). The cache is the connection's memory while it lives, not the database's."""
    if rows >= ROWS and s.get_bind().dialect.name == "sqlite":
        s.execute(text(f"PRAGMA cache_size = -{CACHE_KB}"))


def existing_runs(s: Session, run_ids: Sequence[str]) -> set[str]:
    """Those of ``run_ids`` that are in the database."""
    have: set[str] = set()
    for chunk in chunks(run_ids):
        have.update(s.scalars(select(Run.id).where(Run.id.in_(chunk))).all())
    return have


def insert_runs(s: Session, configs: Iterable[Any]) -> list[str]:
    """Insert the configs (RunConfig objects, one per run id) not yet in the database as queued runs; their ids."""
    configs = list(configs)
    one_writer(s)
    have = existing_runs(s, [c.run_id for c in configs])
    new = [c for c in configs if c.run_id not in have]
    _room(s, len(new))
    stamp = now()
    for chunk in chunks(new, ROWS):
        _write(s, RUNS, [
            {"id": c.run_id, "config_hash": c.config_hash, "task": c.task, "method": c.method, "seed": c.seed,
             "config": c.to_dict(), "status": Status.QUEUED.value, "together": c.together_id, "created_at": stamp,
             "attempts": 0, "epochs_done": 0} for c in chunk])
    fresh_statistics(s, "runs", len(new))
    return [c.run_id for c in new]


def insert_cells(s: Session, sweep_id: str, run_ids: Sequence[str]) -> None:
    """Make ``run_ids`` cells of the sweep (its row written already), those that are not yet."""
    have = set(s.scalars(select(SweepCell.run_id).where(SweepCell.sweep_id == sweep_id)).all())
    new = _in_id_order(s, [run_id for run_id in run_ids if run_id not in have])
    for chunk in chunks(new, ROWS):
        _write(s, CELLS, [{"sweep_id": sweep_id, "run_id": run_id} for run_id in chunk])
    fresh_statistics(s, "sweep_cells", len(new))


def record_sweep(s: Session, sweep: Sweep, configs: Sequence[Any]) -> list[str]:
    """``sweep`` (a new row: written unless its id is there), its new runs (insert_runs: their ids returned) and its
    cells (insert_cells), in the transaction ``s``."""
    added = insert_runs(s, configs)
    if s.get(Sweep, sweep.id) is None:
        sweep.created_at, sweep.submissions = now(), 0
        s.add(sweep)
        s.flush()                       # before its cells, which refer to it
    insert_cells(s, sweep.id, [c.run_id for c in configs])
    return added
