"""`flctl report`: the paper's tables, figures and cross-run per-sample queries from the database + records."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Optional

import typer

from flctl.cli.common import (
    DbOption,
    ResultsDirOption,
    check_output,
    complete_from,
    complete_sweep,
    complete_task,
    console,
    err_console,
    existing_store,
    fail,
    results_root,
    safe,
)
from flctl.fs import atomic_path, write_text_atomic
from flctl.method_info import METHOD_INFO
from flctl.report import FORMAT_OF_SUFFIX, FORMATS, PLOTS, QUERIES, listed
from flctl.report.table_specs import TABLE_SPECS, table_spec

SELECT_PANEL = "Which runs"


def _by_tables() -> tuple[str, ...]:
    """The tables that take --by (a row per group of samples)."""
    return tuple(name for name, spec in TABLE_SPECS.items() if spec.by)


def _table_help() -> str:
    """--table's help: every registered table, and which take --by."""
    by = "".join(f" ({name}: with --by)" for name in _by_tables())
    return f"{listed(tuple(TABLE_SPECS))}{by}."


def report(
    table: Annotated[Optional[str], typer.Option(help=_table_help(), autocompletion=complete_from(TABLE_SPECS))] = None,
    plot: Annotated[Optional[str], typer.Option(help=f"{listed(PLOTS)}.", autocompletion=complete_from(PLOTS))] = None,
    by: Annotated[Optional[str], typer.Option(help=f"{listed(_by_tables())} table: the attribute, e.g. race or gender "
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
    from flctl.errors import ConfigError
    from flctl.layout import Layout
    from flctl.report import tables
    from flctl.report.data import select_runs

    if sum(x is not None for x in (table, plot, samples)) != 1:
        fail("give exactly one of --table, --plot or --samples")
    spec = TABLE_SPECS.get(table) if table is not None else None
    if table is not None and spec is None:
        try:
            table_spec(table)              # refuses an unknown name, listing the tables, before any database
        except ConfigError as exc:
            fail(str(exc))
    for kind, name, names in (("plot", plot, PLOTS), ("query", samples, QUERIES)):   # before any database is read
        if name is not None and name not in names:
            fail(f"unknown {kind} {name!r}; choose one of: {', '.join(names)}")
    if (spec is not None and spec.by) != (by is not None):
        fail(f"--table {table} needs --by ATTRIBUTE (e.g. race)" if by is None
             else f"--by applies to --table {listed(_by_tables())}")
    if split not in (None, "train", "test"):
        fail(f"--split must be train or test, got {split!r}")
    for flag, value, lo, hi in (("--digits", digits, 0, 12), ("--top", top, 1, None), ("--min-seeds", min_seeds, 1, None),
                                ("-k", k, 1, None)):
        if value < lo or (hi is not None and value > hi):
            fail(f"{flag} must be {'in ' + str(lo) + '..' + str(hi) if hi is not None else 'at least ' + str(lo)}, "
                 f"got {value}")
    if columns is not None and not [c for c in columns.split(",") if c.strip()]:
        fail("--columns is empty; give e.g. train.avg_loss,test.max_loss")
    if out is not None and plot is not None and out.is_dir():
        fail(f"--out {str(out)!r} is a directory; a plot's --out is a path stem (e.g. {str(out / plot)!r} writes "
             f"{plot}.png and {plot}.pdf in it)")
    if out is not None:
        check_output(out if plot is None else out.with_suffix(".png"))   # a plot's --out is a stem
    fmt = fmt or (FORMAT_OF_SUFFIX.get(out.suffix.lower(), "rich") if out is not None else "rich")
    root = results_root(results_dir)
    store = existing_store(db, root)
    try:
        if table is not None:
            spec = table_spec(table)       # refuses an unknown name, listing the tables
        if table is not None and fmt not in FORMATS:
            raise ConfigError(f"unknown format {fmt!r}; choose one of: {', '.join(FORMATS)}")
        if spec is not None and spec.task is not None and sweep is None and task is None:
            task = spec.task           # e.g. the preference-optimization table is of the LLM task's runs
        if plot == "heatmap" and sweep is None:
            sweep = _latest_lr_sweep(store, task)
        runs = select_runs(store, sweep=sweep, task=task)
        layout = Layout(root)
        records_root = layout.records
        if spec is not None:
            cols = [c.strip() for c in columns.split(",") if c.strip()] if columns else None
            for c in cols or []:
                tables.check_column(c)
            if spec.by:
                from flctl.report.groups import groups_table

                assert by is not None
                built = groups_table(runs, records_root, by, cols, spec)
            else:
                built = tables.build(spec, runs, cols, tables.record_values(runs, records_root, cols or []))
            _emit_table(dataclasses.replace(built, title=f"{built.title} ({_of(runs, sweep)})"), fmt, out, digits)
        elif plot is not None:
            from flctl.report.plots import plot as make_plot

            # named for what it shows: a plot of another task or sweep is another file, not this one overwritten
            stem = layout.plot(plot, sweep if sweep is not None else _of(runs, None))
            paths = make_plot(plot, runs, records_root, out or stem, split=split, k=k)
            console.print("wrote " + ", ".join(safe(p) for p in paths))
        else:
            assert samples is not None      # exactly one of table, plot, samples was checked above
            _samples(samples, runs, records_root, out or layout.samples(samples),
                     split=split, min_seeds=min_seeds, eps=eps, methods=methods, top=top)
    except ConfigError as exc:
        fail(str(exc))


def _of(runs, sweep: str | None) -> str:
    """What a report is of, for its title and a figure's file name: the sweep asked for, else its runs' tasks."""
    return f"sweep {sweep}" if sweep is not None else "-".join(sorted({r.task for r in runs})) or "no runs"


def _latest_lr_sweep(store, task: str | None) -> str:
    """The heatmap is of one lr x dual-lr grid: without --sweep, the latest sweep (of --task) that varies lr."""
    from flctl.errors import ConfigError

    for row in store.list_sweeps():   # newest first
        if task is not None and row["task"] != task:
            continue
        found = store.get_sweep(row["id"])
        if found is not None and len(found["spec"].get("axes", {}).get("lr", [])) > 1:
            console.print(f"heatmap of sweep {safe(row['id'])} ({safe(row['name'] or row['task'])}), the latest that "
                          "varies lr")
            return row["id"]
    raise ConfigError("the heatmap draws one lr x dual-lr sweep and none of the database's sweeps"
                      + (f" of {task}" if task else "") + " varies lr; run one (`flctl sweep TASK --lr 1e-4..1e-2 "
                      "--dual-lr 1e-3..1e-1`) or pass --sweep")


def _emit_table(built, fmt: str, out: Path | None, digits: int) -> None:
    from flctl.report.tables import render
    from flctl.text import printable

    text = render(built, fmt, digits)
    if out is not None:
        write_text_atomic(out, text)
        console.print(f"wrote {safe(out)}")
    else:   # the file keeps the table's text as it is; the terminal gets it without control characters
        print("\n".join(printable(line) for line in text.split("\n")), end="")
    if out is not None or fmt == "csv":   # rich, markdown and LaTeX text carry the notes under the table
        for note in built.notes:           # on stderr: `--format csv > f.csv` stays a CSV file
            err_console.print(f"[yellow]warning:[/] {safe(note)}", highlight=False)


def _samples(query: str, runs, records_root: Path, out: Path, *, split, min_seeds, eps, methods, top) -> None:
    import pyarrow.parquet as pq
    from rich.table import Table

    from flctl.errors import ConfigError
    from flctl.report import samples as sq

    if query == "violators":
        result = sq.violators(runs, records_root, split=split or "train", min_seeds=min_seeds, eps=eps)
    elif query == "diff":
        pair = tuple(m.strip() for m in (methods or "").split(",") if m.strip())
        if len(pair) != 2:
            raise ConfigError("--samples diff needs --methods A,B (two methods)")
        result = sq.diff(runs, records_root, pair, split=split or "test", top=top)
    else:
        raise ConfigError(f"unknown query {query!r}; choose one of: {', '.join(QUERIES)}")
    if query == "violators" and min_seeds > (most := sq.most_seeds(runs)):
        err_console.print(f"[yellow]warning:[/] --min-seeds {min_seeds}: no configuration has that many seeds (at "
                          f"most {most}), so no sample qualifies", highlight=False)
    with atomic_path(out) as tmp:
        pq.write_table(result, tmp)
    shown_rows = 30
    title = f"{query}: {len(result)} rows" + (f", the first {shown_rows} shown" if len(result) > shown_rows else "")
    shown = Table(*map(safe, result.column_names), title=title)
    for row in result.slice(0, shown_rows).to_pylist():
        shown.add_row(*(f"{v:.4g}" if isinstance(v, float) else safe(v) for v in row.values()))
    console.print(shown)
    console.print(f"wrote {safe(out)}" + (f" (all {len(result)} rows)" if len(result) > shown_rows else ""))
