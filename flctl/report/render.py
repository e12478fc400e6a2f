"""Rendering a report table (flctl.report.tables builds it): what a ``Table`` is, and ``render(table, fmt)`` as rich,
markdown, LaTeX (booktabs, the ± part grey as in the paper) or CSV, the best value of each column bold, a cell with
fewer seeds flagged (†); ``latex_beside``, a table beside the paper's numbers (the paper's bundle). Every format a
report table is written in is written here."""

from __future__ import annotations

import csv
import dataclasses
import io
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from flctl.errors import ConfigError
from flctl.report import FORMATS
from flctl.report.groups_of_runs import number

if TYPE_CHECKING:
    from flctl.report.groups_of_runs import ConfigKey

HIGHER_IS_BETTER = ("accuracy",)


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
    # The configuration of each row (grouped tables; empty for the runs table), in the rows' order.
    configs: list[ConfigKey] = field(default_factory=list)

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


def _varying_keys(table: Table) -> Table:
    """The runs table without the key columns that hold one value in every row: a terminal cannot show all of
    RunConfig's fields beside the metrics (CSV keeps them all)."""
    keep = [j for j in range(len(table.keys)) if j < 3 or len({keys[j] for keys, _ in table.rows}) > 1]
    return dataclasses.replace(table, keys=[table.keys[j] for j in keep],
                               rows=[([keys[j] for j in keep], cells) for keys, cells in table.rows])


RICH_WIDTH = 200      # the terminal table's width (rich squeezes columns past it into "ta…")
FIRST_SHOWN = ("avg_loss", "max_loss", "accuracy")     # the runs table's metrics a narrow terminal keeps first
FIRST_FIELDS = ("eps", "alpha", "lr", "dual_lr", "seed")  # and its fields


def _fit_width(table: Table, digits: int) -> Table:
    """The runs table with as many columns as fit RICH_WIDTH: run, task and method, then avg/max loss and accuracy,
    then the other varying fields, then the other metrics; a note names what is left out (CSV and Markdown keep
    every column)."""
    def width(name: str, texts: list[str]) -> int:     # a column's header or widest value, and rich's padding
        return max([len(name), *map(len, texts)]) + 3
    keys = [(width(k, [row[j] for row, _ in table.rows]), ("key", j)) for j, k in enumerate(table.keys)]
    metrics = [(width(c, [number(cells[j].mean, digits) for _, cells in table.rows]), ("metric", j))
               for j, c in enumerate(table.columns)]
    main = [m for m in metrics if table.columns[m[1][1]].partition(".")[2] in FIRST_SHOWN]
    # among the fields, first those the paper's tables are about
    fields = sorted(keys[3:], key=lambda k: FIRST_FIELDS.index(table.keys[k[1][1]])
                    if table.keys[k[1][1]] in FIRST_FIELDS else len(FIRST_FIELDS))
    order = keys[:3] + main + fields + [m for m in metrics if m not in main]
    shown: set[tuple[str, int]] = set()
    used = 1                                            # the table's left border
    for w, col in order:
        if used + w > RICH_WIDTH and len(shown) >= 3:
            continue          # a narrower column further down the order may still fit
        used += w
        shown.add(col)
    if len(shown) == len(order):
        return table
    key_j = [j for j in range(len(table.keys)) if ("key", j) in shown]
    col_j = [j for j in range(len(table.columns)) if ("metric", j) in shown]
    left = [table.keys[j] for j in range(len(table.keys)) if j not in key_j] + \
        [table.columns[j] for j in range(len(table.columns)) if j not in col_j]
    named = ", ".join(left[:8]) + (", …" if len(left) > 8 else "")
    return dataclasses.replace(
        table, keys=[table.keys[j] for j in key_j], columns=[table.columns[j] for j in col_j],
        rows=[([k[j] for j in key_j], [cells[j] for j in col_j]) for k, cells in table.rows],
        notes=[*table.notes, f"{len(left)} more column(s) do not fit here ({named}): name the metrics with "
                             "--columns, or see every column with --format csv or markdown"])


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
        if fmt == "rich":
            table = _fit_width(table, digits)
    best = table.best(digits)

    def cell_text(c: Cell, is_best: bool, bold: Callable[[str], str], pm: Callable[[str], str]) -> str:
        text = bold(number(c.mean, digits)) if is_best else number(c.mean, digits)
        if c.std is not None and c.n > 1:
            text += pm(number(c.std, digits))
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
        esc = latex_text
        lines = [r"\begin{table}[t]", r"\centering", rf"\caption{{{esc(table.title)}}}",
                 r"\begin{tabular}{" + "l" * len(table.keys) + "c" * len(table.columns) + "}", r"\toprule",
                 " & ".join(esc(k) for k in table.keys + table.columns) + r" \\", r"\midrule"]
        for i, (key, cells) in enumerate(table.rows):
            texts = [esc(cell_text(c, i in best[j], lambda s: rf"\textbf{{{s}}}",
                                   lambda s: rf" {{\color{{gray}}\scriptsize $\pm$ {s}}}"))
                     for j, c in enumerate(cells)]
            lines.append(" & ".join([esc(k) for k in key] + texts) + r" \\")
        lines += [r"\bottomrule", r"\end{tabular}"]
        lines += _latex_notes(table.notes) + [r"\end{table}"]
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
    console = Console(record=True, width=RICH_WIDTH, file=io.StringIO(), emoji=False)
    console.print(rt)
    for n in table.notes:
        console.print(f"[yellow]{literal(n)}[/]")
    return console.export_text(styles=False)


def latex_text(s: str) -> str:
    """Text of a table (keys, column names, notes) as LaTeX: its specials escaped, its Greek and marks as math."""
    return (s.replace("_", r"\_").replace("%", r"\%").replace("ε", r"$\epsilon$")
            .replace("α", r"$\alpha$").replace("∞", r"$\infty$").replace("±", r"$\pm$").replace("—", "--")
            .replace("†", r"$^\dagger$").replace("&", r"\&").replace("#", r"\#"))


def _latex_notes(notes: Sequence[str]) -> list[str]:
    out = []
    for n in notes:      # a note's `command` is code: typewriter, not LaTeX's quote marks
        note = re.sub(r"`([^`]*)`", r"\\texttt{\1}", latex_text(n))
        out.append(rf"\\[2pt]{{\footnotesize {note}}}")
    return out


@dataclass(frozen=True)
class BesideRow:
    """A row of a table shown beside the paper's (``latex_beside``): its label, its seeds (or why it has no value),
    our cell of each column (None: no finished run), the paper's value and spread as printed (None: not published)
    and whether ours lies outside the tolerance of the paper's."""

    label: str
    seeds: str
    ours: list[Cell | None]
    paper: list[tuple[str, str | None] | None]
    outside: list[bool]


def latex_beside(title: str, columns: Sequence[str], rows: Sequence[BesideRow], notes: Sequence[str],
                 digits: int = 2, paper: str = "paper") -> str:
    """A table with the paper's numbers beside ours (booktabs, the ± part grey as in the paper), rows in the order
    given: each column a pair of sub-columns, ours and ``paper`` (the heading of the published values). A value of
    ours outside the tolerance of the paper's is starred."""
    def pm(std: str) -> str:
        return rf" {{\color{{gray}}\scriptsize $\pm$ {std}}}"

    def ours(c: Cell | None, off: bool) -> str:
        if c is None or c.mean is None:
            return "--"
        text = number(c.mean, digits) + (pm(number(c.std, digits)) if c.std is not None and c.n > 1 else "")
        return text + (r"$^\dagger$" if c.flagged else "") + ("$^*$" if off else "")

    def published(v: tuple[str, str | None] | None) -> str:
        return "--" if v is None else latex_text(v[0]) + (pm(latex_text(v[1])) if v[1] is not None else "")

    n = len(columns)
    lines = [r"\begin{table}[t]", r"\centering", rf"\caption{{{latex_text(title)}}}",
             r"\begin{tabular}{ll" + "rr" * n + "}", r"\toprule",
             " & ".join(["Row", "seeds", *(rf"\multicolumn{{2}}{{c}}{{{latex_text(c)}}}" for c in columns)]) + r" \\",
             " ".join(rf"\cmidrule(lr){{{3 + 2 * j}-{4 + 2 * j}}}" for j in range(n)),
             " & ".join(["", "", *(["ours", latex_text(paper)] * n)]) + r" \\", r"\midrule"]
    for r in rows:
        cells = [x for j in range(n) for x in (ours(r.ours[j], r.outside[j]), published(r.paper[j]))]
        lines.append(" & ".join([latex_text(r.label), latex_text(r.seeds), *cells]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    if any(any(r.outside) for r in rows):
        notes = [*notes, f"* outside the tolerance of the {paper}'s value"]
    lines += _latex_notes(notes) + [r"\end{table}"]
    return "\n".join(lines) + "\n"


