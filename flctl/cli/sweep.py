"""`flctl sweep`: plan a grid and fill it idempotently (its ledger: flctl.cli.ledger)."""

from __future__ import annotations

import dataclasses
import functools
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from flctl.cli.common import (
    LAUNCH_PANEL,
    DbOption,
    ResultsDirOption,
    bad_input_exits_2,
    config_options,
    console,
    err_console,
    fail,
    gpu_sharing_line,
    launch_options,
    make_folder,
    open_results,
    parse_options,
    results_folder,
    safe,
    said_launched,
    with_model,
)
from flctl.cli.completion import complete_task
from flctl.cli.estimate import cost_line
from flctl.cli.ledger import cell_seconds, error_summary, failed_starts_line, ledger_lines, watch
from flctl.cli.run import plugin_hint
from flctl.config import AXIS_FIELDS
from flctl.launch.settings import LaunchFlags

AXES_PANEL = "Axes (lists 0,0.51 · log ranges 1e-4..1 or 1e-4..1:9)"
SWEEP_PANEL = "The sweep"       # what is swept and how it is checked: not axes


def _axis(help_text: str = ""):
    return typer.Option(help=help_text, rich_help_panel=AXES_PANEL)


@config_options(AXES_PANEL)
@launch_options
def sweep(
    task: Annotated[Optional[str], typer.Argument(metavar="TASK", help="Task name (or give --spec).",
                                                  autocompletion=complete_task)] = None,
    spec: Annotated[Optional[Path], typer.Option(help="A TOML spec under sweeps/.", rich_help_panel=SWEEP_PANEL)] = None,
    p_min: Annotated[Optional[str], _axis("Classification: ε = log(1/p_min), as an axis.")] = None,
    seeds: Annotated[Optional[int], _axis("Seeds 0..N-1.")] = None,
    option: Annotated[Optional[list[str]], typer.Option("--option", "-o", help="Task option KEY=V1,V2 (repeatable).",
                                                        rich_help_panel=AXES_PANEL)] = None,
    model: Annotated[Optional[str], typer.Option(help="Models, e.g. tiny,NAME (same as -o model=...).",
                                                 rich_help_panel=AXES_PANEL)] = None,
    name: Annotated[Optional[str], typer.Option(help="A name to find the sweep by.", rich_help_panel=SWEEP_PANEL)] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan; write nothing.",
                                          rich_help_panel=SWEEP_PANEL)] = False,
    yes: Annotated[bool, typer.Option("--yes", help="Accept a grid of more than 10,000 cells.",
                                      rich_help_panel=SWEEP_PANEL)] = False,
    wait: Annotated[bool, typer.Option(help="Block and show the live ledger until every cell is done.",
                                       rich_help_panel=LAUNCH_PANEL)] = False,
    tune: Annotated[Optional[int], typer.Option(help="TPE search: N trials over the axes instead of the grid "
                                                "(blocks until done).", rich_help_panel=LAUNCH_PANEL)] = None,
    objective: Annotated[Optional[str], typer.Option(help="Summary metric the Optuna study records/optimizes, "
                                                     "e.g. test.max_loss [train.avg_loss].",
                                                     rich_help_panel=LAUNCH_PANEL)] = None,
    direction: Annotated[str, typer.Option(help="min or max.", rich_help_panel=LAUNCH_PANEL)] = "min",
    parallel: Annotated[int, typer.Option(help="Trials launched at once with --tune.",
                                          rich_help_panel=LAUNCH_PANEL)] = 1,
    results_dir: ResultsDirOption = None,
    db: DbOption = None,
    *,
    fields: dict,
    launch: LaunchFlags,
) -> None:
    """Plan a grid of runs and launch the ones not done yet; re-running fills only what is missing.

    Completed cells are never run again (dedup by config hash); failed, lost (stale heartbeat) and
    interrupted cells are retried up to --max-attempts times, resuming from their checkpoints.
    """
    from flctl.errors import ConfigError
    from flctl.launch.plan import plan_sweep

    try:
        chosen = _chosen_spec(spec, task, fields, p_min=p_min, seeds=seeds, option=option, model=model, name=name)
        folder = results_folder(results_dir, db)    # found and checked once: after the axes, before the plan (as the API)
        planned = plan_sweep(chosen, launch, results_root=folder.root, dry_run=dry_run, allow_large=yes,
                             objective=objective, direction=direction, tune=tune, progress=_planning, parallel=parallel)
    except (ConfigError, TypeError) as exc:
        fail(str(exc) + plugin_hint(str(exc), task, db, results_dir))
    if dry_run:
        _dry_run(planned, folder, direction)
        return
    for note in planned.spec.notes:
        console.print(safe(note))
    _check_name(folder.url, planned)        # before open_results makes or upgrades anything
    store = open_results(folder)
    _fill(planned, store, folder.url, folder.root, wait=wait, direction=direction)


def _dry_run(planned, folder, direction: str) -> None:
    """`flctl sweep --dry-run`: what the real sweep would refuse (its results folder, its database, its name), then
    its notes and its plan (the grid's runs, its launcher and its cost; or the --tune search); nothing is written."""
    make_folder(folder, dry=True)     # what the real sweep would refuse, a dry run refuses too
    # its database too (a newer flctl's, unreachable), before the plan is printed: read as the plan's price
    first = planned.configs[0]
    per_device = planned.settings.cells_per_device(first.task, len(planned.configs), first.device)
    cost = bad_input_exits_2(cost_line, folder.url, planned.configs, per_device)
    _check_name(folder.url, planned)
    for note in planned.spec.notes:
        console.print(safe(note))
    if planned.tune is not None:
        _tune_line(planned, dry_run=direction)
        return
    _print_plan(planned.sweep_id, planned.spec, planned.configs)
    console.print(f"launch through {safe(planned.settings.launcher.describe())}")
    if sharing := gpu_sharing_line(planned.spec.device, planned.settings):
        console.print(sharing)
    console.print(cost)


def _fill(planned, store, url: str, root: Path, *, wait: bool, direction: str) -> None:
    """Launch the sweep's missing cells (flctl.launch.flow.fill_sweep) and say how it went: the --tune study's best
    trial, a signal's stop (its exit code), how to follow it, the failed cells' errors."""
    from flctl.errors import ConfigError
    from flctl.launch.flow import fill_sweep
    from flctl.launch.tune import TuneFailed
    from flctl.launch.wait import SweepStopped, stopped_line

    sid = planned.sweep_id
    if planned.tune is not None:
        _tune_line(planned)
    started = time.time()
    try:
        filled = fill_sweep(planned, store, url, root, wait=wait, direction=direction, hooks=_hooks(url, planned, root))
    except ConfigError as exc:          # e.g. results/jobs is another user's folder
        fail(str(exc))
    except TuneFailed as exc:
        fail(str(exc), code=1)
    except SweepStopped as exc:         # its database or results folder moved while its worker here trained
        failed_starts_line(root, sid, started)
        fail(str(exc), code=exc.exit_code)
    if wait:
        failed_starts_line(root, sid, started)
    if filled.study is not None:
        best = filled.study.best_trial
        console.print(f"study [bold]{safe(filled.study.study_name)}[/]: best {safe(planned.objective)} = "
                      f"{best.value:.4g} with {_params(best.params)} (run {safe(best.user_attrs.get('run_id'))})")
        return
    if filled.stopped is not None:      # a signal: on stderr, as every command's line about how it ended
        err_console.print(f"[yellow]stopped[/]: {safe(stopped_line(root, sid, store))}", highlight=False,
                          soft_wrap=True)
        raise typer.Exit(filled.stopped)
    if not wait and filled.launched is not None and filled.launched.jobs and not planned.settings.launcher.in_process:
        console.print(f"follow it with `flctl status {sid} --watch`")
    if filled.ledger is not None:
        error_summary(filled.ledger)


def _hooks(url: str, planned, root: Path):
    """How `flctl sweep` shows a sweep filling: each launch, this process's worker's log lines, the live ledger, each
    --tune trial as it is told."""
    from flctl.launch.flow import Hooks

    def here(worker, sid: str) -> int | None:
        console.print("this process works on the sweep too while it waits")
        first, n = planned.configs[0], len(planned.configs)
        with ledger_lines(url, sid, lambda: cell_seconds(url, planned.configs, planned.settings.cells_per_device(
                first.task, n, first.device))):
            return worker()

    def told(trial) -> None:
        n, objective = planned.tune, planned.objective
        result = f"{safe(objective)} = {trial.value:.4g}" if trial.value is not None else safe(trial.status)
        console.print(f"trial {trial.number + 1}/{n}: {_params(trial.params)} → {result} (run {trial.run_id})")

    return Hooks(launched=functools.partial(said_launched, quiet=planned.tune is not None, root=root), here=here,
                 wait=lambda store, sid, root, take_over=False: watch(store, sid, until_done=True, root=root,
                                                                    take_over=take_over), told=told,
                 warn=lambda line: console.print(safe(line), highlight=False, soft_wrap=True))


def _check_name(url: str, planned) -> None:
    """The sweep's name and id against the others' (flctl.db.refs.name_clash), read as a plan reads the database
    (none there, or one the launch upgrades first: nothing to check): a --name that is the start of another sweep's
    id is one line, exit 2, before anything is written; an id that starts with another sweep's name is a warning."""
    from flctl.db.refs import name_clash
    from flctl.errors import OlderSchema, StoreError
    from flctl.results import peek_plan

    try:
        reader = peek_plan(url)
    except OlderSchema:
        return
    except StoreError as exc:          # what the launch would refuse, in its one line
        fail(str(exc))
    if reader is None:
        return
    try:
        with reader.session() as s:
            refusal, warning = name_clash(s, planned.spec.name, planned.sweep_id)
    finally:
        reader.close()
    if refusal is not None:
        fail(refusal)
    if warning is not None:
        err_console.print(f"[yellow]warning[/]: {safe(warning)}", highlight=False, soft_wrap=True)


def _tune_line(planned, dry_run: str | None = None) -> None:
    """The --tune search's one line: its sweep, trials and axes; ``dry_run`` (its direction, min or max): what it
    would search, each axis's range or choices."""
    from flctl.study import search_space

    sid, space = planned.sweep_id, search_space(planned.spec)
    if not dry_run:
        console.print(f"sweep [bold]{sid}[/]: TPE search, {planned.tune} trials over "
                      f"{safe(', '.join(space))}; follow it with `flctl status {sid}`")
        return
    axes = [f"{name} in {_fmt(d.low)}..{_fmt(d.high)} (log)" if hasattr(d, "low")
            else f"{name} in {{{', '.join(map(_fmt, d.choices))}}}" for name, d in space.items()]
    console.print(f"sweep [bold]{sid}[/] (dry run): TPE search, {planned.tune} trials of {safe(planned.spec.task)} "
                  f"for the {dry_run} of {safe(planned.objective)} "
                  f"over {safe('; '.join(axes))}; nothing was written")


def _chosen_spec(path: Path | None, task: str | None, fields: dict, *, p_min: str | None, seeds: int | None,
                 option: list[str] | None, model: str | None, name: str | None):
    """The sweep a command line describes: a spec file (which --device may move to another device) or a task with
    axes; ConfigError for both or neither. The task options are parsed only for a task given here."""
    from flctl.errors import ConfigError
    from flctl.sweep import load_spec, spec_from_values

    raw_axes = {k: fields[k] for k in AXIS_FIELDS} | {"p_min": p_min}
    device = fields["device"] or "cpu"
    if path is not None:
        if task is not None or any(v is not None for v in raw_axes.values()) or seeds is not None:
            raise ConfigError("give either --spec or a task with axes, not both")
        spec = load_spec(path)
        return spec if fields["device"] is None else dataclasses.replace(spec, device=device)
    if task is None:
        raise ConfigError("name a task (see `flctl tasks`) or pass --spec sweeps/NAME.toml")
    return spec_from_values(task, raw_axes, seeds=seeds, options=with_model(parse_options(option), model), name=name,
                            device=device, data_dir=fields["data_dir"])


def _params(params: dict) -> str:
    """A trial's parameters as `alpha=0.005432, lr=0.001`."""
    return ", ".join(safe(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}") for k, v in params.items())


def _planning(done: int, cells: int) -> None:
    err_console.print(f"planning: {done:,} of {cells:,} cells", highlight=False)


PLAN_ROWS = 200     # a dry run's table shows this many runs: a terminal of 40,000 rows says no more than its count


def _print_plan(sid: str, spec, configs) -> None:
    import operator

    from rich.table import Table

    from flctl.axes import AXES

    names = [k for k in AXES if k != "p_min"]       # p_min -> eps
    # each config's values of them as one tuple (attrgetter, in C), then each axis's column: 100,000 cells in 0.2 s
    varying = [k for k, column in zip(names, zip(*map(operator.attrgetter(*names), configs))) if len(set(column)) > 1]
    values: dict[str, set] = {}
    for c in configs:
        for k, v in c.options:
            values.setdefault(k, set()).add(v)
    opts = sorted(k for k, seen in values.items() if len(seen) > 1)
    table = Table("run id", *varying, *map(safe, opts),
                  title=f"sweep {sid}: {len(configs)} runs of {safe(spec.task)} (dry run)")
    for c in configs[:PLAN_ROWS]:
        table.add_row(c.run_id, *(safe(_fmt(getattr(c, k))) for k in varying), *(safe(_fmt(c.opts[k])) for k in opts))
    console.print(table)
    if len(configs) > PLAN_ROWS:
        console.print(f"(the first {PLAN_ROWS} of {len(configs):,} runs)")
    console.print(f"{len(configs):,} runs; nothing was written")


def _fmt(v) -> str:
    return "—" if v is None else (f"{v:g}" if isinstance(v, float) else str(v))
