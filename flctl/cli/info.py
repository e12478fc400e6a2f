"""`flctl tasks` and `flctl methods`: what can be run, with the paper defaults."""

from __future__ import annotations

from typing import Any

from rich.markup import escape

from flctl.cli.common import console
from flctl.cli.output import JSON_OPT, print_json


def _problems(clashes: tuple[str, ...] = ()) -> None:
    """Plugins that did not load and task names defined twice: one line each, on stderr, after what did load (a
    problem said already as it was met, e.g. an FLCTL_TASKS entry that is not there, is not said again)."""
    from flctl.cli.common import err_console as err
    from flctl.plugins import problems

    for line in [*problems(unsaid=True), *clashes]:
        err.print(f"[yellow]warning:[/yellow] {escape(line)}", soft_wrap=True)


def tasks(as_json: JSON_OPT = False) -> None:
    """List the tasks (flctl's own and plugins': see docs/extending.md) with their paper defaults and options. A
    task name defined twice is listed and flagged (a command that uses it refuses it); the others are usable."""
    from flctl.tasks import listing

    rows: list[dict[str, Any]] = [
        {"name": t.name, "kind": t.kind, "description": t.description, "methods": list(t.supported_methods),
         "defaults": dict(t.defaults), "method_defaults": {m: dict(d) for m, d in t.method_defaults.items()},
         "options": dict(t.options), "device_options": {d: dict(o) for d, o in t.device_options.items()},
         "source": item.sources[0].provenance() | {"where": item.sources[0].where()},
         "clash": item.clash, "defined_by": [s.where() for s in item.sources]}
        for item in listing() for t in (item.task,)]
    clashes = tuple(r["clash"] for r in rows if r["clash"])
    if as_json:
        print_json(rows)
        _problems(clashes)
        return
    from rich.table import Table

    table = Table("task", "from", "kind", "description", "defaults", "options (-o KEY=VALUE)")
    for column in table.columns[3:]:     # a narrow terminal folds a long value; it never cuts one to "weight_decay=0…"
        column.overflow = "fold"

    def pairs(values: dict) -> str:
        return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())

    for r in rows:
        if r["clash"]:          # flagged where the eye is: its name, every definition, and the refusal
            table.add_row(f"{escape(r['name'])} [bold red](clash)[/]",
                          escape(" | ".join(r["defined_by"])), r["kind"], f"[red]{escape(r['clash'])}[/red]", "", "")
            continue
        table.add_row(escape(r["name"]), escape(r["source"]["where"]), r["kind"], escape(r["description"]),
                      pairs(r["defaults"]) + "".join(f"; {m}: {pairs(d)}" for m, d in r["method_defaults"].items()),
                      pairs(r["options"]) + "".join(f"; on {d}: {pairs(o)}" for d, o in r["device_options"].items()))
    console.print(table)
    _problems(clashes)


def methods(as_json: JSON_OPT = False) -> None:
    """List the methods and the update rule each one applies."""
    from flctl.method_info import METHOD_FIELDS, METHOD_INFO, method_source

    rows: list[dict[str, Any]] = [{"name": m.name, "label": m.label, "rule": m.rule, **{f"uses_{k}": k in m.reads for k in METHOD_FIELDS},
             "from": method_source(m.name).where()}
            for m in sorted(METHOD_INFO.values(), key=lambda m: m.order)]
    if as_json:
        print_json(rows)
        _problems()
        return
    from rich.table import Table

    table = Table("method", "from", "update", "ε", "α", "dual lr")
    for r in rows:
        table.add_row(r["name"], escape(r["from"]), escape(r["rule"]),
                      *("✓" if r[f"uses_{k}"] else "" for k in METHOD_FIELDS))
    console.print(table)
    _problems()
