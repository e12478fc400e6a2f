"""`flctl report --table groups --by ATTRIBUTE`: loss per group of samples and method, and the worst group.

A task labels its samples with groups through its extras, one array per split and attribute, by sample id:
``train_group_<attribute>`` and ``test_group_<attribute>`` (utkface: gender and race from the file names). Each
column is computed on a group's samples of each run's final records, then averaged over seeds (mean ± std); the
"worst group" rows take, per run, the largest value over the groups, then average that over seeds.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from flctl.errors import ConfigError
from flctl.metrics import SPLITS, cvar
from flctl.report.data import final_records
from flctl.report.plots.common import load_extras
from flctl.report.table_specs import TableSpec
from flctl.report.tables import Table, build, check_column
from flctl.status import Status

if TYPE_CHECKING:
    from flctl.db import RunRecord

WORST = "worst group"


def _group_value(losses: np.ndarray, metric: str, eps: float | None) -> float | None:
    """One column's value on one group's final losses; None where the column is not a function of the losses."""
    base, _, q = metric.partition("@")
    if base == "avg_loss":
        return float(losses.mean())
    if base == "max_loss":
        return float(losses.max())
    if base.startswith("cvar"):
        return cvar(losses, float(q) if q else float(base.split("_")[1]))
    if base == "quantile":
        return float(np.quantile(losses, float(q)))
    if base == "violation_rate":
        return None if eps is None else float(np.mean(losses > eps))
    raise ConfigError(f"column {metric!r} is not computed per group; use avg_loss, max_loss, cvar_0.9, cvar@Q, "
                      "quantile@Q or violation_rate")


def groups_table(runs: list[RunRecord], records_root: Path, by: str, columns: Sequence[str] | None,
                 spec: TableSpec) -> Table:
    """The table ``spec`` (one with ``by``) of the runs' samples grouped by the attribute ``by``: per group, a row per
    configuration laid out as ``spec`` says, then the worst group's rows."""
    columns = list(columns or [f"{s}.{m}" for s in SPLITS for m in spec.metrics or ()])
    for c in columns:
        check_column(c)
    done = [r for r in runs if r.status == Status.COMPLETED]
    labels: dict[str, dict[str, np.ndarray]] = {}
    found: set[str] = set()
    for r in done:
        extras = load_extras(r, ()) or {}
        found |= {k.split("_group_", 1)[1] for k in extras if "_group_" in k}
        if all(f"{s}_group_{by}" in extras for s in ("train", "test")):
            labels[r.id] = {s: extras[f"{s}_group_{by}"] for s in ("train", "test")}
    if not labels:
        task = done[0].task if done else "selected"
        have = f"its runs label samples by {', '.join(sorted(found))}" if found else "its runs label no groups"
        raise ConfigError(f"--by {by}: {have} (task {task}); a task gives group labels in its extras, e.g. utkface's "
                          "gender and race")
    done = [r for r in done if r.id in labels]
    records = final_records(records_root, [r.id for r in done], ["run_id", "split", "sample_id", "loss"])
    run_ids = np.asarray(records["run_id"].to_pylist())
    splits = np.asarray(records["split"].to_pylist())
    ids, losses = records["sample_id"].to_numpy(), records["loss"].to_numpy()

    values: dict[tuple[str, str, str], float | None] = {}     # (run, group, column) -> value
    names: list[str] = sorted({str(g) for lab in labels.values() for s in lab.values() for g in s})
    for r in done:
        for c in columns:
            split, _, metric = c.partition(".")
            mine = (run_ids == r.id) & (splits == split)
            group_of = labels[r.id][split][ids[mine]]
            per_group = {g: _group_value(losses[mine][group_of == g], metric, r.config.get("eps"))
                         for g in names if (group_of == g).any()}
            values.update(((r.id, g, c), v) for g, v in per_group.items())
            present = [v for v in per_group.values() if v is not None]
            values[(r.id, WORST, c)] = max(present) if present else None

    # Rows compete for "best" only within their group: a method's loss on one race beside another's on another is
    # no comparison.
    table = Table(spec.title.format(by=by), ["Group"], columns, best_within_first_key=True)
    for group in [*names, WORST]:
        def value(run: RunRecord, col: str, group: str = group) -> float | None:
            return values.get((run.id, group, col))
        part = build(spec, done, columns, value=value)
        if not table.keys[1:]:
            table.keys += part.keys
        table.rows += [([group, *row], cells) for row, cells in part.rows if any(c.n for c in cells)
                       and any(c.mean is not None for c in cells)]
        table.notes += [n for n in part.notes if n not in table.notes]
    return table
