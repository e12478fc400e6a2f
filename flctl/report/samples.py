"""Cross-run per-sample queries: samples that violate ε in at least k seeds; samples whose loss differs most
between two methods (paired by sample id). Results are pyarrow tables (shown and saved as Parquet)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flctl.store import RunRecord

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flctl.config import ConfigError
from flctl.report.data import final_records


def _label(run: RunRecord) -> str:
    c = run.config
    parts = [run.method] + [f"{k}={c[k]:g}" for k in ("eps", "alpha") if isinstance(c.get(k), float)]
    return " ".join(parts)


def violators(runs: list[RunRecord], records_root: Path, *, split: str = "train", min_seeds: int = 1,
              eps: float | None = None) -> pa.Table:
    """Per (method, ε, α) group: samples whose final loss exceeds ε in at least ``min_seeds`` of its seeds.

    ``eps`` overrides each run's level (needed for ERM, which has none)."""
    groups: dict[str, list[RunRecord]] = {}
    for r in runs:
        if r.status == "completed":
            groups.setdefault(_label(r), []).append(r)
    out = []
    for label, group in sorted(groups.items()):
        level = eps if eps is not None else group[0].config.get("eps")
        if level is None or isinstance(level, list):
            continue
        t = final_records(records_root, [r.id for r in group], ["run_id", "sample_id", "loss"], split=split)
        t = t.append_column("violates", pc.greater(t["loss"], level))
        agg = t.group_by("sample_id").aggregate([("violates", "sum"), ("loss", "mean"), ("loss", "max")])
        agg = agg.filter(pc.greater_equal(agg["violates_sum"], min_seeds))
        n = len(agg)
        out.append(pa.table({"group": [label] * n, "eps": [float(level)] * n, "sample_id": agg["sample_id"],
                             "seeds_violating": agg["violates_sum"], "seeds": [len(group)] * n,
                             "mean_loss": agg["loss_mean"], "max_loss": agg["loss_max"]}))
    if not out:
        raise ConfigError("no run with a scalar ε to test violations against; pass --eps for ERM runs")
    table = pa.concat_tables(out)
    return table.sort_by([("group", "ascending"), ("seeds_violating", "descending"), ("mean_loss", "descending")])


def diff(runs: list[RunRecord], records_root: Path, methods: tuple[str, str], *, split: str = "test",
         top: int = 20) -> pa.Table:
    """Samples whose seed-mean final loss differs most between two methods, paired by sample id."""
    means = {}
    for m in methods:
        ids = [r.id for r in runs if r.method == m and r.status == "completed"]
        if not ids:
            raise ConfigError(f"no completed {m} runs among the selected runs; --methods takes two of: "
                              + ", ".join(sorted({r.method for r in runs})))
        t = final_records(records_root, ids, ["sample_id", "loss"], split=split)
        means[m] = t.group_by("sample_id").aggregate([("loss", "mean")]).sort_by("sample_id")
    a, b = means[methods[0]], means[methods[1]]
    if a["sample_id"] != b["sample_id"]:
        raise ConfigError(f"{methods[0]} and {methods[1]} runs have different samples; compare runs of one task")
    la, lb = a["loss_mean"].to_numpy(), b["loss_mean"].to_numpy()
    order = np.argsort(-np.abs(la - lb), kind="stable")[:top]
    return pa.table({"sample_id": a["sample_id"].to_numpy()[order], f"{methods[0]}_loss": la[order],
                     f"{methods[1]}_loss": lb[order], "difference": (la - lb)[order]})
