"""Per-sample queries and the runs table on a results folder of two tasks, with an lr grid: one task per query,
configurations grouped and labelled as the tables do; the runs CSV one row per run; rows in numeric order; labels
that tell runs apart."""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from flctl.cli import app
from flctl.config import FIELDS
from flctl.db import Store
from flctl.metrics import SPLITS, SUMMARY_METRICS
from flctl.report.groups_of_runs import distinct_texts
from flctl.report.tables import build, render
from flctl.versions import LIBRARIES
from tests.test_report_tables import run as record

runner = CliRunner()
LRS = ("1e-2", "1e-3", "1e-4", "3e-3")     # given out of order: the tables sort them by value


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """two-moons: ERM and FL over 4 lrs x 2 seeds, and an FL run with ε = 1000 (violates nothing); digits: FL at
    its default ε = 0.51 and at --p-min 0.6 (ε = log 1/0.6 = 0.5108)."""
    root = tmp_path_factory.mktemp("queries") / "results"
    for args in (["sweep", "two-moons", "-m", "erm,fl", "--lr", ",".join(LRS), "--seeds", "2", "--epochs", "2",
                  "--executor", "debug", "--name", "grid"],
                 ["run", "two-moons", "-m", "fl", "--eps", "1000", "--epochs", "2"],
                 ["run", "digits", "-m", "fl", "--epochs", "1"],
                 ["run", "digits", "-m", "fl", "--p-min", "0.6", "--epochs", "1"]):
        res = runner.invoke(app, [*args, "--results-dir", str(root)])
        assert res.exit_code == 0, res.output
    return root


def report(folder: Path, *args: str):
    return runner.invoke(app, ["report", *args, "--results-dir", str(folder)], env={"COLUMNS": "200"})


@pytest.mark.parametrize("query", [["violators", "--min-seeds", "3"], ["diff", "--methods", "erm,fl", "--top", "5"]])
def test_queries_over_several_tasks_are_refused(folder: Path, tmp_path: Path, query: list[str]) -> None:
    out = tmp_path / "q.parquet"
    res = report(folder, "--samples", *query, "--out", str(out))
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert "2 tasks (digits, two-moons); pick one with --task" in lines[0]
    assert not out.exists()


def test_violators_with_a_group_that_has_none(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "v.parquet"
    res = report(folder, "--samples", "violators", "--task", "two-moons", "--out", str(out))
    assert res.exit_code == 0, res.output
    table = pq.read_table(out)
    groups = set(table["group"].to_pylist())
    # the FL runs at each lr violate ε = 0.1 somewhere; the ε = 1000 run is a group of no rows
    assert {g.rsplit("lr=", 1)[1] for g in groups} == {"1e-04", "1e-03", "3e-03", "0.01"}
    assert all(g.startswith("FL · 0.10 · —") for g in groups) and 1000.0 not in table["eps"].to_pylist()
    assert table.schema.field("group").type == "string" and min(table["seeds_violating"].to_pylist()) >= 1
    # the README's line, where every group is empty (2 seeds < 3): an empty table, not a traceback
    res = report(folder, "--samples", "violators", "--min-seeds", "3", "--task", "two-moons", "--out", str(out))
    assert res.exit_code == 0 and "violators: 0 rows" in res.output, res.output
    assert "--min-seeds 3: no configuration has that many seeds (at most 2)" in res.stderr    # and why
    assert pq.read_table(out).num_rows == 0


def test_diff_within_a_task_pairs_configurations_per_lr(folder: Path, tmp_path: Path) -> None:
    from flctl.report.data import final_records

    out = tmp_path / "d.parquet"
    res = report(folder, "--samples", "diff", "--methods", "erm,fl", "--top", "3", "--task", "two-moons",
                 "--out", str(out))
    assert res.exit_code == 0, res.output
    d = pq.read_table(out).to_pandas()
    lr_of = {"erm": d["erm_group"].str.rsplit("lr=", n=1).str[1], "fl": d["fl_group"].str.rsplit("lr=", n=1).str[1]}
    assert (lr_of["erm"] == lr_of["fl"]).all() and sorted(set(lr_of["erm"])) == sorted(["1e-04", "1e-03", "3e-03",
                                                                                         "0.01"])
    assert len(d) == 4 * 3 and (d.groupby("erm_group")["difference"].apply(lambda x: (np.diff(x.abs()) <= 0).all())).all()
    # one pair, by hand: the mean over the two seeds of the lr = 0.01 runs, per sample
    store = Store.open(f"sqlite:///{folder / 'flctl.db'}", readonly=True)
    try:
        ids = {m: [r.id for r in store.list_runs(task="two-moons", method=m) if r.config["lr"] == 1e-2]
               for m in ("erm", "fl")}
    finally:
        store.close()
    assert all(len(v) == 2 for v in ids.values())
    row = d[lr_of["erm"] == "0.01"].iloc[0]
    for m in ("erm", "fl"):
        t = final_records(folder / "records", ids[m], ["sample_id", "loss"], split="test").to_pandas()
        assert row[f"{m}_loss"] == pytest.approx(t[t.sample_id == row.sample_id].loss.mean())


def test_runs_csv_of_several_tasks(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "runs.csv"
    res = report(folder, "--table", "runs", "--format", "csv", "--out", str(out))
    assert res.exit_code == 0, res.output
    df = pd.read_csv(out)
    fields = [name for name, f in FIELDS.items() if f.identity and name != "method"]
    options = [c for c in df.columns if c.startswith("options.")]
    metrics = [f"{s}.{m}" for s in SPLITS for m in SUMMARY_METRICS if f"{s}.{m}" in df.columns]
    versions = [f"versions.{v}" for v in (*LIBRARIES, "cuda", "python", "data")]     # what made each run
    assert list(df.columns) == ["run", "task", "method", *fields, *options, *versions, *metrics]
    assert (df["versions.torch"] == torch.__version__).all() and df["versions.data"].str.startswith("made by").all()
    assert "options.hidden" in options and "train.avg_loss" in metrics
    assert len(df) == 16 + 1 + 2 and set(df.task) == {"two-moons", "digits"} and df.run.is_unique
    for number in ("lr", "eps", "alpha", "dual_lr", "kp", "train.avg_loss"):
        assert df[number].dtype == np.float64, number
    assert df.seed.dtype == np.int64 and df.epochs.dtype == np.int64
    erm = df[df.method == "erm"]
    assert erm.eps.isna().all() and erm.dual_lr.isna().all() and df.alpha.isna().all()   # not read: empty
    assert df.kp.isna().all()                                                             # gd reads no gains
    assert sorted(df[df.task == "two-moons"].lr.unique()) == [1e-4, 5e-4, 1e-3, 3e-3, 1e-2]
    assert sorted(df[df.task == "digits"].eps) == [0.51, pytest.approx(math.log(1 / 0.6))]


def test_config_rows_sort_by_value_and_labels_tell_runs_apart(folder: Path) -> None:
    res = report(folder, "--table", "main", "--task", "two-moons", "--format", "csv", "--columns", "train.avg_loss")
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(io.StringIO(res.stdout)))       # the † warning is on stderr, not in the CSV
    assert [r["Config"] for r in rows if r["Method"] == "ERM"] == [f"lr={lr}" for lr in
                                                                   ("1e-04", "1e-03", "3e-03", "0.01")]
    assert "warning: † FL · 1000.00 · — · lr=5e-04: 1 of 2 seeds" in res.stderr
    res = report(folder, "--table", "main", "--task", "digits", "--format", "csv", "--columns", "train.avg_loss")
    assert [(r["Method"], r["ε"]) for r in csv.DictReader(io.StringIO(res.stdout))] == [("FL", "0.510"), ("FL", "0.511")]


def test_distinct_texts_are_the_shortest_that_tell_values_apart() -> None:
    assert distinct_texts([0.5, 1.0, None]) == {0.5: "0.50", 1.0: "1.00", None: "—"}
    assert distinct_texts([0.51, math.log(1 / 0.6)]) == {0.51: "0.510", math.log(1 / 0.6): "0.511"}
    assert distinct_texts([0.51, 0.5100001]) == {0.51: "0.5100000", 0.5100001: "0.5100001"}
    assert distinct_texts([1e-3, 1.2e-3, 0.01]) == {1e-3: "1.0e-03", 1.2e-3: "1.2e-03", 0.01: "0.010"}
    assert distinct_texts([25, 100, "gd"]) == {25: "25", 100: "100", "gd": "gd"}


def test_numeric_order_and_one_note_for_a_grid_of_single_seeds() -> None:
    erm = [record("erm", s, train__avg_loss=0.1) for s in (0, 1)]
    grid = [dataclasses.replace(r := record("fl", 0, eps=0.5, train__avg_loss=0.2), id=f"p{p}",
                                config={**r.config, "prune_after": p}) for p in (0, 100, 25, 5)]
    table = build("main", erm + grid, ["train.avg_loss"])
    assert [row[-1] for row, _ in table.rows] == ["prune_after=0", "prune_after=0", "prune_after=5",
                                                  "prune_after=25", "prune_after=100"]
    assert table.notes == ["† 4 of 5 rows have fewer than 2 seeds (4 with 1); see `flctl runs`"]
    assert render(table, "markdown").count("†") == 4 + 1
    few = build("main", erm + grid[:2], ["train.avg_loss"])      # a few short rows are still named one by one
    assert few.notes == ["† FL · 0.50 · — · prune_after=0: 1 of 2 seeds", "† FL · 0.50 · — · prune_after=100: 1 of 2 seeds"]
