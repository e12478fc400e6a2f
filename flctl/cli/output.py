"""What the read commands (tasks, methods, runs, show, sweeps, ledger, verify, cancel) print for programs: ``--json``
(JSON_OPT) and its one form (print_json). What a person reads instead is each command's own table."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

JSON_OPT = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def print_json(data: Any) -> None:
    """``data`` on stdout as JSON, indented, anything JSON has no form for (a date, a path) as its text: what every
    read command's ``--json`` prints, on its own (progress and warnings go to stderr)."""
    print(json.dumps(data, indent=2, default=str))
