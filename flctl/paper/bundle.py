"""`flctl paper`'s bundle: every table and figure of the paper from the finished runs, with the paper's numbers beside
ours, as one folder a reader opens from disk.

    index.html        one self-contained page (figures embedded as PNG data, tables as HTML, a contents list, the
                      provenance as a list; no script, no request leaves the file)
    tables/*.tex      booktabs: each table as the page shows it, ours beside the paper's, in the page's row order
    figures/*.png|pdf as `flctl report --plot ...` draws them
    paper.json        every number shown, with the run ids behind it
    paper.csv         the tables' numbers flat, one line per table, row, column and source (ours or the paper's):
                      `pandas.read_csv` reads it in one call

Our numbers are those of `flctl report` for the same runs (flctl.report.flow.build_table, flctl.report.plots.figure).
The folder is written beside ``out`` and swapped in whole: a failure leaves the previous bundle as it was.
The page around the items is flctl.paper.page's; paper.csv is written by flctl.paper.flat_csv.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flctl.errors import ConfigError
from flctl.fs import refuses_files
from flctl.method_info import method_info
from flctl.paper.flat_csv import flat_csv
from flctl.paper.page import escape as _e
from flctl.paper.page import page
from flctl.paper.programme import tolerance
from flctl.report.groups_of_runs import number
from flctl.status import Status

if TYPE_CHECKING:
    from flctl.paper.plan import ItemPlan, Programme
    from flctl.paper.programme import Published
    from flctl.report.tables import BesideRow, Cell, Table


def _mean_std(cell: Cell, digits: int) -> str:
    if cell.mean is None:
        return "—"
    return number(cell.mean, digits) + (f" ± {number(cell.std, digits)}" if cell.std is not None and cell.n > 1 else "")


def _paper_printed(value: tuple[float, float | None, str] | None) -> tuple[str, str | None] | None:
    """A published value and its spread as the paper prints them (the spread with the value's decimals)."""
    if value is None:
        return None
    _, std, printed = value
    return printed, (f"{std:.{len(printed.split('.')[-1])}f}" if std is not None else None)


def _paper_text(value: tuple[float, float | None, str] | None) -> str:
    shown = _paper_printed(value)
    if shown is None:
        return "—"
    return shown[0] + (f" ± {shown[1]}" if shown[1] is not None else "")


def _row_label(method: str, eps: float | None, alpha: float | None, model: Any) -> str:
    parts = [str(model).split("/")[-1]] if model else []
    parts.append(method_info(method).label)
    parts += [f"ε={eps:g}"] if eps is not None else []
    parts += [f"α={alpha:g}"] if alpha is not None else ([] if method != "fl" else ["α=∞"])
    return " ".join(parts)


def _hours(h: float | None, device: str) -> str:
    from flctl.cost import format_cost

    if h is None:
        return f"no finished run on {device} to estimate the cost from"
    return f"≈ {format_cost(h, device)}"


class _Bundle:
    def __init__(self, programme: Programme, records_root: Path, folder: Path, others: dict[str, int]) -> None:
        self.p, self.records_root, self.folder, self.others = programme, records_root, folder, others

    # ------------------------------------------------------------ tables

    def table(self, plan: ItemPlan) -> tuple[str, dict[str, Any]]:
        from flctl.fs import write_text_atomic
        from flctl.report.flow import build_table
        from flctl.report.render import latex_beside

        item = plan.item
        runs = [self.p.runs[i] for i in sorted(plan.finished)]
        built: Table | None = build_table(item.table, runs, self.records_root, list(item.columns)) if runs else None
        cols = list(item.columns)
        paper = "paper" if item.stands_in is None else f"paper, Table {item.stands_in}"   # another data set's numbers
        head = ("<tr><th rowspan=2>Row</th><th rowspan=2>seeds</th>"
                + "".join(f"<th colspan=2>{_e(c)}</th>" for c in cols) + "</tr><tr>"
                + f"<th>ours</th><th>{_e(paper)}</th>" * len(cols) + "</tr>")
        body, rows_json, beside, used = [], [], [], set()
        groups = self._groups(built, runs)
        for row in plan.rows:
            found = next((j for j, k in enumerate(built.configs if built else [])
                          if j not in used and row.matches(k.method, k.eps, k.alpha, k.model)), None)
            if found is not None:
                used.add(found)
            html_row, data, side = self._row(plan, row, built, found, groups)
            body.append(html_row)
            rows_json.append(data)
            beside.append(side)
        for j in range(len(built.configs) if built else 0):      # ours that the paper does not report
            if j not in used:
                html_row, data, side = self._row(plan, None, built, j, groups)
                body.append(html_row)
                rows_json.append(data)
                beside.append(side)
        notes = list(built.notes if built else [])
        if plan.no_data:
            notes.append(f"no data here: {plan.no_data}")
        # The LaTeX table is the page's: the same rows in the same order, ours beside the paper's, under the table's
        # own title and the paper's caption.
        caption = item.title + (f". The paper's caption: {item.caption}" if item.caption else ".")
        caption += " Ours: mean ± standard deviation over the seeds finished."
        write_text_atomic(self.folder / "tables" / f"{item.name}.tex",
                          latex_beside(caption, cols, beside, notes, item.digits, paper))
        # A wide table (six columns of ours and the paper's) scrolls in its own box; the page never scrolls sideways.
        text = (f"<div class=wide><table>{head}{''.join(body)}</table></div>"
                + "".join(f"<p class=note>{_e(n)}</p>" for n in notes)
                + f"<p>LaTeX: <code>tables/{item.name}.tex</code></p>")
        return text, {"rows": rows_json, "notes": notes, "columns": cols, "paper_table": item.number}

    def _groups(self, built: Table | None, runs: list) -> list[list[str]]:
        """The run ids behind each row of ``built`` (the same grouping the table made)."""
        if built is None:
            return []
        from flctl.report.groups_of_runs import group_by_config

        groups = group_by_config(runs)
        return [sorted(r.id for r in groups[k]) for k in built.configs]

    def _row(self, plan: ItemPlan, row: Published | None, built: Table | None, j: int | None,
             groups: list[list[str]]) -> tuple[str, dict[str, Any], BesideRow]:
        from flctl.report.tables import BesideRow

        item, cols = plan.item, list(plan.item.columns)
        k, cells = (built.configs[j], built.rows[j][1]) if j is not None and built is not None else (None, None)
        # The paper's row names it as the paper does (ε = 0.51); a row of ours alone by its own values.
        label = (_row_label(row.method, row.eps, row.alpha, row.model) if row is not None else
                 _row_label(k.method, k.eps, k.alpha, k.model) if k is not None else "")
        planned = [c for c in plan.cells.values()
                   if (row.matches(c.method, c.eps, c.alpha, c.opts.get("model")) if row is not None else
                       k is not None and (c.method, c.eps, c.alpha) == (k.method, k.eps, k.alpha))]
        to_do = [c for c in planned if c.run_id not in plan.finished]
        data: dict[str, Any] = {"label": label, "paper": None, "ours": None, "outside": [],
                                "runs": groups[j] if j is not None else [], "cells": len(planned),
                                "cells_to_do": len(to_do)}
        if row is not None:
            data["keys"] = {"method": row.method, "eps": row.eps, "alpha": row.alpha, "model": row.model}
            data["paper"] = {c: {"value": row.values[c][0], "std": row.values[c][1]} for c in cols if c in row.values}
        elif k is not None:
            data["keys"] = {"method": k.method, "eps": k.eps, "alpha": k.alpha, "model": k.model}
        paper = [_paper_printed(row.values.get(c)) if row is not None else None for c in cols]
        seeds = "" if cells is None else f"{cells[0].n}" + (f"/{len(planned)}" if len(planned) > cells[0].n else "")
        tds = [f"<td class=k>{_e(label)}</td><td>{_e(seeds)}</td>"]
        if cells is None:        # a published row we have no finished run of: say why, beside the paper's values
            assert row is not None
            why = ("no data here (see below)" if plan.no_data else
                   f"not run: {len(to_do)} cell(s) to do, {_hours(plan.hours(to_do), self.p.device)}" if to_do else
                   "not run: no cell of the programme makes this row")
            tds += [f"<td class=todo>{_e(why) if n == 0 else '—'}</td><td class=paper>{_e(_paper_text(row.values.get(c)))}"
                    "</td>" for n, c in enumerate(cols)]
            data["status"] = "no data" if plan.no_data else "not run"
            return ("<tr>" + "".join(tds) + "</tr>", data,
                    BesideRow(label, data["status"], [None] * len(cols), paper, [False] * len(cols)))
        data["ours"] = {c: {"mean": cell.mean, "std": cell.std, "n": cell.n} for c, cell in zip(cols, cells)}
        data["status"] = Status.DIVERGED if cells[0].n == 0 else "partial" if to_do else "done"
        for c, cell in zip(cols, cells):
            value = row.values.get(c) if row is not None else None
            off = (value is not None and cell.mean is not None and self.p.scale == "paper" and item.stands_in is None
                   and abs(cell.mean - value[0]) > tolerance(value[2], value[1], cell.std))
            if off:
                data["outside"].append(c)
            tip = (f' title="outside the tolerance of {tolerance(value[2], value[1], cell.std):.3g}"' if off and value
                   else "")
            tds.append(f"<td class='ours{' off' if off else ''}'{tip}>{_e(_mean_std(cell, item.digits))}"
                       f"{'†' if cell.flagged else ''}</td><td class=paper>{_e(_paper_text(value))}</td>")
        shown = f"{seeds} (diverged)" if data["status"] == Status.DIVERGED else seeds
        return ("<tr>" + "".join(tds) + "</tr>", data,
                BesideRow(label, shown, list(cells), paper, [c in data["outside"] for c in cols]))

    # ------------------------------------------------------------ figures

    def figure(self, plan: ItemPlan) -> tuple[str, dict[str, Any]]:
        from flctl.report.plots import figure, save

        item = plan.item
        runs = [self.p.runs[i] for i in sorted(plan.finished)]
        parts, files = [], []
        if not runs:
            to_do = plan.to_do
            why = (f"no data here: {plan.no_data}" if plan.no_data else
                   f"not run: {len(to_do)} cell(s) to do, {_hours(plan.hours(to_do), self.p.device)}")
            return f"<p class=note>{_e(why)}</p>", {"status": "no data" if plan.no_data else "not run",
                                                    "files": [], "runs": [], "cells_to_do": len(to_do)}
        for kind, split in item.panels:
            stem = f"{item.name}-{kind}" + (f"-{split}" if split else "")
            try:
                import matplotlib.pyplot as plt

                fig = figure(kind, runs, self.records_root, split=split)
                paths = save(fig, self.folder / "figures" / stem)
                plt.close(fig)
            except ConfigError as exc:
                parts.append(f"<p class=note>{_e(kind)}{' ' + _e(split) if split else ''}: {_e(exc)}</p>")
                continue
            png = paths[0].read_bytes()
            files += [f"figures/{p.name}" for p in paths]
            parts.append(f"<figure><img alt='{_e(stem)}' src='data:image/png;base64,"
                         f"{base64.b64encode(png).decode()}'><figcaption>{_e(kind)}"
                         f"{' · ' + _e(split) if split else ''} · <code>figures/{_e(stem)}.pdf</code></figcaption>"
                         "</figure>")
        to_do = plan.to_do
        if to_do:
            parts.append(f"<p class=note>partial: {len(plan.finished)} of {len(plan.cells)} cells finished; "
                         f"{len(to_do)} to do, {_e(_hours(plan.hours(to_do), self.p.device))}</p>")
        return "".join(parts), {"status": "partial" if to_do else "done", "files": files,
                                "runs": [r.id for r in runs], "cells_to_do": len(to_do)}


def check_out(out: Path, root: Path) -> Path:
    """``out`` as the bundle's folder, absolute; ConfigError, before anything is written, where writing the bundle
    would replace what is not an earlier bundle: the bundle replaces its folder whole, so ``out`` must be new, empty
    or a bundle (its paper.json), and neither the results folder ``root`` nor a folder holding it."""
    out, root = Path(out).absolute(), Path(root).absolute()
    folder = next(p for p in (out, *out.parents) if p.exists())
    if folder != out and not folder.is_dir():
        raise ConfigError(f"--out {str(out)!r} lies under {str(folder)!r}, which is a file")
    resolved, results = out.resolve(), root.resolve()
    if resolved == results or resolved in results.parents:
        what = "the results folder" if resolved == results else "a folder holding the results folder"
        raise ConfigError(f"--out {str(out)!r} is {what}: the bundle replaces its folder whole; give a folder of its "
                          "own (default RESULTS/paper)")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {str(out)!r} is a file; give a folder for the bundle")
    if out.is_dir() and any(out.iterdir()) and not (out / "paper.json").is_file():
        raise ConfigError(f"--out {str(out)!r} holds files that are not a paper bundle (no paper.json): the bundle "
                          "replaces its folder whole; give a new folder, or an earlier bundle's")
    # Written beside ``out``, renamed over it: the nearest folder above it, and ``out`` where it exists, take a file
    for folder in ([out] if out.is_dir() else []) + [next(p for p in out.parents if p.exists())]:
        if (why := refuses_files(folder)) is not None:
            raise ConfigError(f"--out {str(out)!r}: cannot write in {str(folder)!r} ({why})")
    return out


# What write_bundle writes in a bundle's folder: the rest of an earlier bundle's folder is someone else's
BUNDLE_NAMES = frozenset({"index.html", "paper.json", "paper.csv", "tables", "figures"})


def write_bundle(programme: Programme, records_root: Path, out: Path, provenance: dict[str, Any],
                 others: dict[str, int] | None = None) -> Path:
    """Render every item of ``programme`` into the folder ``out`` (replaced whole: new, empty or an earlier bundle,
    check_out); returns its index.html."""
    import matplotlib

    from flctl.report.plots.common import STYLE

    out = Path(out).absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    (tmp / "tables").mkdir(parents=True)
    (tmp / "figures").mkdir()
    try:
        bundle = _Bundle(programme, records_root, tmp, others or {})
        sections, items = [], []
        with matplotlib.rc_context(STYLE):
            for plan in programme.items:
                item = plan.item
                body, data = bundle.table(plan) if item.kind == "table" else bundle.figure(plan)
                other = (others or {}).get(item.ref)
                if other:
                    body += (f"<p class=note>{other} finished run(s) of this {item.kind} at another scale are in the "
                             "database: shown in their own bundle, never averaged in here.</p>")
                sweeps = sorted({s for n in item.all_specs() if (s := programme.sweep_of(n))})
                head = (f"<h2 id='{item.name}'>{_e(item.title)}</h2><p class=legend>{len(plan.finished)} of "
                        f"{len(plan.cells)} cells finished · specs {_e(', '.join(f'sweeps/{n}.toml' for n in item.all_specs()))}"
                        f" · sweeps {_e(', '.join(sweeps) or '—')}</p>")
                sections.append(head + body)
                items.append({"ref": item.ref, "title": item.title, "kind": item.kind, "specs": list(item.all_specs()),
                              "sweeps": sweeps, "cells": len(plan.cells), "finished": len(plan.finished), **data})
        runs = [programme.runs[i] for p in programme.items for i in p.finished]
        provenance = {**provenance, "scale": programme.scale,
                      "devices": dict(Counter(r.device or "?" for r in runs)),
                      # how they trained, not with whom: a grouped run's "cells" (its group's ids) would count each
                      # group apart
                      "trained_with": dict(Counter(", ".join(f"{k} {v}" for k, v in sorted(r.trained_with.items())
                                                             if k != "cells")
                                                   for r in runs if r.trained_with))}
        (tmp / "index.html").write_text(page(programme, sections, provenance), encoding="utf-8")
        (tmp / "paper.json").write_text(json.dumps({"provenance": provenance, "items": items}, indent=1,
                                                   allow_nan=False, default=str), encoding="utf-8")
        (tmp / "paper.csv").write_text(flat_csv(items), encoding="utf-8")
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        if out.exists():
            os.replace(out, old)
        os.replace(tmp, out)
        for foreign in (old.iterdir() if old.exists() else ()):     # someone's notes move in, never deleted
            if foreign.name not in BUNDLE_NAMES and not (out / foreign.name).exists():
                os.replace(foreign, out / foreign.name)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out / "index.html"


