"""The bundle's page around its items (flctl.paper.bundle): index.html's style, title, legend, contents and
provenance, and the escaping of every text it shows. One self-contained file: no script, no request leaves it."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flctl.paper.plan import Programme

CSS = """
body{font:15px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1200px;padding:1em 2em;color:#222;
overflow-wrap:break-word}
.wide{overflow-x:auto;max-width:100%}
h1{font-size:1.6em}h2{margin-top:2em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:.5em 0;font-variant-numeric:tabular-nums}
th,td{padding:.25em .6em;border-bottom:1px solid #e4e4e4;text-align:right;white-space:nowrap}
th{background:#f4f4f4}td.k{text-align:left}td.paper{color:#666}
td.off{background:#fde2e1}td.todo{color:#8a6d00;text-align:left;background:#fff8e1;white-space:normal;min-width:8em}
dl.meta{display:grid;grid-template-columns:max-content minmax(0,1fr);gap:.2em 1.2em}
dl.meta dt{font-weight:600}dl.meta dd{margin:0;min-width:0}dl.meta ul{margin:0;padding-left:1.2em}
.note{color:#8a6d00}.smoke{background:#fff3cd;padding:.6em;border:1px solid #e0c36a}
img{max-width:100%;border:1px solid #eee}.legend{color:#555;font-size:.9em}
nav ol{columns:2}code{background:#f4f4f4;padding:0 .2em}
"""


def escape(text: object) -> str:
    """``text`` as HTML shows it."""
    return html.escape(str(text))


# The provenance's fields as the page names them (a field without a name here shows its key).
PROVENANCE = {"flctl": "flctl version", "commit": "flctl commit", "torch": "torch version", "command": "command",
              "made": "written at", "database": "database", "scale": "scale",
              "devices": "finished runs by device", "trained_with": "finished runs by how they trained"}


def _provenance(provenance: dict[str, Any]) -> str:
    """The provenance as a definition list a person reads (paper.json keeps it for machines)."""
    def value(v: Any) -> str:
        if isinstance(v, dict):
            if not v:
                return "none"
            return "<ul>" + "".join(f"<li>{escape(k)}: {value(x)}</li>" for k, x in v.items()) + "</ul>"
        if isinstance(v, list | tuple):
            return ", ".join(value(x) for x in v) if v else "none"
        return "—" if v is None else escape(v)

    return ("<dl class=meta>" + "".join(f"<dt>{escape(PROVENANCE.get(k, k.replace('_', ' ')))}</dt><dd>{value(v)}</dd>"
                                        for k, v in provenance.items()) + "</dl>")


def page(programme: Programme, sections: list[str], provenance: dict[str, Any]) -> str:
    """index.html: the items' ``sections`` (each its heading and body) under the title, the smoke scale's warning, the
    legend and the contents, then the ``provenance``."""
    contents = "".join(f"<li><a href='#{p.item.name}'>{escape(p.item.title)}</a> "
                       f"({len(p.finished)}/{len(p.cells)})</li>" for p in programme.items)
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
            f"<h2 id=provenance>Provenance</h2>{_provenance(provenance)}</body></html>\n")
