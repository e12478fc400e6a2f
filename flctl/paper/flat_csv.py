"""The bundle's paper.csv: the tables' numbers flat, one line per table, row, column and source (ours or the
paper's), so that `pandas.read_csv` reads it in one call."""

from __future__ import annotations

import csv
import io
from typing import Any

CSV_COLUMNS = ("table", "paper_table", "position", "row", "model", "method", "eps", "alpha", "column", "source",
               "value", "std", "seeds", "status", "outside", "runs")


def flat_csv(items: list[dict[str, Any]]) -> str:
    """paper.csv: a line per table, row (``position``: its place on the page, 1 first), column and source (``ours``:
    mean, std and seeds over the finished runs, or empty; ``paper``: the published value and spread of the paper's
    table ``paper_table``). ``outside``: ours lies outside the tolerance of the paper's value (always False for the
    paper's lines); ``runs``: the run ids behind ours, space-separated. Empty cells are missing values."""
    def cell(v: Any) -> str:
        return "" if v is None else repr(v) if isinstance(v, float) else str(v)

    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for it in items:
        if it["kind"] != "table":
            continue
        paper_table = it["paper_table"]
        for position, row in enumerate(it["rows"], 1):
            keys = row.get("keys") or {}
            head = [it["ref"], paper_table, position, row["label"], keys.get("model"), keys.get("method"),
                    keys.get("eps"), keys.get("alpha")]
            for c in it["columns"]:
                ours = (row["ours"] or {}).get(c) or {}
                paper = (row["paper"] or {}).get(c) or {}
                w.writerow(map(cell, [*head, c, "ours", ours.get("mean"), ours.get("std"), ours.get("n"),
                                      row["status"], c in row["outside"], " ".join(row["runs"])]))
                w.writerow(map(cell, [*head, c, "paper", paper.get("value"), paper.get("std"), None, row["status"],
                                      False, ""]))
    return out.getvalue()
