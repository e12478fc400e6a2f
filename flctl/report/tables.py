"""The paper's tables: rows of (method, ε, α) cells, each mean ± std over seeds with its seed count.

``build(name, runs, ...)`` turns finished runs into a ``Table``; ``render(table, fmt)`` writes it as rich,
markdown, LaTeX (booktabs, ± part grey as in the paper) or CSV. The best value of each column is bold; a
cell with fewer seeds than its siblings is flagged (†) and named in the notes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flctl.store import RunRecord

import csv
import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from flctl.config import ConfigError, with_later_defaults
from flctl.method_info import method_info
from flctl.metrics import SPLITS, SUMMARY_METRICS
from flctl.report import FORMATS, TABLES

SUMMARY = SUMMARY_METRICS
HIGHER_IS_BETTER = ("accuracy",)
TAIL = ("cvar", "quantile")   # computed from the records at a chosen q: train.cvar@0.95, test.quantile@0.99


@dataclass(frozen=True)
class Cell:
    mean: float | None
    std: float | None
    n: int
    flagged: bool = False


@dataclass
class Table:
    title: str
    keys: list[str]                                  # names of the key columns, e.g. ["Method", "ε"]
    columns: list[str]                               # metric columns, e.g. ["train.avg_loss", ...]
    rows: list[tuple[list[str], list[Cell]]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Rows compete for "best" only with rows of the same first key (the groups table: methods within a group).
    best_within_first_key: bool = False

    def best(self, digits: int = 2) -> list[set[int]]:
        """Rows holding the best mean of each column, as shown with ``digits`` decimals: every tied row is
        best (empty when no row, or only one, has a value)."""
        blocks: dict[str, list[int]] = {}
        for i, (keys, _) in enumerate(self.rows):
            blocks.setdefault(keys[0] if self.best_within_first_key else "", []).append(i)
        out: list[set[int]] = []
        for j, col in enumerate(self.columns):
            pick = max if col.split(".")[-1].split("@")[0] in HIGHER_IS_BETTER else min
            best: set[int] = set()
            for rows in blocks.values():
                values = {i: round(m, digits) for i in rows if (m := self.rows[i][1][j].mean) is not None}
                if len(values) >= 2:
                    top = pick(values.values())
                    best |= {i for i, v in values.items() if v == top}
            out.append(best)
        return out


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


def _key_value(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.2f}" if abs(v) >= 0.01 or v == 0 else f"{v:.0e}"
    return str(v)


def build(name: str, runs: list[RunRecord], columns: Sequence[str] | None = None,
          value: Callable[[RunRecord, str], float | None] | None = None) -> Table:
    """Group finished runs into the named table. ``value(run, column)`` reads a column (default: summary)."""
    if name not in TABLES:
        raise ConfigError(f"unknown table {name!r}; choose one of: {', '.join(TABLES)}")
    tasks = sorted({r.task for r in runs})
    if len(tasks) > 1:   # "best" across tasks means nothing: one task per table
        raise ConfigError(f"these runs are of {len(tasks)} tasks ({', '.join(tasks)}); pick one with --task or --sweep")
    value = value or (lambda run, col: run.metrics.get(col))
    classification = any(r.metrics.get("train.accuracy") is not None for r in runs)
    if columns is None:
        per_split = ["avg_loss", "max_loss"] + (["accuracy"] if classification and name == "main" else [])
        if name == "runs":
            per_split = [m for m in SUMMARY if any(f"train.{m}" in r.metrics for r in runs)]
        columns = [f"{s}.{m}" for s in SPLITS for m in per_split]
    for c in columns:
        check_column(c)
    columns = list(columns)

    if name == "runs":
        table = Table("Runs", ["Run", "Method", "ε", "α", "Seed", "Status"], columns)
        for r in sorted(runs, key=lambda r: (method_info(r.method).order, str(r.config.get("eps")),
                                             str(r.config.get("alpha")), r.seed)):
            cells = [Cell(value(r, c), None, 1) for c in columns]
            table.rows.append(([r.id, method_info(r.method).label,
                                _key_value(r.config.get("eps")), _key_value(r.config.get("alpha")),
                                str(r.seed), r.status], cells))
        return table

    # Cells: everything that identifies a configuration except the seed. Besides method, eps and alpha, only
    # fields that take several values among the runs that use them (e.g. a swept dual lr) split cells.
    fixed = ("seed", "method", "eps", "alpha", "device", "data_dir")
    configs = {r.id: with_later_defaults(r.config) for r in runs}
    values_of: dict[str, set[str]] = {}
    for r in runs:
        for config_key, v in configs[r.id].items():
            if config_key not in fixed and v is not None:
                values_of.setdefault(config_key, set()).add(_key_value(v) if not isinstance(v, dict) else
                                                       str(sorted(v.items())))
    split_by = sorted(config_key for config_key, vs in values_of.items() if len(vs) > 1)
    groups: dict[tuple, list[RunRecord]] = {}
    for r in runs:
        cfg = configs[r.id]
        rest = tuple((config_key, _key_value(cfg.get(config_key)) if not isinstance(cfg.get(config_key), dict) else
                      ",".join(f"{a}={b}" for a, b in sorted(cfg[config_key].items()))) for config_key in split_by)
        model = (cfg.get("options") or {}).get("model")
        key = (method_info(r.method).order, r.method, cfg.get("eps"), cfg.get("alpha"), model, rest)
        groups.setdefault(key, []).append(r)
    varying_rest = bool(split_by)

    if name == "ablation":
        title, keys = "α ablation (FL is RFL with α = ∞)", ["ε", "Method", "α"]
    elif name == "llm":
        title, keys = "Preference optimization", ["Model", "Method", "ε"]
    else:
        title, keys = "Final performance", ["Method", "ε", "α"]
    table = Table(title, keys + (["Config"] if varying_rest else []), columns)
    expected = max(len(g) for g in groups.values())

    def sort_key(k):
        order, method, eps, alpha, model, rest = k
        eps_ = -1.0 if eps is None else (eps if isinstance(eps, float) else float(np.mean(eps)))
        alpha_ = math.inf if alpha is None else alpha
        if name == "ablation":   # ERM first; then per eps: FL (alpha = inf), RFL by decreasing alpha, CSERM
            return (order != 0, eps_, order, -alpha_ if method != "fl" else -math.inf, rest)
        if name == "llm":
            return (str(model), order, eps_, rest)
        return (order, eps_, alpha_, rest)

    for k in sorted(groups, key=sort_key):
        _, method, eps, alpha, model, rest = k
        group = groups[k]
        done = [r for r in group if r.status == "completed"]
        cells = []
        for c in columns:
            mean, std = aggregate([value(r, c) for r in done])
            cells.append(Cell(mean, std, len(done), flagged=len(done) < expected))
        label = method_info(method).label
        if name == "ablation":
            alpha_text = "∞" if method == "fl" else ("—" if alpha is None else _key_value(alpha))
            row = [_key_value(eps), label, alpha_text]
        elif name == "llm":
            row = [str(model or "—"), label, _key_value(eps)]
        else:
            row = [label, _key_value(eps), _key_value(alpha)]
        if varying_rest:
            row.append(", ".join(f"{a}={b}" for a, b in rest))
        table.rows.append((row, cells))
        if len(done) < expected:
            diverged = sum(r.status == "diverged" for r in group)
            table.notes.append(f"† {' · '.join(row)}: {len(done)} of {expected} seeds"
                               + (f" ({diverged} diverged)" if diverged else ""))
    return table


def _num(v: float | None, digits: int = 2) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def render(table: Table, fmt: str, digits: int = 2) -> str:
    """The table as text in one of FORMATS ('rich' renders to plain text of rich's table)."""
    if fmt not in FORMATS:
        raise ConfigError(f"unknown format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    best = table.best(digits)
    if fmt == "csv":
        out = io.StringIO()
        w = csv.writer(out, lineterminator="\n")
        w.writerow(table.keys + [f"{c}{s}" for c in table.columns for s in ("", ".std", ".n")])
        for key, cells in table.rows:
            w.writerow(key + [x for c in cells for x in ("" if c.mean is None else repr(c.mean),
                                                           "" if c.std is None else repr(c.std), c.n)])
        return out.getvalue()

    def cell_text(c: Cell, is_best: bool, bold: Callable[[str], str], pm: Callable[[str], str]) -> str:
        text = bold(_num(c.mean, digits)) if is_best else _num(c.mean, digits)
        if c.std is not None and c.n > 1:
            text += pm(_num(c.std, digits))
        return text + ("†" if c.flagged else "")

    if fmt == "markdown":
        lines = [f"**{table.title}**", "",
                 "| " + " | ".join(table.keys + table.columns) + " |",
                 "|" + "---|" * len(table.keys) + "---:|" * len(table.columns)]
        for i, (key, cells) in enumerate(table.rows):
            texts = [cell_text(c, i in best[j], lambda s: f"**{s}**", lambda s: f" ± {s}")
                     for j, c in enumerate(cells)]
            lines.append("| " + " | ".join(key + texts) + " |")
        lines += [""] + [f"{n}  " for n in table.notes] if table.notes else []
        return "\n".join(lines).rstrip() + "\n"

    if fmt == "latex":
        def esc(s: str) -> str:
            return (s.replace("_", r"\_").replace("%", r"\%").replace("ε", r"$\epsilon$")
                    .replace("α", r"$\alpha$").replace("∞", r"$\infty$").replace("—", "--")
                    .replace("†", r"$^\dagger$"))
        lines = [r"\begin{table}[t]", r"\centering", rf"\caption{{{esc(table.title)}}}",
                 r"\begin{tabular}{" + "l" * len(table.keys) + "c" * len(table.columns) + "}", r"\toprule",
                 " & ".join(esc(k) for k in table.keys + table.columns) + r" \\", r"\midrule"]
        for i, (key, cells) in enumerate(table.rows):
            texts = [esc(cell_text(c, i in best[j], lambda s: rf"\textbf{{{s}}}",
                                   lambda s: rf" {{\color{{gray}}\scriptsize $\pm$ {s}}}"))
                     for j, c in enumerate(cells)]
            lines.append(" & ".join([esc(k) for k in key] + texts) + r" \\")
        lines += [r"\bottomrule", r"\end{tabular}"]
        lines += [rf"\\[2pt]{{\footnotesize {esc(n)}}}" for n in table.notes]
        lines += [r"\end{table}"]
        return "\n".join(lines) + "\n"

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table as RichTable

    from flctl.text import printable

    def literal(text: str) -> str:   # key values come from run configs (e.g. a model name): text, not markup
        return escape(printable(text))

    rt = RichTable(*map(literal, table.keys), *map(literal, table.columns), title=literal(table.title))
    for i, (key, cells) in enumerate(table.rows):
        rt.add_row(*map(literal, key), *(cell_text(c, i in best[j], lambda s: f"[bold]{s}[/bold]", lambda s: f" ± {s}")
                                         for j, c in enumerate(cells)))
    console = Console(record=True, width=200, file=io.StringIO(), emoji=False)
    console.print(rt)
    for n in table.notes:
        console.print(f"[yellow]{literal(n)}[/]")
    return console.export_text(styles=False)


def record_values(runs: list[RunRecord], records_root, columns: Sequence[str]) -> Callable[[RunRecord, str], float | None]:
    """A column reader that computes tail columns (cvar@q, quantile@q) from each run's final records and
    takes the rest from the recorded summary metrics."""
    from flctl.metrics import cvar
    from flctl.report.data import final_losses

    tails = [c for c in columns if "@" in c]
    computed: dict[tuple[str, str], float] = {}
    if tails:
        done = [r.id for r in runs if r.status == "completed"]
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
