"""`flctl tasks` and `flctl methods`: what can be run, with the paper defaults."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from flctl.cli.common import console

JSON_OPT = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def tasks(as_json: JSON_OPT = False) -> None:
    """List the tasks with their paper defaults and options."""
    from flctl.tasks import all_tasks

    rows: list[dict[str, Any]] = [{"name": t.name, "kind": t.kind, "description": t.description, "methods": list(t.supported_methods),
             "defaults": dict(t.defaults), "method_defaults": {m: dict(d) for m, d in t.method_defaults.items()},
             "options": dict(t.options)} for t in all_tasks().values()]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    from rich.table import Table

    table = Table("task", "kind", "description", "defaults", "options (-o KEY=VALUE)")
    for r in rows:
        table.add_row(r["name"], r["kind"], r["description"],
                      ", ".join(f"{k}={v}" for k, v in r["defaults"].items())
                      + "".join(f"; {m}: " + ", ".join(f"{k}={v}" for k, v in d.items())
                                for m, d in r["method_defaults"].items()),
                      ", ".join(f"{k}={v}" for k, v in r["options"].items()))
    console.print(table)


def methods(as_json: JSON_OPT = False) -> None:
    """List the methods and the update rule each one applies."""
    from flctl.method_info import METHOD_FIELDS, METHOD_INFO

    rows: list[dict[str, Any]] = [{"name": m.name, "label": m.label, "rule": m.rule, **{f"uses_{k}": k in m.reads for k in METHOD_FIELDS}}
            for m in sorted(METHOD_INFO.values(), key=lambda m: m.order)]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    from rich.table import Table

    table = Table("method", "update", "ε", "α", "dual lr")
    for r in rows:
        table.add_row(r["name"], r["rule"], *("✓" if r[f"uses_{k}"] else "" for k in METHOD_FIELDS))
    console.print(table)
