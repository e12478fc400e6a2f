"""Cross-run per-sample queries: samples that violate ε in at least k seeds; samples whose loss differs most
between two methods (paired by sample id). Results are pyarrow tables (shown and saved as Parquet).

Both take the runs of one task (a sample id names a sample of one task only) and group them into configurations
exactly as the tables and figures do (flctl.report.groups_of_runs), labelled as the tables label their rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flctl.db import RunRecord

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flctl.errors import ConfigError
from flctl.report.data import final_records
from flctl.report.groups_of_runs import ConfigKey, group_by_config, row_labels
from flctl.report.tables import one_task
from flctl.status import Status

# Spelled out, so that a group with no violators (zero rows) still has the types of the others.
VIOLATORS_SCHEMA = pa.schema([("group", pa.string()), ("eps", pa.float64()), ("sample_id", pa.int64()),
                              ("seeds_violating", pa.int64()), ("seeds", pa.int64()), ("mean_loss", pa.float64()),
                              ("max_loss", pa.float64())])


def _configs(runs: list[RunRecord]) -> list[tuple[ConfigKey, str, list[RunRecord]]]:
    """(configuration, its label, its completed runs) in table order, for the runs of one task."""
    one_task(runs)
    groups = group_by_config(runs)
    keys = sorted(groups, key=lambda k: k.sort_key())
    _, labels = row_labels(keys)
    out = []
    for k in keys:
        done = [r for r in groups[k] if r.status == Status.COMPLETED]
        if done:
            out.append((k, " · ".join(labels[k]), done))
    return out


def most_seeds(runs: list[RunRecord]) -> int:
    """The most seeds any configuration of ``runs`` has (a ``min_seeds`` above it leaves ``violators`` empty)."""
    return max((len(group) for _, _, group in _configs(runs)), default=0)


def violators(runs: list[RunRecord], records_root: Path, *, split: str = "train", min_seeds: int = 1,
              eps: float | None = None) -> pa.Table:
    """Per configuration: samples whose final loss exceeds ε in at least ``min_seeds`` of its seeds.

    ``eps`` overrides each run's level (needed for ERM, which has none)."""
    out = []
    for key, label, group in _configs(runs):
        level = eps if eps is not None else key.eps
        if level is None:   # ERM has no ε
            continue
        t = final_records(records_root, group, ["run_id", "sample_id", "loss"], split=split)
        t = t.append_column("violates", pc.greater(t["loss"], level))
        agg = t.group_by("sample_id").aggregate([("violates", "sum"), ("loss", "mean"), ("loss", "max")])
        agg = agg.filter(pc.greater_equal(agg["violates_sum"], min_seeds))
        n = len(agg)
        out.append(pa.table({"group": [label] * n, "eps": [float(level)] * n, "sample_id": agg["sample_id"],
                             "seeds_violating": agg["violates_sum"], "seeds": [len(group)] * n,
                             "mean_loss": agg["loss_mean"], "max_loss": agg["loss_max"]}, schema=VIOLATORS_SCHEMA))
    if not out:
        raise ConfigError("no run with a scalar ε to test violations against; pass --eps for ERM runs")
    table = pa.concat_tables(out)
    return table.sort_by([("group", "ascending"), ("seeds_violating", "descending"), ("mean_loss", "descending")])


def _pairs(a: list[tuple[ConfigKey, str, list[RunRecord]]],
           b: list[tuple[ConfigKey, str, list[RunRecord]]]) -> list[tuple[tuple, tuple]]:
    """Configurations of the two methods that agree on every varying field both read (an lr grid: ERM at lr x
    against FL at lr x); when none agree (e.g. method defaults of their own), every pair."""
    def agree(x: ConfigKey, y: ConfigKey) -> bool:
        return all(u is None or v is None or u == v for (_, u), (_, v) in zip(x.rest, y.rest))
    matched = [(x, y) for x in a for y in b if agree(x[0], y[0])]
    return matched or [(x, y) for x in a for y in b]


def diff(runs: list[RunRecord], records_root: Path, methods: tuple[str, str], *, split: str = "test",
         top: int = 20) -> pa.Table:
    """Per pair of configurations of the two methods (``_pairs``): the ``top`` samples whose seed-mean final loss
    differs most, paired by sample id."""
    if methods[0] == methods[1]:
        raise ConfigError(f"--methods names {methods[0]} twice; give two different methods")
    configs = _configs(runs)
    sides = []
    for m in methods:
        mine = [c for c in configs if c[0].method == m]
        if not mine:
            raise ConfigError(f"no completed {m} runs among the selected runs; --methods takes two of: "
                              + ", ".join(sorted({r.method for r in runs})))
        sides.append(mine)

    def seed_mean(group: list[RunRecord]) -> pa.Table:
        t = final_records(records_root, group, ["sample_id", "loss"], split=split)
        return t.group_by("sample_id").aggregate([("loss", "mean")]).sort_by("sample_id")

    a_name, b_name = methods
    out = []
    for (_, a_label, a_runs), (_, b_label, b_runs) in _pairs(*sides):
        a, b = seed_mean(a_runs), seed_mean(b_runs)
        if a["sample_id"] != b["sample_id"]:
            raise ConfigError(f"{a_name} and {b_name} runs have different samples; compare runs of one task")
        la, lb = a["loss_mean"].to_numpy(), b["loss_mean"].to_numpy()
        order = np.argsort(-np.abs(la - lb), kind="stable")[:top]
        n = len(order)
        out.append(pa.table({f"{a_name}_group": pa.array([a_label] * n, pa.string()),
                             f"{b_name}_group": pa.array([b_label] * n, pa.string()),
                             "sample_id": a["sample_id"].to_numpy()[order], f"{a_name}_loss": la[order],
                             f"{b_name}_loss": lb[order], "difference": (la - lb)[order]}))
    return pa.concat_tables(out)
