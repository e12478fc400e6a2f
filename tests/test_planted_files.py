"""Files under results/ that are not flctl's (a Parquet file of another schema among the records, a garbage
extras.npz) are one line naming the file, exit 2, and the report writes nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from flctl.cli import app


def one_run(results: Path) -> str:
    res = CliRunner().invoke(app, ["run", "two-moons", "-m", "fl", "--epochs", "2", "--eval-every", "1"])
    assert res.exit_code == 0, res.output
    (folder,) = (results / "records").iterdir()
    return folder.name.split("=", 1)[1]


def assert_one_line_naming(res, path: Path, results: Path) -> None:
    assert res.exit_code == 2, res.output
    assert str(path) in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not (results / "reports").exists()


def test_a_planted_parquet_of_another_schema_is_named(results: Path) -> None:
    run_id = one_run(results)
    planted = results / "records" / f"run_id={run_id}" / "epoch=3.parquet"
    pq.write_table(pa.table({"loss": pa.array(["a", "b"]), "epoch": pa.array([1.5, 2.5])}), planted)
    for args in (["report", "--plot", "cdf"], ["report", "--samples", "violators"], ["report", "--plot", "dynamics"]):
        assert_one_line_naming(CliRunner().invoke(app, args), planted, results)
    planted.write_bytes(b"not parquet at all")
    assert_one_line_naming(CliRunner().invoke(app, ["report", "--plot", "cdf"]), planted, results)


def test_a_garbage_extras_file_is_named(results: Path) -> None:
    run_id = one_run(results)
    extras = results / "runs" / run_id / "extras.npz"
    assert extras.exists()
    extras.write_bytes(b"PK\x03\x04 truncated")
    assert_one_line_naming(CliRunner().invoke(app, ["report", "--plot", "multipliers"]), extras, results)
    np.save(extras.with_suffix(".npy"), np.array([object()], dtype=object), allow_pickle=True)
    extras.with_suffix(".npy").rename(extras)          # a pickled object array: never loaded
    assert_one_line_naming(CliRunner().invoke(app, ["report", "--plot", "multipliers"]), extras, results)


@pytest.mark.parametrize("damage,command,needle", [
    ("ALTER TABLE runs DROP COLUMN duration_s", ["runs"], "no such column: runs.duration_s"),
    ("UPDATE runs SET config = '{not json'", ["runs"], "a row holds invalid JSON"),
    ("UPDATE runs SET metrics = '[1,'", ["show", "RUN"], "a row holds invalid JSON"),
    ("DROP TABLE sweep_cells", ["sweeps"], "no such table"),
    ("UPDATE runs SET config = '[1, 2]'", ["report", "--table", "runs"], "config is list JSON, not an object"),
    ("UPDATE runs SET metrics = '\"x\"'", ["show", "RUN"], "metrics is str JSON, not an object"),
])
def test_a_damaged_database_is_one_line_and_left_as_it_is(results: Path, damage: str, command: list[str],
                                                          needle: str) -> None:
    import gc
    import sqlite3

    run_id = one_run(results)
    gc.collect()      # the in-process run's connections close now, not during the command under test
    db = results / "flctl.db"
    with sqlite3.connect(db) as con:
        con.execute(damage)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    before = db.read_bytes()
    res = CliRunner().invoke(app, [run_id if a == "RUN" else a for a in command])
    _told(res, run_id, damage, needle)
    assert db.read_bytes() == before


def _told(res, run_id: str, damage: str, needle: str) -> None:
    """A damaged table is the database's one line, exit 2; a damaged row is named (flctl.db.checked): left out of a
    listing with one warning (exit 0), or one line for the run asked for (exit 1)."""
    if not damage.startswith("UPDATE runs SET "):
        assert res.exit_code == 2, res.output
        assert "the database is damaged" in res.stderr and needle in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1
        return
    column = damage.split()[3]
    # a listing goes on without it (0; a report left with no run says so, 2), the run asked for is one line (1)
    assert res.exit_code in (0, 1, 2), res.output
    assert f"run {run_id}'s {column} column is damaged" in res.stderr, res.stderr
    assert "Traceback" not in res.output


@pytest.mark.parametrize("damage,command,needle", [
    ("ALTER TABLE runs DROP COLUMN duration_s", ["runs"], "column runs.duration_s does not exist"),
    ("DROP TABLE sweep_cells", ["sweeps"], 'relation "sweep_cells" does not exist'),
    ("UPDATE runs SET config = '[1, 2]'", ["runs"], "config is list JSON, not an object"),
    ("UPDATE runs SET trained_with = '3'", ["show", "RUN"], "trained_with is int JSON, not an object"),
])
def test_a_damaged_postgresql_database_is_one_line_and_left_as_it_is(results: Path, damage: str,
                                                                     command: list[str], needle: str) -> None:
    import sqlalchemy as sa

    from flctl.db import normalize_url
    from tests.test_concurrency import pg_database

    url = pg_database()
    res = CliRunner().invoke(app, ["run", "two-moons", "-m", "fl", "--epochs", "2", "--db", url])
    assert res.exit_code == 0, res.output
    engine = sa.create_engine(normalize_url(url))
    with engine.begin() as conn:
        run_id = conn.exec_driver_sql("SELECT id FROM runs").scalar_one()
        conn.exec_driver_sql(damage)

    def dump() -> list:
        with engine.connect() as conn:
            return [conn.exec_driver_sql(f"SELECT * FROM {t} ORDER BY 1").all() for t in ("runs", "artifacts")]

    before = dump()
    res = CliRunner().invoke(app, [*(run_id if a == "RUN" else a for a in command), "--db", url])
    _told(res, run_id, damage, needle)
    assert len(res.stderr.strip().splitlines()) == 1
    assert dump() == before
    engine.dispose()
