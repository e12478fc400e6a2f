"""`flctl report`: the paper's tables, figures and cross-run per-sample queries from the database + records."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from flctl.cli.common import (
    DbOption,
    ResultsDirOption,
    complete_from,
    console,
    err_console,
    existing_store,
    fail,
    results_folder,
    safe,
)
from flctl.cli.completion import complete_sweep, complete_task
from flctl.method_info import METHOD_INFO
from flctl.report import FORMATS, listed
from flctl.report.plot_specs import PLOT_SPECS, QUERY_SPECS
from flctl.report.table_specs import TABLE_SPECS, by_tables

SELECT_PANEL = "Which runs"
PLOTS, QUERIES = tuple(PLOT_SPECS), tuple(QUERY_SPECS)


def _table_help() -> str:
    """--table's help: every registered table, and which take --by."""
    by = "".join(f" ({name}: with --by)" for name in by_tables())
    return f"{listed(tuple(TABLE_SPECS))}{by}."


def report(
    table: Annotated[Optional[str], typer.Option(help=_table_help(), autocompletion=complete_from(TABLE_SPECS))] = None,
    plot: Annotated[Optional[str], typer.Option(help=f"{listed(PLOTS)}.", autocompletion=complete_from(PLOTS))] = None,
    by: Annotated[Optional[str], typer.Option(help=f"{listed(by_tables())} table: the attribute, e.g. race or gender "
                                                   "(utkface).")] = None,
    samples: Annotated[Optional[str], typer.Option(help=f"Per-sample query: {listed(QUERIES)}.",
                                                                               autocompletion=complete_from(QUERIES))] = None,
    sweep: Annotated[Optional[str], typer.Option(help="Sweep id, prefix or name.", rich_help_panel=SELECT_PANEL,
                                                              autocompletion=complete_sweep)] = None,
    task: Annotated[Optional[str], typer.Option(help="Only runs of this task.", rich_help_panel=SELECT_PANEL,
                                                             autocompletion=complete_task)] = None,
    fmt: Annotated[Optional[str], typer.Option("--format", help=f"Table format: {listed(FORMATS)} [default: from "
                                               "--out's extension, .md, .tex or .csv; else rich].",
                                               autocompletion=complete_from(FORMATS))] = None,
    out: Annotated[Optional[Path], typer.Option(help="Write to this file (plots: a path stem; .png and .pdf).")] = None,
    columns: Annotated[Optional[str], typer.Option(help="Comma-separated columns, e.g. train.avg_loss,"
                                                   "test.max_loss,test.cvar@0.95,train.quantile@0.99,"
                                                   "train.violation_rate.")] = None,
    split: Annotated[Optional[str], typer.Option(help="train or test (plots and sample queries).")] = None,
    k: Annotated[int, typer.Option(help="top-multipliers: how many samples.")] = 16,
    min_seeds: Annotated[int, typer.Option("--min-seeds", help="violators: in at least this many seeds.")] = 1,
    eps: Annotated[Optional[float], typer.Option(help="violators: level to test (default: each run's ε).")] = None,
    methods: Annotated[Optional[str], typer.Option(help="diff: two methods, e.g. erm,fl.",
                                                                      autocompletion=complete_from(METHOD_INFO, listed=True))] = None,
    top: Annotated[int, typer.Option(help="diff: how many samples per pair of configurations.")] = 20,
    digits: Annotated[int, typer.Option(help="Decimals in tables.")] = 2,
    db: DbOption = None,
    results_dir: ResultsDirOption = None,
) -> None:
    """Tables (mean ± std over seeds), figures (PNG + PDF) and per-sample queries over finished runs."""
    from functools import partial

    from flctl.db.reads import latest_sweeps
    from flctl.errors import ConfigError
    from flctl.report.flow import Request, make_report

    request = Request(table=table, plot=plot, samples=samples, by=by, sweep=sweep, task=task,
                      columns=None if columns is None else tuple(columns.split(",")), split=split, k=k,
                      min_seeds=min_seeds, eps=eps, methods=methods, top=top, digits=digits, fmt=fmt, out=out)
    try:
        request = request.check()          # before any database is read
    except ConfigError as exc:
        fail(str(exc))
    folder = results_folder(results_dir, db)
    store = existing_store(folder)
    try:
        made = make_report(store, folder.layout, request, partial(latest_sweeps, store))
    except ConfigError as exc:
        fail(str(exc))
    finally:
        store.close()
    _print_made(made, request)


def _print_made(made, request) -> None:
    """What `flctl report` made: its lines, a note on stderr when runs of several sweeps are shown together, then the
    table, the plot's files or the query's answer."""
    for line in made.said:
        console.print(safe(line))
    if made.mixed is not None:              # on stderr: `--format csv > f.csv` stays a CSV file
        err_console.print(f"note: {safe(made.mixed)}", highlight=False, soft_wrap=True)
    if request.table is not None:
        _print_table(made, request)
    elif request.plot is not None:
        console.print("wrote " + ", ".join(safe(p) for p in made.files))
    else:
        _print_query(made, request)


def _print_table(made, request) -> None:
    from flctl.text import printable

    if request.out is not None:
        console.print(f"wrote {safe(request.out)}")
    else:   # the file keeps the table's text as it is; the terminal gets it without control characters
        print("\n".join(printable(line) for line in made.text.split("\n")), end="")
    if request.out is not None or request.fmt == "csv":   # rich, markdown and LaTeX text carry the notes under it
        for note in made.notes:            # on stderr: `--format csv > f.csv` stays a CSV file
            err_console.print(f"[yellow]warning:[/] {safe(note)}", highlight=False)


def _print_query(made, request) -> None:
    from rich.table import Table

    for note in made.notes:
        err_console.print(f"[yellow]warning:[/] {safe(note)}", highlight=False)
    result, shown_rows = made.frame, 30
    title = (f"{request.samples}: {len(result)} rows"
             + (f", the first {shown_rows} shown" if len(result) > shown_rows else ""))
    shown = Table(*map(safe, result.column_names), title=title)
    for row in result.slice(0, shown_rows).to_pylist():
        shown.add_row(*(f"{v:.4g}" if isinstance(v, float) else safe(v) for v in row.values()))
    console.print(shown)
    console.print(f"wrote {safe(made.files[0])}" + (f" (all {len(result)} rows)" if len(result) > shown_rows else ""))
