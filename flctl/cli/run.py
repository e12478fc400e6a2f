"""`flctl run TASK --method M ...`: train one configuration, record it, print its summary."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flctl.db import RunRecord
    from flctl.layout import Layout

from typing import Annotated, Optional

import typer

from flctl.cli.common import (
    DbOption,
    ResultsDirOption,
    check_device,
    config_options,
    console,
    err_console,
    fail,
    make_folder,
    open_results,
    parse_options,
    results_folder,
    safe,
    with_model,
)
from flctl.cli.completion import complete_logger, complete_task
from flctl.cli.estimate import cost_line
from flctl.cli.progress import epoch_progress
from flctl.config import PANELS
from flctl.errors import ConfigError
from flctl.knobs import DEFAULT_CHECKPOINT_EVERY_S, check_checkpoint_every, threads_of_a_run
from flctl.status import Status


def resolve_config(task: str, method: str, overrides: dict, p_min: float | None, *, check_data: bool = True,
                   db: str | None = None, results_dir: Path | None = None):
    """Task defaults + overrides -> validated RunConfig (flctl.api.config); bad input exits 2 before anything is
    written. ``check_data`` False (a dry run): the data is not looked for, as `sweep --dry-run` does not."""
    from flctl import api

    try:
        return api.config(task, method, p_min=p_min, check_data=check_data, **overrides)
    except ConfigError as exc:
        fail(str(exc) + plugin_hint(str(exc), task, db, results_dir))


def plugin_hint(message: str, task: str | None, db: str | None, results_dir: Path | None) -> str:
    """For an unknown task whose runs in the database came from a plugin's file or module (a new shell, without the
    FLCTL_TASKS of the one that trained them): where, and how to name it again; "" otherwise (never an error)."""
    if task is None or not message.startswith("unknown task"):
        return ""
    from flctl import results
    from flctl.plugins import ENV

    try:
        store = results.peek(results.find(results_dir, db, results.CLI).url)
        if store is None:
            return ""
        try:
            runs = store.list_runs(task=task)
        finally:
            store.close()
    except Exception:      # noqa: BLE001 - a hint: a database that cannot be read gives none
        return ""
    found = next((src for r in runs if (src := (r.provenance or {}).get("task") or {}).get("origin") in
                  ("file", "module")), None)
    if found is None:
        return ""
    where = found.get("file") if found["origin"] == "file" else found.get("module")
    return f"; its runs here came from the {found['origin']} {where}: name it with {ENV}={where}"


@config_options()
def run(
    task: Annotated[str, typer.Argument(metavar="TASK", help="Task name (see `flctl tasks`).", autocompletion=complete_task)],
    p_min: Annotated[Optional[float], typer.Option("--p-min", help="Classification: ε = log(1/p_min).",
                                                   rich_help_panel=PANELS["method"])] = None,
    option: Annotated[Optional[list[str]], typer.Option("--option", "-o", help="Task option KEY=VALUE (repeatable).",
                                                        rich_help_panel=PANELS["optim"])] = None,
    model: Annotated[Optional[str], typer.Option(help="Model of tasks with a `model` option (same as -o model=M).",
                                                 rich_help_panel=PANELS["optim"])] = None,
    results_dir: ResultsDirOption = None,
    db: DbOption = None,
    rerun: Annotated[bool, typer.Option(help="Train again even if this exact run already completed.",
                                        rich_help_panel=PANELS["where"])] = False,
    checkpoint_every: Annotated[float, typer.Option("--checkpoint-every", help="Seconds between checkpoints (also at "
                                                    "eval epochs and on SIGINT/SIGTERM/SIGHUP; 0: every epoch).",
                                                    rich_help_panel=PANELS["where"])] = DEFAULT_CHECKPOINT_EVERY_S,
    threads: Annotated[Optional[int], typer.Option(help="torch threads on a CPU [OMP_NUM_THREADS if set, else 1 "
                                                   "for a small model, the cores this process may use (never the "
                                                   "load) for a large one].",
                                                   rich_help_panel=PANELS["where"])] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the run's id, its configuration and whether it "
                                          "was trained; train and write nothing.",
                                          rich_help_panel=PANELS["where"])] = False,
    log_to: Annotated[Optional[list[str]], typer.Option("--log-to", help="Log the run, live, to this tracker: "
                                                        "tensorboard, mlflow, wandb or an installed logger "
                                                        "(repeatable).", rich_help_panel=PANELS["where"],
                                                        autocompletion=complete_logger)] = None,
    *,
    fields: dict,
) -> None:
    """Train TASK with one method and record per-sample losses and multipliers.

    The same configuration is the same run: re-running a completed one shows it; an interrupted one resumes
    from its last checkpoint. Ctrl-C, SIGTERM or SIGHUP (its terminal closed) stops at the end of the epoch,
    checkpointed, marks the run interrupted and exits 130, 143 or 129; a second signal stops at once.
    """
    chosen_threads, loggers = _run_flags(checkpoint_every, threads, log_to)
    method, device = fields.pop("method") or "fl", fields.pop("device") or "cpu"
    # the device first: a task's option defaults may depend on it (fashion-mnist's model)
    overrides = {**fields, "device": check_device(device), "options": with_model(parse_options(option), model)}
    cfg = resolve_config(task, method, overrides, p_min, check_data=not dry_run, db=db, results_dir=results_dir)
    folder = results_folder(results_dir, db)    # checked (an in-memory database is refused) before it is made
    if dry_run:
        make_folder(folder, dry=True)              # what the real run would refuse, a dry run refuses too
        _dry_run(cfg, folder.url)
        return
    store, root = open_results(folder), folder.root

    from flctl.runner import completed

    if (found := completed(cfg, store, rerun)) is not None:     # before the progress bar: nothing trains
        console.print(f"run [bold]{cfg.run_id}[/] already completed; showing it (pass --rerun to train again)")
        print_summary(found)
        return
    ending, stop = _train(cfg, store, folder.layout, rerun=rerun, checkpoint_every=checkpoint_every, threads=chosen_threads,
                          loggers=loggers)
    _end_unless_trained(cfg, store, ending, stop, rerun=rerun)
    _said_trained(cfg, store, ending, loggers, root)


def _run_flags(checkpoint_every: float, threads: int | None, log_to: list[str] | None):
    """`flctl run`'s flags that need no task: (the torch threads, the trackers `loggers.check` found, each
    installed), or exit 2 before anything is written."""
    try:
        check_checkpoint_every(checkpoint_every)
        chosen_threads = threads_of_a_run(threads)
        from flctl.loggers import check

        return chosen_threads, check(log_to or ())
    except ConfigError as exc:
        fail(str(exc))


def _train(cfg, store, layout: Layout, *, rerun: bool, checkpoint_every: float, threads, loggers):
    """Train ``cfg`` under an epoch progress bar, stopping at an epoch's end on a signal: (its Ending, None when a
    live worker holds the run; the StopRequest, which knows the signal taken)."""
    from flctl.outcomes import Ending, named
    from flctl.runner import stop_on_signals, train_unless_done

    # Messages come after the progress bar has closed, so they are the last line, not torn by the bar.
    progress = epoch_progress(cfg.run_id, cfg.epochs, cfg.title)
    with progress as on_epoch, stop_on_signals() as stop:
        try:
            _, ending = train_unless_done(cfg, store, layout, rerun=rerun, on_epoch=on_epoch,
                                          checkpoint_every=checkpoint_every, stop=stop.is_set, threads=threads,
                                          log_to=loggers)
        except KeyboardInterrupt as exc:   # a second signal: stopped at once (its row recorded it), resumes
            ending = Ending(named("signal"), error=exc)
    return ending, stop


def _end_unless_trained(cfg, store, ending, stop, *, rerun: bool) -> None:
    """Exit as the outcome table says (flctl.outcomes.OUTCOMES: the row's line and exit code) unless the run
    trained: a run a live worker holds (``ending`` None) is 1, or 2 with --rerun; a signal's line goes to stderr."""
    from flctl.outcomes import SIGNAL

    if ending is None:
        held = store.get_run(cfg.run_id)
        assert held is not None
        fail(f"run {cfg.run_id} is being trained by {held.host} pid {held.pid} (last heartbeat "
             f"{held.heartbeat_at}); " + ("--rerun leaves a live run alone: " if rerun else "")
             + f"wait for it, or see `flctl show {cfg.run_id}`", code=2 if rerun else 1)
    # what the user reads is the row's (flctl.outcomes.OUTCOMES): its line and its exit code
    if ending.outcome.exit_code == SIGNAL:
        err_console.print(ending.line(cfg.run_id), style="yellow", markup=False)   # how it ended: stderr
        raise typer.Exit(ending.exit_code(stop.exit_code))
    if ending.outcome.exit_code != 0:
        fail(ending.line(cfg.run_id), code=ending.outcome.exit_code)


def _said_trained(cfg, store, ending, loggers, root: Path) -> None:
    """A run that trained: where it resumed from, its summary and the trackers it was logged to."""
    result = ending.results[0]
    if result.resumed_from:
        console.print(f"resumed from epoch {result.resumed_from}")
    print_summary(store.get_run(cfg.run_id))
    if loggers:
        from flctl.loggers import where

        console.print(f"logged to {safe(where(loggers, root))}")


def print_summary(run: RunRecord) -> None:
    from rich.table import Table

    styles: dict[str, str] = {Status.COMPLETED: "green", Status.DIVERGED: "yellow", Status.FAILED: "red"}
    status_style = styles.get(run.status, "white")
    console.print(f"run [bold]{safe(run.id)}[/] [{status_style}]{safe(run.status)}[/] after "
                  f"{safe(run.epochs_done)} epoch{'' if run.epochs_done == 1 else 's'}"
                  + (f" in {run.duration_s:.1f}s" if run.duration_s else ""))
    if run.diverged_at:
        d = run.diverged_at
        console.print(f"[yellow]non-finite loss at epoch {safe(d['epoch'])}, step {safe(d['step'])}[/]")
    if run.lambda_capped:
        console.print(f"[yellow]{safe(run.lambda_capped)} multipliers reached the cap (infeasible at this ε?)[/]")
    metrics = run.metrics
    if metrics:
        names = sorted({k.split(".", 1)[1] for k in metrics}, key=_metric_order)
        table = Table("metric", "train", "test", title=None)
        for name in names:
            table.add_row(safe(name), *(_fmt(metrics.get(f"{split}.{name}")) for split in ("train", "test")))
        console.print(table)
    records = run.artifacts.get("records")
    if records:
        console.print(f"records: {safe(records)}")


def _metric_order(name: str) -> tuple[int, str]:
    from flctl.metrics import SUMMARY_METRICS

    order = SUMMARY_METRICS
    return (order.index(name) if name in order else len(order), name)


def _fmt(v) -> str:
    return "" if v is None else f"{v:.4g}"


def _dry_run(cfg, url: str) -> None:
    """What `flctl run` would train, and where it stands: its id, every field of its configuration, and its row in the
    database when there is one (read only; a database that is not there is not made)."""
    from rich.table import Table

    from flctl.errors import OlderSchema, StoreError
    from flctl.results import peek_plan

    # the database first, read as the real run would open it: one it would refuse (a newer flctl's, unreachable) is
    # this dry run's one line too, never "not trained yet"
    try:
        store, older = peek_plan(url), False
    except OlderSchema:
        store, older = None, True
    except StoreError as exc:
        fail(str(exc))
    console.print(f"run [bold]{cfg.run_id}[/]: {safe(cfg.task)} · {safe(cfg.method)}")
    table = Table("field", "value", show_header=False)
    for key, value in sorted(cfg.to_dict().items()):
        table.add_row(safe(key), safe(value))
    console.print(table)
    found = None
    if store is not None:
        try:
            found = store.get_run(cfg.run_id)
        finally:
            store.close()
    if older:
        console.print("whether it trained is told once the database, from an older flctl, is upgraded (`flctl "
                      "migrate`; `flctl run` upgrades it too); nothing was written")
    elif found is None:
        console.print("not trained yet; nothing was written (its data is looked for when it trains)")
    else:
        console.print(f"{safe(found.status)} in the database ({found.epochs_done} epoch(s) done): `flctl show "
                      f"{cfg.run_id}`; nothing was written")
    if found is None or found.status != Status.COMPLETED:
        console.print(cost_line(url, [cfg], 1))       # one cell, alone in this process
