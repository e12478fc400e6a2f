"""The paper's tables: rows of (method, ε, α) cells, each mean ± std over seeds with its seed count.

``build(name, runs, ...)`` lays finished runs out as the table flctl.report.table_specs declares under ``name``, a
``Table``; flctl.report.render writes it as rich, markdown, LaTeX (booktabs, ± part grey as in the paper) or CSV.
The best value of each column is bold; a cell with fewer seeds than its siblings is flagged (†) and named in the
notes. Rows are configurations as flctl.report.groups_of_runs groups and writes them (figures and per-sample queries
use the same). The runs table is one row per run instead, of any set of runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flctl.db import RunRecord

import math
from collections.abc import Callable, Sequence

import numpy as np

from flctl.config import FIELDS
from flctl.errors import ConfigError
from flctl.method_info import method_info
from flctl.metrics import SPLITS, SUMMARY_METRICS
from flctl.report.groups_of_runs import group_by_config, hashable, row_labels, value_order
from flctl.report.render import BesideRow, Cell, Table, latex_beside, latex_text, render

__all__ = ["BesideRow", "Cell", "Table", "build", "latex_beside", "latex_text", "record_values", "render"]
from flctl.report.table_specs import TableSpec, table_spec
from flctl.status import Status
from flctl.versions import CHANGES_NUMBERS, LIBRARIES

SUMMARY = SUMMARY_METRICS
TAIL = ("cvar", "quantile")   # computed from the records at a chosen q: train.cvar@0.95, test.quantile@0.99


def check_column(name: str) -> None:
    split, _, metric = name.partition(".")
    base, at, q = metric.partition("@")
    ok = split in SPLITS and ((not at and base in SUMMARY) or (at and base in TAIL and _is_q(q)))
    if not ok:
        raise ConfigError(f"unknown column {name!r}; use SPLIT.METRIC with SPLIT in train, test and METRIC one of "
                          f"{', '.join(SUMMARY)}, or cvar@Q / quantile@Q with 0 <= Q < 1")


def _is_q(text: str) -> bool:
    try:
        return 0.0 <= float(text) < 1.0
    except ValueError:
        return False


def aggregate(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (ddof 1; 0 for a single seed) of the finite values."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=np.float64)
    if len(v) == 0:
        return None, None
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0


# ---------------------------------------------------------------- rows

# How many rows with fewer seeds than the others are named one by one; past this, one note sums them up (a grid of
# single-seed cells beside one cell of two seeds would otherwise print a warning per cell).
NAMED_SHORT_ROWS = 3


def one_task(runs: Sequence[RunRecord]) -> str:
    """The one task of the runs; ConfigError naming them when there are several ("best", or a sample id, across
    tasks means nothing)."""
    tasks = sorted({r.task for r in runs})
    if len(tasks) > 1:
        raise ConfigError(f"these runs are of {len(tasks)} tasks ({', '.join(tasks)}); pick one with --task or --sweep")
    return tasks[0]


def _run_value(v: Any) -> str:
    """A run's field as a CSV cell: numbers in full (pandas reads them as numbers), empty when not read."""
    if v is None:
        return ""
    return repr(v) if isinstance(v, float) else str(v)


def _runs_table(title: str, runs: list[RunRecord], columns: list[str],
                value: Callable[[RunRecord, str], float | None]) -> Table:
    """One row per run: its id, task, method, every identity field of RunConfig (fields a method or a switched-off
    option does not read are empty), every task option, then the metric columns."""
    fields = [name for name, f in FIELDS.items() if f.identity and name != "method"]
    options = sorted({k for r in runs for k in (r.config.get("options") or {})})
    versions = [*LIBRARIES, "cuda", "python", "data"]
    table = Table(title, ["run", "task", "method", *fields, *(f"options.{k}" for k in options),
                           *(f"versions.{v}" for v in versions)], columns, per_run=True)

    def used(r: RunRecord) -> dict[str, Any]:
        # e.g. the nuPI gains of a gd run: checked, reset, never read
        return {**r.config, **{name: None for name, f in FIELDS.items()
                               if f.switched_by and r.config.get(f.switched_by) == FIELDS[f.switched_by].default}}

    rows = []
    for r in runs:
        cfg, opts = used(r), r.config.get("options") or {}
        order = (r.task, method_info(r.method).order, tuple(value_order(hashable(cfg.get(f))) for f in fields if f != "seed"),
                 r.seed, r.id)
        made = {**_libraries(r), "data": (r.provenance or {}).get("data")}
        rows.append((order, [r.id, r.task, r.method, *(_run_value(cfg.get(f)) for f in fields),
                             *(_run_value(opts.get(k)) for k in options), *(_run_value(made.get(v)) for v in versions)],
                     [Cell(value(r, c), None, 1) for c in columns]))
    table.rows = [(keys, cells) for _, keys, cells in sorted(rows, key=lambda row: row[0])]
    return table


def _short_notes(rows: list[tuple[list[str], int, int, int]], expected: int) -> list[str]:
    """Notes for the rows with fewer seeds than ``expected``: (label, seeds done, runs, diverged) each."""
    short = [(label, done, diverged) for label, done, _, diverged in rows if done < expected]
    if len(short) <= NAMED_SHORT_ROWS:
        return [f"† {' · '.join(label)}: {done} of {expected} seeds" + (f" ({d} diverged)" if d else "")
                for label, done, d in short]
    counts: dict[int, int] = {}
    for _, done, _ in short:
        counts[done] = counts.get(done, 0) + 1
    diverged = sum(d for _, _, d in short)
    spread = ", ".join(f"{n} with {done}" for done, n in sorted(counts.items()))
    return [f"† {len(short)} of {len(rows)} rows have fewer than {expected} seeds ({spread})"
            + (f"; {diverged} run(s) diverged" if diverged else "") + "; see `flctl runs`"]


def build(name: str | TableSpec, runs: list[RunRecord], columns: Sequence[str] | None = None,
          value: Callable[[RunRecord, str], float | None] | None = None) -> Table:
    """Lay finished runs out as the table ``name`` (flctl.report.table_specs; or its spec). ``value(run, column)``
    reads a column (default: summary)."""
    spec = table_spec(name) if isinstance(name, str) else name
    if spec.row == "config":   # a row per run stands alone; grouped rows compete for "best" within one task only
        one_task(runs)
    value = value or (lambda run, col: run.metrics.get(col))
    if columns is None:
        classification = any(r.metrics.get("train.accuracy") is not None for r in runs)
        metrics = (*(SUMMARY if spec.metrics is None else spec.metrics), *(spec.classification if classification else ()))
        columns = [f"{s}.{m}" for s in SPLITS for m in metrics
                   if spec.metrics is not None or any(f"{s}.{m}" in r.metrics for r in runs)]
    for c in columns:
        check_column(c)
    columns = list(columns)
    if spec.row == "run":
        return _runs_table(spec.title, runs, columns, value)

    groups = group_by_config(runs)
    keys = sorted(groups, key=lambda k: k.sort_key(spec))
    names, labels = row_labels(keys, spec)
    table = Table(spec.title, names, columns)
    expected = max(len(g) for g in groups.values())
    seeds = []
    for k in keys:
        group = groups[k]
        done = [r for r in group if r.status == Status.COMPLETED]
        cells = []
        for c in columns:
            mean, std = aggregate([value(r, c) for r in done])
            cells.append(Cell(mean, std, len(done), flagged=len(done) < expected))
        table.rows.append((labels[k], cells))
        table.configs.append(k)
        seeds.append((labels[k], len(done), len(group), sum(r.status == Status.DIVERGED for r in group)))
    table.notes += _short_notes(seeds, expected)
    table.notes += mixed_code_notes(runs)
    return table


def mixed_code_notes(runs: Sequence[RunRecord]) -> list[str]:
    """A note for each configuration (a table's row) whose runs were trained by different code of its task or
    method (the source hashes each run records, RunRecord.provenance), so that a task file edited between seeds
    does not pass unseen; and for each whose runs were trained under different versions of a library that changes
    numbers (flctl.versions.CHANGES_NUMBERS), so that a year-old seed beside a new one does not either."""
    groups = group_by_config(runs)
    _, labels = row_labels(list(groups))
    notes = []
    for key, group in groups.items():
        label = labels[key]
        for what in ("task", "method"):
            hashes = {h for r in group if (h := ((r.provenance or {}).get(what) or {}).get("sha256"))}
            if len(hashes) > 1:
                short = ", ".join(sorted(h[:10] for h in hashes))
                notes.append(f"‡ {' · '.join(label)}: its runs came from {len(hashes)} versions of the {what}'s code "
                             f"({short}); see `flctl show RUN --json` (provenance)")
        for lib in CHANGES_NUMBERS:
            seen = {v for r in group if (v := _libraries(r).get(lib))}
            if len(seen) > 1:
                notes.append(f"‡ {' · '.join(label)}: its runs were trained under {len(seen)} versions of {lib} "
                             f"({', '.join(sorted(seen))}), which alone can move their numbers; see "
                             "`flctl report --table runs` (versions.*)")
    return notes


def _libraries(run: RunRecord) -> dict[str, Any]:
    """The library versions a run recorded (flctl.versions); {} for runs recorded before they were."""
    return (run.provenance or {}).get("libraries") or {}


def record_values(runs: list[RunRecord], records_root, columns: Sequence[str]) -> Callable[[RunRecord, str], float | None]:
    """A column reader that computes tail columns (cvar@q, quantile@q) from each run's final records and
    takes the rest from the recorded summary metrics. A run whose records fail `flctl verify` is refused even where
    no column reads them (``gate``, names and sizes: cheap): its numbers are not shown beside sound ones. A run
    without records (its folder gone, a database alone) shows its summary metrics."""
    from flctl.layout import records_of
    from flctl.metrics import cvar
    from flctl.report.data import final_losses, gate

    tails = [c for c in columns if "@" in c]
    # The final files read whole where tail columns read them (the check's facts are kept: read once)
    gate(records_root, [r for r in runs if records_of(records_root, r.id).is_dir()], read="final" if tails else "none")
    computed: dict[tuple[str, str], float] = {}
    if tails:
        done = [r for r in runs if r.status == Status.COMPLETED]     # records: a refusal spells the retrain command
        losses = final_losses(records_root, done, sorted({c.split(".", 1)[0] for c in tails}))
        for (run_id, split), chunk in losses.items():
            for c in tails:
                c_split, _, metric = c.partition(".")
                if c_split == split:
                    kind, _, q = metric.partition("@")
                    computed[(run_id, c)] = cvar(chunk, float(q)) if kind == "cvar" else float(np.quantile(chunk, float(q)))

    def value(run: RunRecord, column: str) -> float | None:
        if "@" in column:
            return computed.get((run.id, column))
        return run.metrics.get(column)
    return value
