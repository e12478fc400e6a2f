"""`flctl paper`: the paper's whole programme in one command: plan with its cost, launch what is missing, and one
browsable bundle of every table and figure with the paper's own numbers beside ours."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from flctl.cli.common import (
    DbOption,
    ResultsDirOption,
    console,
    err_console,
    fail,
    launch_options,
    make_folder,
    open_results,
    results_folder,
    safe,
    said_launched,
)
from flctl.launch.settings import LaunchFlags
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
    from flctl.paper.flow import plan_paper

    folder = results_folder(results_dir, db)
    root, url = folder.root, folder.url
    try:
        if dry_run and report_only:
            raise ConfigError("give --dry-run or --report-only, not both")
        plan = plan_paper(url=url, specs=specs, launch=launch, only=only, scale=scale, device=device,
                          data_dir=data_dir, check_data=not (dry_run or report_only))
        plan.bundle_folder(root, out)           # what the bundle would replace: refused in a dry run too
    except ConfigError as exc:
        fail(str(exc))
    if dry_run:
        make_folder(folder, dry=True)              # what the real command would refuse, a dry run refuses too
        _print_plan(plan.programme)
        console.print("nothing was written")
        return
    # reading the database only needs a folder to write the bundle into; launching needs the database (a bad --db:
    # one line, before the plan and with nothing made)
    make_folder(folder) if report_only else open_results(folder)
    _fill(plan, folder, out=out, wait=wait, report_only=report_only)


def _fill(plan, folder, *, out: Path | None, wait: bool, report_only: bool) -> None:
    """Launch the programme's missing cells and write its bundle (flctl.paper.flow.fill_paper), saying how it went:
    a signal's stop (its exit code), the specs whose data is not here, the bundle, the failed cells' errors."""
    from flctl.cli.ledger import error_summary, ledger_lines, watch
    from flctl.errors import ConfigError, PartlyDone
    from flctl.launch.wait import SweepStopped
    from flctl.paper.flow import Hooks, fill_paper

    url, root = folder.url, folder.root

    def here(worker, sid: str) -> int | None:
        with ledger_lines(url, sid):
            return worker()

    hooks = Hooks(plan=_print_plan, launched=functools.partial(said_launched, root=root), here=here,
                  wait=lambda store, sid, root, take_over=False: watch(store, sid, until_done=True, root=root,
                                                                    take_over=take_over),
                  warn=lambda line: err_console.print(f"[yellow]warning:[/yellow] {escape(line)}", soft_wrap=True))
    try:
        done = fill_paper(plan, folder, out=out, wait=wait, report_only=report_only, hooks=hooks)
    except ConfigError as exc:
        fail(str(exc))
    except PartlyDone as exc:           # bad input met after cells trained: they stay recorded
        fail(str(exc), code=exc.exit_code)
    except SweepStopped as exc:         # its database or results folder moved while a sweep of it trained
        fail(str(exc), code=exc.exit_code)
    if done.stopped is not None:
        console.print(f"[yellow]stopped[/]: `flctl cancel {done.stopped_in}` stops the other workers; `flctl paper` "
                      "again resumes")
        raise typer.Exit(done.stopped)
    if done.lacking:
        console.print(f"[yellow]not launched[/], their data is not here: {safe(', '.join(done.lacking))} (see the "
                      "plan; --data-dir)")
    if not report_only and done.launched == 0:
        console.print("every cell the programme can run here is done: nothing to launch")
    console.print(f"wrote {safe(done.bundle)} ({done.bundle_s:.1f} s); open it in a browser")
    error_summary(*done.ledgers)     # the bundle is written first: it shows what did finish


def _print_plan(programme) -> None:
    from rich.table import Table

    from flctl.cost import format_cost

    table = Table("", "specs", "cells", "done", "to do", f"cost on {programme.device}", "note",
                  title=f"the paper's programme at the {programme.scale} scale")
    table.columns[-1].overflow = "fold"       # a skipped spec's reason whole, wrapped: never cut at the table's edge
    total_todo, total_hours, unknown, low, high = 0, 0.0, 0, 0.0, 0.0
    sources: dict[str, int] = {}            # benchmark file -> cells priced from it
    unknown_tasks: set[str] = set()
    unpriced: list = []                     # the cells counted unknown, each once
    for p in programme.items:
        to_do = p.to_do
        hours = p.hours(to_do) if to_do else 0.0
        note = ("no data here: " + p.no_data) if p.no_data else ("unknown: no run or benchmark of its task here"
                                                                 if to_do and hours is None else
                                                                 "from " + p.cost.source if p.cost and p.cost.source
                                                                 else "")
        table.add_row(p.item.ref, safe(", ".join(p.item.all_specs())), str(len(p.cells)), str(len(p.finished)),
                      str(len(to_do)), "—" if hours is None else format_cost(hours, programme.device), safe(note))
    # Items share cells (Tables 1 and 5 are one sweep): the totals count each cell once, priced with the first item
    # that has it, as one launch (the processes' start-up once for its cells, not once a cell)
    seen: set[str] = set()
    for p in programme.items:
        new = [c for c in p.to_do if c.run_id not in seen]
        seen.update(c.run_id for c in new)
        if not new:
            continue
        h = p.hours(new)
        total_todo += len(new)
        if h is None:
            unknown += len(new)
            unknown_tasks.update(c.task for c in new)
            unpriced += new
            continue
        total_hours += h
        spread = p.cost.spread if p.cost is not None else 1.0
        low, high = low + h / spread, high + h * spread
        if p.cost is not None and p.cost.source is not None:
            sources[p.cost.source] = sources.get(p.cost.source, 0) + len(new)
    console.print(table)
    device = programme.device
    if unknown == total_todo and total_todo:        # nothing to estimate from: no "about 0 s"
        console.print(f"{total_todo} cell(s) to do; cost unknown: their tasks ({safe(', '.join(sorted(unknown_tasks)))}"
                      f") have no finished run on {device} here and no committed benchmark on {device}")
        _priced_on_a_gpu(unpriced)
        return
    priced = total_todo - unknown
    about = (f"about {format_cost(total_hours, device)} (expected within {format_cost(low, device)} to "
             f"{format_cost(high, device)})")
    line = (f"{total_todo} cell(s) to do, {about}" if priced == total_todo else
            f"{total_todo} cell(s) to do; the {priced} priced take {about}")
    if sources:
        line += "; " + ", ".join(f"{n} of them from {safe(s)} (another machine)" for s, n in sources.items())
    if unknown:
        line += (f"; {unknown} cell(s) unknown: no run or benchmark on {device} of "
                 f"{safe(', '.join(sorted(unknown_tasks)))}")
    console.print(line)
    _priced_on_a_gpu(unpriced)


def _priced_on_a_gpu(unpriced: list) -> None:
    """Where cells planned on a CPU are unknown but a committed GPU benchmark has their task (the paper's GPU tables
    and figures, planned here without a GPU): the line that says `--device cuda` prices them from it."""
    from flctl.cost import on_a_gpu

    if not unpriced or unpriced[0].device.startswith("cuda"):
        return
    by_task: dict[str, list] = {}
    for cell in unpriced:
        by_task.setdefault(cell.task, []).append(cell)
    sources = {task: found.source for task, cells in by_task.items()
               if (found := on_a_gpu(cells[:1])) is not None and found.source is not None}
    if sources:
        cells = sum(len(by_task[t]) for t in sources)
        console.print(f"the {cells} cell(s) of {safe(', '.join(sorted(sources)))} have a committed GPU benchmark "
                      f"({safe(', '.join(sorted(set(sources.values()))))}): `flctl paper --dry-run --device cuda` "
                      "(with the same --only and --scale) prices them on a GPU")
