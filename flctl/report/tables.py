"""The paper's tables: rows of (method, ε, α) cells, each mean ± std over seeds with its seed count.

``build(name, runs, ...)`` turns finished runs into a ``Table``; ``render(table, fmt)`` writes it as rich,
markdown, LaTeX (booktabs, ± part grey as in the paper) or CSV. The best value of each column is bold; a
cell with fewer seeds than its siblings is flagged (†) and named in the notes. ``group_by_config`` is the one
grouping of runs into configurations; the per-sample queries (flctl.report.samples) use it too. The runs table
is one row per run instead, of any set of runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flctl.store import RunRecord

import csv
import dataclasses
import hashlib
import io
import math
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from flctl.config import FIELDS, NOT_IDENTITY, SWITCHED_FIELDS, with_later_defaults
from flctl.errors import ConfigError
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
    # One row per run (the runs table): cells are values, not means; CSV has no .std and .n columns.
    per_run: bool = False

    def best(self, digits: int = 2) -> list[set[int]]:
        """Rows holding the best mean of each column, as shown with ``digits`` decimals: every tied row is
        best (empty when no row, or only one, has a value)."""
        if self.per_run:   # runs of several tasks, not means over seeds: no row is "best"
            return [set() for _ in self.columns]
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


# ---------------------------------------------------------------- key values: grouping, order and labels

# How many rows with fewer seeds than the others are named one by one; past this, one note sums them up (a grid of
# single-seed cells beside one cell of two seeds would otherwise print a warning per cell).
NAMED_SHORT_ROWS = 3


def _hashable(v: Any) -> Hashable:
    """A config value as a dict key: per-sample ε lists and task options become tuples."""
    if isinstance(v, dict):
        return tuple((k, _hashable(x)) for k, x in sorted(v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(_hashable(x) for x in v)
    return v


def _order(v: Any) -> tuple:
    """Sort key of a config value: numbers by value (1e-3 before 0.01, 25 before 100), None first, then text."""
    if v is None:
        return (0,)
    if isinstance(v, (int, float)):
        return (1, float(v))
    if isinstance(v, tuple):
        return (3, tuple(_order(x) for x in v))
    return (2, str(v))


def _float_text(v: float, extra: int) -> str:
    """The tables' number style (two decimals, or 1e-03 below 0.01) with ``extra`` more digits."""
    if v == 0 or not math.isfinite(v) or abs(v) >= 0.01:
        return f"{v:.{2 + extra}f}"
    return f"{v:.{extra}e}"


def _plain_text(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, tuple) and all(isinstance(x, tuple) and len(x) == 2 for x in v):   # task options
        return ",".join(f"{a}={b}" for a, b in v)
    if isinstance(v, tuple):
        return f"per-sample (mean {float(np.mean(v)):.3g})"
    return str(v)


def distinct_texts(values: Iterable[Hashable]) -> dict[Hashable, str]:
    """Each distinct value's text, as short as the values allow while no two distinct values share one.

    Floats get the tables' style (0.51, 1e-03) with as many more digits as tell them apart (ε = 0.5108 beside 0.51:
    0.5108 and 0.5100); other values their plain text, with a short hash where two still read the same."""
    distinct = set(values)
    floats = sorted(v for v in distinct if isinstance(v, float))
    texts: dict[Hashable, str] = {v: repr(v) for v in floats}
    for extra in range(16):
        tried: dict[Hashable, str] = {v: _float_text(v, extra) for v in floats}
        if len(set(tried.values())) == len(tried):
            texts = tried
            break
    texts.update({v: _plain_text(v) for v in distinct if v not in texts})
    seen: dict[str, list[Hashable]] = {}
    for v, text in texts.items():
        seen.setdefault(text, []).append(v)
    for text, same in seen.items():
        if len(same) > 1:
            for v in same:
                texts[v] = f"{text} #{hashlib.sha1(repr(v).encode()).hexdigest()[:6]}"
    return texts


def one_task(runs: Sequence[RunRecord]) -> str:
    """The one task of the runs; ConfigError naming them when there are several ("best", or a sample id, across
    tasks means nothing)."""
    tasks = sorted({r.task for r in runs})
    if len(tasks) > 1:
        raise ConfigError(f"these runs are of {len(tasks)} tasks ({', '.join(tasks)}); pick one with --task or --sweep")
    return tasks[0]


@dataclass(frozen=True)
class ConfigKey:
    """What identifies a configuration except the seed: one row of a table, one group of a per-sample query."""

    method: str
    eps: Any                                 # a float, None, or a per-sample tuple
    alpha: float | None
    model: Any                               # the task option `model` (the llm table's first key), or None
    rest: tuple[tuple[str, Any], ...]        # (field, hashable value) of the other fields that vary among the runs

    def sort_key(self, table: str = "main") -> tuple:
        order = method_info(self.method).order
        eps = -1.0 if self.eps is None else float(np.mean(self.eps))
        alpha = math.inf if self.alpha is None else self.alpha
        rest = tuple(_order(v) for _, v in self.rest)
        if table == "ablation":   # ERM first; then per eps: FL (alpha = inf), RFL by decreasing alpha, CSERM
            return (order != 0, eps, order, -alpha if self.method != "fl" else -math.inf, rest)
        if table == "llm":
            return (_order(self.model), order, eps, alpha, rest)
        return (order, eps, alpha, rest)


def group_by_config(runs: Sequence[RunRecord]) -> dict[ConfigKey, list[RunRecord]]:
    """The runs by configuration (seeds together), in no order. Besides method, ε and α, only fields that take
    several values among the runs that use them (e.g. a swept lr) split groups; values are compared as they are
    stored, never as they print (lr 0.011 and 0.012 are two configurations)."""
    fixed = ("seed", "method", "eps", "alpha", *NOT_IDENTITY)
    configs = {r.id: with_later_defaults(r.config) for r in runs}
    values_of: dict[str, set[Hashable]] = {}
    for cfg in configs.values():
        for name, v in cfg.items():
            if name not in fixed and v is not None:
                values_of.setdefault(name, set()).add(_hashable(v))
    split_by = sorted(name for name, vs in values_of.items() if len(vs) > 1)
    groups: dict[ConfigKey, list[RunRecord]] = {}
    for r in runs:
        cfg = configs[r.id]
        key = ConfigKey(r.method, _hashable(cfg.get("eps")), cfg.get("alpha"),
                        (cfg.get("options") or {}).get("model"),
                        tuple((name, _hashable(cfg.get(name))) for name in split_by))
        groups.setdefault(key, []).append(r)
    return groups


def row_labels(keys: Sequence[ConfigKey], table: str = "main") -> tuple[list[str], dict[ConfigKey, list[str]]]:
    """The key columns of a table and each configuration's texts in them. Each column's values are written with
    ``distinct_texts``, so two different configurations never share a label."""
    eps = distinct_texts(k.eps for k in keys)
    alpha = distinct_texts(k.alpha for k in keys)
    fields = [name for name, _ in keys[0].rest] if keys else []
    rest = {name: distinct_texts(dict(k.rest)[name] for k in keys) for name in fields}
    out: dict[ConfigKey, list[str]] = {}
    for k in keys:
        label = method_info(k.method).label
        if table == "ablation":
            row = [eps[k.eps], label, "∞" if k.method == "fl" else alpha[k.alpha]]
        elif table == "llm":
            row = [str(k.model or "—"), label, eps[k.eps], alpha[k.alpha]]
        else:
            row = [label, eps[k.eps], alpha[k.alpha]]
        if fields:
            row.append(", ".join(f"{name}={rest[name][v]}" for name, v in k.rest))
        out[k] = row
    names = {"ablation": ["ε", "Method", "α"], "llm": ["Model", "Method", "ε", "α"]}.get(table, ["Method", "ε", "α"])
    return names + (["Config"] if fields else []), out


def _run_value(v: Any) -> str:
    """A run's field as a CSV cell: numbers in full (pandas reads them as numbers), empty when not read."""
    if v is None:
        return ""
    if isinstance(v, (list, tuple)):
        return "per-sample"
    return repr(v) if isinstance(v, float) else str(v)


def _runs_table(runs: list[RunRecord], columns: list[str],
                value: Callable[[RunRecord, str], float | None]) -> Table:
    """One row per run: its id, task, method, every identity field of RunConfig (fields a method or a switched-off
    option does not read are empty), every task option, then the metric columns."""
    fields = [name for name, f in FIELDS.items() if f.identity and name != "method"]
    options = sorted({k for r in runs for k in (r.config.get("options") or {})})
    table = Table("Runs", ["run", "task", "method", *fields, *(f"options.{k}" for k in options)], columns,
                  per_run=True)

    def used(r: RunRecord) -> dict[str, Any]:
        cfg = with_later_defaults(r.config)
        for switch, (off, dependent) in SWITCHED_FIELDS.items():
            if cfg.get(switch) == off:     # e.g. the nuPI gains of a gd run: checked, reset, never read
                cfg.update(dict.fromkeys(dependent))
        return cfg

    rows = []
    for r in runs:
        cfg, opts = used(r), r.config.get("options") or {}
        order = (r.task, method_info(r.method).order, tuple(_order(_hashable(cfg.get(f))) for f in fields if f != "seed"),
                 r.seed, r.id)
        rows.append((order, [r.id, r.task, r.method, *(_run_value(cfg.get(f)) for f in fields),
                             *(_run_value(opts.get(k)) for k in options)],
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


def build(name: str, runs: list[RunRecord], columns: Sequence[str] | None = None,
          value: Callable[[RunRecord, str], float | None] | None = None) -> Table:
    """Group finished runs into the named table. ``value(run, column)`` reads a column (default: summary)."""
    if name not in TABLES:
        raise ConfigError(f"unknown table {name!r}; choose one of: {', '.join(TABLES)}")
    if name != "runs":   # a row per run stands alone; grouped rows compete for "best" within one task only
        one_task(runs)
    value = value or (lambda run, col: run.metrics.get(col))
    classification = any(r.metrics.get("train.accuracy") is not None for r in runs)
    if columns is None:
        if name == "runs":
            columns = [f"{s}.{m}" for s in SPLITS for m in SUMMARY if any(f"{s}.{m}" in r.metrics for r in runs)]
        else:
            per_split = ["avg_loss", "max_loss"] + (["accuracy"] if classification and name == "main" else [])
            columns = [f"{s}.{m}" for s in SPLITS for m in per_split]
    for c in columns:
        check_column(c)
    columns = list(columns)
    if name == "runs":
        return _runs_table(runs, columns, value)

    groups = group_by_config(runs)
    title = {"ablation": "α ablation (FL is RFL with α = ∞)", "llm": "Preference optimization"}.get(name,
                                                                                                  "Final performance")
    keys = sorted(groups, key=lambda k: k.sort_key(name))
    names, labels = row_labels(keys, name)
    table = Table(title, names, columns)
    expected = max(len(g) for g in groups.values())
    seeds = []
    for k in keys:
        group = groups[k]
        done = [r for r in group if r.status == "completed"]
        cells = []
        for c in columns:
            mean, std = aggregate([value(r, c) for r in done])
            cells.append(Cell(mean, std, len(done), flagged=len(done) < expected))
        table.rows.append((labels[k], cells))
        seeds.append((labels[k], len(done), len(group), sum(r.status == "diverged" for r in group)))
    table.notes += _short_notes(seeds, expected)
    return table


def _num(v: float | None, digits: int = 2) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def _varying_keys(table: Table) -> Table:
    """The runs table without the key columns that hold one value in every row: a terminal cannot show all of
    RunConfig's fields beside the metrics (CSV keeps them all)."""
    keep = [j for j in range(len(table.keys)) if j < 3 or len({keys[j] for keys, _ in table.rows}) > 1]
    return dataclasses.replace(table, keys=[table.keys[j] for j in keep],
                               rows=[([keys[j] for j in keep], cells) for keys, cells in table.rows])


def render(table: Table, fmt: str, digits: int = 2) -> str:
    """The table as text in one of FORMATS ('rich' renders to plain text of rich's table)."""
    if fmt not in FORMATS:
        raise ConfigError(f"unknown format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    if fmt == "csv":
        out = io.StringIO()
        w = csv.writer(out, lineterminator="\n")
        stats = ("",) if table.per_run else ("", ".std", ".n")
        w.writerow(table.keys + [f"{c}{s}" for c in table.columns for s in stats])
        for key, cells in table.rows:
            w.writerow(key + [x for c in cells for x in ("" if c.mean is None else repr(c.mean),
                                                           "" if c.std is None else repr(c.std), c.n)[:len(stats)]])
        return out.getvalue()
    if table.per_run:
        table = _varying_keys(table)
    best = table.best(digits)

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
