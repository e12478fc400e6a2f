"""`flctl paper`'s bundle: every table and figure of the paper from the finished runs, with the paper's numbers beside
ours, as one folder a reader opens from disk.

    index.html        one self-contained page (figures embedded as PNG data, tables as HTML, a contents list; no
                      script, no request leaves the file)
    tables/*.tex      booktabs, as `flctl report --table ... --format latex` writes them
    figures/*.png|pdf as `flctl report --plot ...` draws them
    paper.json        every number shown, with the run ids behind it

Our numbers are those of `flctl report` for the same runs (flctl.report.tables.build, flctl.report.plots.figure).
The folder is written beside ``out`` and swapped in whole: a failure leaves the previous bundle as it was.
"""

from __future__ import annotations

import base64
import html
import json
import os
import shutil
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flctl.errors import ConfigError
from flctl.method_info import method_info
from flctl.programme import tolerance
from flctl.report.groups_of_runs import number
from flctl.status import Status

if TYPE_CHECKING:
    from flctl.paper import ItemPlan, Programme
    from flctl.programme import Published
    from flctl.report.tables import Cell, Table

CSS = """
body{font:15px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1200px;padding:1em 2em;color:#222}
h1{font-size:1.6em}h2{margin-top:2em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:.5em 0;font-variant-numeric:tabular-nums}
th,td{padding:.25em .6em;border-bottom:1px solid #e4e4e4;text-align:right;white-space:nowrap}
th{background:#f4f4f4}td.k{text-align:left}td.paper{color:#666}
td.off{background:#fde2e1}td.todo{color:#8a6d00;text-align:left;background:#fff8e1;white-space:normal;min-width:8em}
.meta td{text-align:left}.note{color:#8a6d00}.smoke{background:#fff3cd;padding:.6em;border:1px solid #e0c36a}
img{max-width:100%;border:1px solid #eee}.legend{color:#555;font-size:.9em}
nav ol{columns:2}code{background:#f4f4f4;padding:0 .2em}
"""


def _e(text: object) -> str:
    return html.escape(str(text))


def _mean_std(cell: Cell, digits: int) -> str:
    if cell.mean is None:
        return "—"
    return number(cell.mean, digits) + (f" ± {number(cell.std, digits)}" if cell.std is not None and cell.n > 1 else "")


def _paper_text(value: tuple[float, float | None, str] | None) -> str:
    if value is None:
        return "—"
    v, std, printed = value
    return printed + (f" ± {std:.{len(printed.split('.')[-1])}f}" if std is not None else "")


def _row_label(method: str, eps: float | None, alpha: float | None, model: Any) -> str:
    parts = [str(model).split("/")[-1]] if model else []
    parts.append(method_info(method).label)
    parts += [f"ε={eps:g}"] if eps is not None else []
    parts += [f"α={alpha:g}"] if alpha is not None else ([] if method != "fl" else ["α=∞"])
    return " ".join(parts)


def _hours(h: float | None, device: str) -> str:
    if h is None:
        return "no history to estimate the device-hours"
    return f"≈ {h:.3g} {device}-hours" if h >= 0.1 else f"≈ {max(h * 60, 1):.0f} {device}-minute(s)"


class _Bundle:
    def __init__(self, programme: Programme, records_root: Path, folder: Path, others: dict[str, int]) -> None:
        self.p, self.records_root, self.folder, self.others = programme, records_root, folder, others

    # ------------------------------------------------------------ tables

    def table(self, plan: ItemPlan) -> tuple[str, dict[str, Any]]:
        from flctl.report.tables import build, render

        item = plan.item
        runs = [self.p.runs[i] for i in sorted(plan.finished)]
        built: Table | None = build(item.table, runs, list(item.columns)) if runs else None
        if built is not None:
            from flctl.fs import write_text_atomic

            write_text_atomic(self.folder / "tables" / f"{item.name}.tex", render(built, "latex", item.digits))
        cols = list(item.columns)
        paper = "paper" if item.stands_in is None else f"paper, Table {item.stands_in}"   # another data set's numbers
        head = ("<tr><th rowspan=2>Row</th><th rowspan=2>seeds</th>"
                + "".join(f"<th colspan=2>{_e(c)}</th>" for c in cols) + "</tr><tr>"
                + f"<th>ours</th><th>{_e(paper)}</th>" * len(cols) + "</tr>")
        body, rows_json, used = [], [], set()
        groups = self._groups(built, runs)
        for row in plan.rows:
            found = next((j for j, k in enumerate(built.configs if built else [])
                          if j not in used and row.matches(k.method, k.eps, k.alpha, k.model)), None)
            if found is not None:
                used.add(found)
            html_row, data = self._row(plan, row, built, found, groups)
            body.append(html_row)
            rows_json.append(data)
        for j in range(len(built.configs) if built else 0):      # ours that the paper does not report
            if j not in used:
                html_row, data = self._row(plan, None, built, j, groups)
                body.append(html_row)
                rows_json.append(data)
        notes = list(built.notes if built else [])
        if plan.no_data:
            notes.append(f"no data here: {plan.no_data}")
        text = (f"<table>{head}{''.join(body)}</table>"
                + "".join(f"<p class=note>{_e(n)}</p>" for n in notes)
                + (f"<p>LaTeX: <code>tables/{item.name}.tex</code></p>" if built else ""))
        return text, {"rows": rows_json, "notes": notes, "columns": cols}

    def _groups(self, built: Table | None, runs: list) -> list[list[str]]:
        """The run ids behind each row of ``built`` (the same grouping the table made)."""
        if built is None:
            return []
        from flctl.report.groups_of_runs import group_by_config

        groups = group_by_config(runs)
        return [sorted(r.id for r in groups[k]) for k in built.configs]

    def _row(self, plan: ItemPlan, row: Published | None, built: Table | None, j: int | None,
             groups: list[list[str]]) -> tuple[str, dict[str, Any]]:
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
            return "<tr>" + "".join(tds) + "</tr>", data
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
        return "<tr>" + "".join(tds) + "</tr>", data

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


def write_bundle(programme: Programme, records_root: Path, out: Path, provenance: dict[str, Any],
                 others: dict[str, int] | None = None) -> Path:
    """Render every item of ``programme`` into the folder ``out`` (replaced whole); returns its index.html."""
    import matplotlib

    from flctl.report.plots.common import STYLE

    out = Path(out)
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
                      "trained_with": dict(Counter(", ".join(f"{k} {v}" for k, v in sorted(r.trained_with.items()))
                                                   for r in runs if r.trained_with))}
        (tmp / "index.html").write_text(_page(programme, sections, provenance), encoding="utf-8")
        (tmp / "paper.json").write_text(json.dumps({"provenance": provenance, "items": items}, indent=1,
                                                   allow_nan=False, default=str), encoding="utf-8")
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        if out.exists():
            os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out / "index.html"


def _page(programme: Programme, sections: list[str], provenance: dict[str, Any]) -> str:
    contents = "".join(f"<li><a href='#{p.item.name}'>{_e(p.item.title)}</a> "
                       f"({len(p.finished)}/{len(p.cells)})</li>" for p in programme.items)
    meta = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v if isinstance(v, str) else json.dumps(v, default=str))}</td></tr>"
                   for k, v in provenance.items())
    smoke = ("<p class=smoke>Smoke scale: one seed, two epochs, 256 samples of each split and the tasks' small "
             "models. These numbers check the path from plan to page; they are not comparable with the paper's, "
             "and no cell is marked against them.</p>" if programme.scale != "paper" else "")
    legend = ("<p class=legend>Ours: mean ± sample standard deviation over the seeds finished (the seeds column: "
              "finished/planned where some are missing; † fewer seeds than the other rows). Paper: the published value "
              "(± its spread where it gives one). A red cell lies outside the tolerance: twice the larger standard "
              "deviation (the paper's or ours) and at least the rounding of the printed value; where the paper gives "
              "no spread, 10 % of its value plus 0.01. A stand-in (ours on another data set, beside a published "
              "table) shows the paper's numbers for orientation only: none of its cells is marked.</p>")
    return ("<!doctype html><html lang=en><head><meta charset=utf-8><title>Feasible Learning: the paper's tables "
            f"and figures</title><style>{CSS}</style></head><body><h1>Feasible Learning: the paper's tables and "
            "figures, ours beside the published</h1><p>Ramirez, Hounie, Elenter, Gallego-Posada, Hashemizadeh, "
            f"Ribeiro and Lacoste-Julien, <i>Feasible Learning</i>, AISTATS 2025.</p>{smoke}{legend}"
            f"<nav><h2>Contents</h2><ol>{contents}</ol></nav>{''.join(sections)}"
            f"<h2 id=provenance>Provenance</h2><table class=meta>{meta}</table></body></html>\n")
