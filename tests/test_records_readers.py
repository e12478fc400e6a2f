"""The records folder is a dataset the common readers open as it is, and they agree with flctl's own reader."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from flctl import records
from flctl.cli import app
from flctl.layout import records_of
from flctl.records import writes


def test_five_readers_read_the_records_folder_and_agree(results: Path) -> None:
    for method in ("erm", "fl"):
        assert CliRunner().invoke(app, ["run", "two-moons", "-m", method, "--epochs", "4", "--eval-every", "2"]).exit_code == 0
    folder = results / "records"
    ours = records.read(folder).sort_by([("run_id", "ascending"), ("epoch", "ascending"), ("split", "ascending"),
                                         ("sample_id", "ascending")])
    assert ours.num_rows == 2 * 2 * 2000

    import duckdb
    import pandas as pd
    import polars as pl
    import pyarrow.dataset as ds

    def summary(run_id, loss) -> dict[str, float]:
        ids, loss = np.asarray(run_id).astype(str), np.asarray(loss, dtype=np.float64)
        return {r: float(loss[ids == r].sum()) for r in sorted(set(ids))}

    want = summary(ours["run_id"].to_numpy(zero_copy_only=False), ours["loss"].to_numpy())
    got = {
        "pandas": (lambda df: summary(df["run_id"], df["loss"]))(pd.read_parquet(folder)),
        "pyarrow.parquet": (lambda t: summary(t["run_id"].to_numpy(zero_copy_only=False), t["loss"].to_numpy()))(
            pq.read_table(folder)),
        "pyarrow.dataset": (lambda t: summary(t["run_id"].to_numpy(zero_copy_only=False), t["loss"].to_numpy()))(
            ds.dataset(folder).to_table()),
        "duckdb": (lambda rows: summary([r[0] for r in rows], [r[1] for r in rows]))(duckdb.sql(
            f"SELECT run_id, loss FROM read_parquet('{folder}/*/*.parquet', hive_partitioning = true)").fetchall()),
        "polars": (lambda df: summary(df["run_id"].to_list(), df["loss"].to_list()))(
            pl.read_parquet(f"{folder}/*/*.parquet", hive_partitioning=True)),
    }
    for reader, sums in got.items():
        assert sums.keys() == want.keys(), reader
        assert all(np.isclose(sums[k], want[k]) for k in want), reader


@pytest.mark.notorch
def test_records_written_before_run_id_was_dictionary_encoded_stay_readable(tmp_path: Path) -> None:
    folder = records_of(tmp_path, "0123456789abcdef")
    folder.mkdir(parents=True)
    old = writes.split_table("0123456789abcdef", "train", 1, np.ones(3), np.zeros(3), np.zeros(3))
    old = old.set_column(0, "run_id", pa.array(["0123456789abcdef"] * 3))          # the old plain-string column
    pq.write_table(old, folder / "epoch=00001.parquet")
    table = records.read(tmp_path, ["0123456789abcdef"])
    assert table.num_rows == 3 and table.schema.field("run_id").type == pa.string()
