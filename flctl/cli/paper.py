"""`flctl paper`: the paper's whole programme in one command: plan with its cost, launch what is missing, and one
browsable bundle of every table and figure with the paper's own numbers beside ours."""

from __future__ import annotations

import dataclasses
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from flctl.cli.common import (
    DbOption,
    ResultsDirOption,
    console,
    db_url,
    ensure_writable,
    err_console,
    fail,
    launch_options,
    open_results,
    open_store,
    results_root,
    safe,
)
from flctl.config import resolve_device
from flctl.launch.settings import LaunchFlags, LaunchSettings
from flctl.sweep import SHIPPED_SPECS

SPECS = SHIPPED_SPECS


@launch_options
def paper(
    only: Annotated[Optional[str], typer.Option(help="Train only these tables and figures, e.g. table:1,figure:6 (or "
                                                "table, figure); the bundle still shows every finished one, but with "
                                                "--report-only these alone.")] = None,
    scale: Annotated[str, typer.Option(help="paper (the specs as written) or smoke (one seed, two epochs, 256 samples "
                                       "of each split, small models, one worker per sweep unless --workers: the "
                                       "whole path in minutes).")] = "paper",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan and its cost; write nothing.")] = False,
    report_only: Annotated[bool, typer.Option("--report-only", help="Write the bundle from what is finished; plan "
                                              "and launch nothing.")] = False,
    wait: Annotated[bool, typer.Option(help="Slurm: wait until every cell is done, then write the bundle (local and "
                                       "debug executors always run the sweeps in turn, in the foreground).")] = False,
    out: Annotated[Optional[Path], typer.Option(help="Bundle folder [RESULTS/paper, or RESULTS/paper-smoke].")] = None,
    specs: Annotated[Path, typer.Option(help="The folder of the paper's specs.")] = SPECS,
    device: Annotated[Optional[str], typer.Option(help="cpu, cuda, cuda:N or auto for every cell [the specs': cpu].")]
    = None,
    data_dir: Annotated[Optional[str], typer.Option("--data-dir", help="Existing copy of the datasets for every "
                                                    "spec.")] = None,
    db: DbOption = None,
    results_dir: ResultsDirOption = None,
    *,
    launch: LaunchFlags,
) -> None:
    """The paper's programme: every table and figure with the spec that serves it, its cells and the device-hours
    still to spend; then launch the missing cells (as `flctl sweep` does) and write one bundle (index.html,
    tables/*.tex, figures/*.pdf|png, paper.json) with the paper's numbers beside ours. Re-running fills only what is
    missing."""
    from flctl.errors import ConfigError
    from flctl.paper import plan_programme, stored_runs, tasks_of
    from flctl.programme import SCALES, select

    if dry_run and report_only:
        fail("give --dry-run or --report-only, not both")
    root = results_root(results_dir)
    url = db_url(db, root)
    try:
        if scale not in SCALES:
            raise ConfigError(f"unknown scale {scale!r}; choose one of: {', '.join(SCALES)}")
        items = select(only)
        if scale == "smoke" and launch.workers is None:
            # A smoke cell trains in about a second; a worker's new interpreter spends ~5 s of CPU importing torch
            # and scikit-learn before it takes one, and the default W (cores // threads) starts W - 1 of them for
            # each spec in turn: 2 cores, 17 -> 12 core-s for the whole programme.
            launch = dataclasses.replace(launch, workers=1)
        settings = LaunchSettings.resolve({}, launch)
        if device is not None:
            device = resolve_device(device, here=settings.launcher.runs_here, planning=dry_run)
        runs = stored_runs(url, tasks_of(specs, items))
        together = settings.cells_per_device(device or "cpu")
        # A dry run plans without looking at the data (as `flctl sweep --dry-run`: a cluster's programme can be
        # planned on a laptop, and checking imports each task's data stack); so does a bundle of what is finished.
        programme = plan_programme(specs, items, scale=scale, device=device, data_dir=data_dir, runs=runs,
                                   together=together, check_data=not (dry_run or report_only))
    except ConfigError as exc:
        fail(str(exc))
    if dry_run:
        _print_plan(programme)
        console.print("nothing was written")
        return
    out = out if out is not None else root / ("paper" if scale == "paper" else f"paper-{scale}")
    settled: list[dict] = []
    if report_only:          # reads the database only: nothing to open for writing
        root = ensure_writable(root)
    else:
        _, root = open_results(url, root)       # a bad --db: one line, before the plan and with nothing made
        _print_plan(programme)
        settled = _launch(programme, launch, url, root, wait)
        runs = stored_runs(url, tasks_of(specs, items))
        programme = plan_programme(specs, items, scale=scale, device=device, data_dir=data_dir, runs=runs,
                                   together=together)
    if only is not None and not report_only:
        # --only chose what trains; the bundle keeps every table and figure finished so far (where --specs holds
        # their specs: a folder of some of them bundles what it has)
        try:
            every = select(None)
            runs = stored_runs(url, tasks_of(specs, every))
            programme = plan_programme(specs, every, scale=scale, device=device, data_dir=data_dir, runs=runs,
                                       together=together, check_data=False)
            items = every
        except ConfigError:
            pass
    _write(programme, specs, items, root, url, out, runs)
    from flctl.cli.ledger import error_summary

    error_summary(*settled)     # the bundle is written first: it shows what did finish


def _print_plan(programme) -> None:
    from rich.table import Table

    from flctl.sweep import format_cost

    table = Table("", "specs", "cells", "done", "to do", f"cost on {programme.device}", "note",
                  title=f"the paper's programme at the {programme.scale} scale")
    total_todo, total_hours, unknown = 0, 0.0, 0
    for p in programme.items:
        to_do = p.to_do
        hours = p.hours(to_do) if to_do else 0.0
        note = ("no data here: " + p.no_data) if p.no_data else ("no history yet" if to_do and hours is None else "")
        table.add_row(p.item.ref, safe(", ".join(p.item.all_specs())), str(len(p.cells)), str(len(p.finished)),
                      str(len(to_do)), "—" if hours is None else format_cost(hours, programme.device), safe(note[:90]))
    # Items share cells (Tables 1 and 5 are one sweep): the totals count each cell once.
    seen: dict[str, object] = {}
    for p in programme.items:
        for c in p.to_do:
            if c.run_id not in seen:
                seen[c.run_id] = p
                h = p.hours([c])
                total_todo += 1
                if h is None:
                    unknown += 1
                else:
                    total_hours += h
    console.print(table)
    console.print(f"{total_todo} cell(s) to do, about {format_cost(total_hours, programme.device)}"
                  + (f" (+ {unknown} cell(s) of tasks with no finished run on {programme.device} to estimate from)"
                     if unknown else ""))


def _launch(programme, flags: LaunchFlags, url: str, root: Path, wait: bool) -> list[dict]:
    """Launch each spec's missing cells as `flctl sweep --spec` would; the local and debug executors run the sweeps
    one after another in this process (one machine's cores), Slurm submits them all (and waits with --wait).
    Returns the ledgers of the sweeps waited for."""
    from flctl.cli.ledger import watch
    from flctl.cli.sweep import _launch as launch_sweep
    from flctl.errors import ConfigError
    from flctl.launch import plan_sweep
    from flctl.paper import launch_programme
    from flctl.sweep import sweep_id

    store = open_store(url, root)
    submitted: list[str] = []
    settled: dict[str, dict] = {}

    def launch(sp, cells) -> None:
        try:
            planned = plan_sweep(sp.spec, flags, results_root=root, allow_large=True)
        except ConfigError as exc:
            fail(f"sweeps/{sp.name}.toml: {exc}")
        wanted = {c.run_id for c in cells}
        configs = [c for c in planned.configs if c.run_id in wanted]
        sid = sweep_id(planned.spec, configs)
        foreground = planned.settings.launcher.runs_here
        launched = launch_sweep(store, url, root, sid, planned.spec, configs, planned.settings, join=foreground)
        if launched.here is not None and (stopped := _here(launched.here, url, sid)) is not None:
            console.print(f"[yellow]stopped[/]: `flctl cancel {sid}` stops the other workers; `flctl paper` again "
                          "resumes")
            raise typer.Exit(stopped)
        if foreground:
            settled[sid] = watch(store, sid, until_done=True, root=root)
        submitted.append(sid)

    n = launch_programme(programme, launch)
    lacking = sorted(name for name, sp in programme.specs.items() if sp.no_data and programme.cells_to_do(name))
    if lacking:
        console.print(f"[yellow]not launched[/], their data is not here: {safe(', '.join(lacking))} (see the plan; "
                      "--data-dir)")
    if n == 0:
        console.print("every cell the programme can run here is done: nothing to launch")
    elif wait:
        for sid in submitted:
            settled[sid] = watch(store, sid, until_done=True, root=root)
    store.close()
    return list(settled.values())


def _here(here, url: str, sid: str) -> int | None:
    from flctl.cli.ledger import ledger_lines

    with ledger_lines(url, sid):
        return here()


def _write(programme, specs: Path, items, root: Path, url: str, out: Path, runs) -> None:
    import importlib.metadata as md

    from flctl.layout import Layout
    from flctl.paper import plan_programme
    from flctl.programme import SCALES
    from flctl.report.bundle import write_bundle
    from flctl.text import redact
    from flctl.versions import git_revision

    def version(name: str) -> str:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return "not installed"

    # Finished runs of the same tables at the other scales: counted on the page, never averaged in.
    others: dict[str, int] = {}
    for scale in SCALES:
        if scale != programme.scale:
            other = plan_programme(specs, items, scale=scale, device=None, data_dir=None, runs=runs, check_data=False)
            for p in other.items:
                if p.finished:
                    others[p.item.ref] = others.get(p.item.ref, 0) + len(p.finished)
    provenance = {"flctl": version("flctl"), "commit": git_revision() or "unknown", "torch": version("torch"),
                  "command": " ".join(["flctl", *sys.argv[1:]]), "made": datetime.now(UTC).isoformat(
                      timespec="seconds"), "database": redact(url)}
    from flctl.report.tables import mixed_code_notes

    for plan in programme.items:
        for note in mixed_code_notes([programme.runs[i] for i in plan.finished]):
            err_console.print(f"[yellow]warning:[/yellow] {plan.item.ref}: {escape(note)}", soft_wrap=True)
    t0 = time.perf_counter()
    index = write_bundle(programme, Layout(root).records, out, provenance, others)
    console.print(f"wrote {safe(index)} ({time.perf_counter() - t0:.1f} s); open it in a browser")
