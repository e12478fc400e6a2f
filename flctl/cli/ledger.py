"""`flctl status`, `flctl sweeps` and `flctl cancel`: a sweep's ledger, watched live, and its workers stopped."""


from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from flctl.cli.common import (
    DbOption,
    ResultsDirOption,
    console,
    err_console,
    existing_store,
    fail,
    find,
    results_folder,
    safe,
)
from flctl.cli.completion import complete_sweep
from flctl.cli.output import JSON_OPT, print_json
from flctl.cli.progress import LogLines, drawn, sweep_line
from flctl.knobs import (
    DEFAULT_CANCEL_TIMEOUT_S,
)
from flctl.status import CELLS_FAILED_EXIT, LEDGER_COLUMNS, TO_DO, Status, failed_for_good, ledger, settled

# What a person's terminal is shown of lists that may run to thousands (--json gives them whole): the error kinds
# after a wait, the sweeps listed.
ERRORS_SHOWN = 20
SWEEPS_SHOWN = 200


def _ledger_table(data: dict):
    from rich.table import Table

    table = Table("method", *LEDGER_COLUMNS, "cells", "error", title=f"sweep {safe(data['sweep'])}")
    for method, counts in sorted(data["methods"].items()):
        table.add_row(safe(method), *(str(counts[k]) for k in LEDGER_COLUMNS), str(sum(counts.values())),
                      _top_error(data["method_errors"].get(method, [])))
    table.add_row("[bold]all", *(f"[bold]{data['total'][k]}" for k in LEDGER_COLUMNS), f"[bold]{data['cells']}",
                  _top_error(data["errors"]))
    return table


def _top_error(errors: list[dict]) -> str:
    """The most frequent error of failed or diverged cells, cut to fit a column, and how many other kinds there are."""
    if not errors:
        return ""
    top = errors[0]["message"]
    more = f" (+{len(errors) - 1} other)" if len(errors) > 1 else ""
    return f"[red]{safe(top if len(top) <= 48 else top[:47] + '…')}[/]{more}"


def error_summary(*ledgers: dict) -> None:
    """After a wait: for each sweep whose cells failed or diverged, each error on a line of its own, with its count
    and a run to look at with `flctl show`; then exit with CELLS_FAILED_EXIT if there were any."""
    bad = [data for data in ledgers if failed_for_good(data)]
    for data in bad:
        console.print(f"[red]{failed_for_good(data)} of {data['cells']} cell(s) failed or diverged[/] "
                      f"(sweep {safe(data['sweep'])}):", highlight=False)
        for e in data["errors"][:ERRORS_SHOWN]:
            console.print(f"  {e['count']} × {safe(e['message'])}  [dim](flctl show {safe(e['run'])})[/]",
                          highlight=False)
        if (more := data["errors"][ERRORS_SHOWN:]):
            console.print(f"  and {len(more):,} more kind(s) of error in {sum(e['count'] for e in more):,} cell(s): "
                          f"`flctl status {safe(data['sweep'])} --json` lists them all", highlight=False)
    if bad:
        raise typer.Exit(CELLS_FAILED_EXIT)


def _counts(data: dict) -> str:
    return " · ".join(f"{k} {n}" for k, n in data["total"].items() if n) or "no cells"


@contextlib.contextmanager
def ledger_lines(url: str, sid: str, per_cell_s: Callable[[], float | None] | None = None) -> Iterator[None]:
    """While this process trains cells itself (`sweep --wait`'s and `paper`'s own worker, whose epochs print
    nothing): on a terminal, the sweep's live line (flctl.cli.progress.sweep_line; ``per_cell_s``: asked for the
    estimate of the wall seconds a cell adds, there only: ``cell_seconds``); else the sweep's counts as a timestamped
    line every LOG_EVERY_S."""
    if console.is_terminal:
        with sweep_line(url, sid, per_cell_s):
            yield
        return
    from flctl.results import peek

    def state() -> str:
        try:
            reader = peek(url)
        except Exception as exc:       # gone, locked: the worker in this process says what it met
            return f"sweep {sid}: the database cannot be read now ({type(exc).__name__})"
        if reader is None:
            return f"sweep {sid}: the database cannot be read now (it is not there)"
        try:
            return f"sweep {sid}: {_counts(ledger(reader, sid))}"
        finally:
            reader.close()

    with LogLines().beating(state):
        yield


def cell_seconds(url: str, configs: Sequence[Any], per_device: int) -> float | None:
    """The wall seconds each cell of ``configs`` (one task and device; ``per_device`` training at once) adds to a
    wait, as flctl.cost prices them: fitted to the database's finished runs of the task, else the committed
    benchmark's; the start-up left out (the wait's own worker has started). None where nothing prices them or the
    database cannot be read: a live line's time left then waits for the first cell to end."""
    from flctl.cli.estimate import plan_cost

    try:                               # as a dry run prices them
        cost, _ = plan_cost(url, configs, per_device)
    except Exception:                  # an estimate is a help: the sweep goes on without one
        return None
    if cost is None or not cost.cells:
        return None
    return max(0.0, cost.device_hours * 3600 - cost.s_per_start) / cost.cells


def watch(store, sid: str, until_done: bool, *, root: Path, interval: float = 0.5, take_over: bool = False) -> dict:
    """Redraw the sweep's ledger in place until it settles (``until_done``) or forever. Piped or redirected, a log
    line each time the counts change (a log followed with `tail -f`, or cut short, still says how far the sweep got)
    and the last ledger as a table at the end, not every redraw. A wait that cannot end with the sweep done
    (flctl.launch.wait.SweepStopped) ends the command with its line and exit code; ``take_over`` (a launch's wait):
    stale cells end the watch in CellsLost, for the launch to take them over."""
    from flctl.db import poll_delays
    from flctl.launch.wait import Settling, SweepStopped

    settling = Settling(store, sid, root, until_done, take_over)
    try:
        data, delays = settling.poll(), poll_delays(interval)     # a sweep of short cells returns when it is done
        if not console.is_terminal:
            said, lines = None, LogLines()
            while True:
                counts = _counts(data)
                lines.tick(f"sweep {sid}: {counts}", now=counts != said)   # a change, or a while
                said = counts
                if until_done and settled(data):
                    break
                time.sleep(next(delays))
                data = settling.poll()
            console.print(_ledger_table(data))
            return data
        with drawn(_ledger_table(data)) as redraw:
            while not (until_done and settled(data)):
                time.sleep(next(delays))
                data = settling.poll()
                redraw(_ledger_table(data))
        return data
    except SweepStopped as exc:
        if exc.exit_code == 130:
            console.print(f"[yellow]stopped[/]: {safe(str(exc))}", highlight=False)
            raise typer.Exit(130) from None
        fail(str(exc), code=exc.exit_code)


def status(
    sweep_ref: Annotated[Optional[str], typer.Argument(metavar="SWEEP", help="Sweep id, prefix or name "
                                                       "(default: the newest).", autocompletion=complete_sweep)] = None,
    watch_: Annotated[bool, typer.Option("--watch", help="Live-update until no cell is queued or running.")] = False,
    as_json: JSON_OPT = False,
    db: DbOption = None,
    results_dir: ResultsDirOption = None,
) -> None:
    """Show a sweep's completeness ledger: cells completed, running, stale, queued, failed, diverged."""
    from flctl.db.counts import newest_sweep

    folder = results_folder(results_dir, db)
    store = existing_store(folder)
    newest = sweep_ref is None
    if sweep_ref is None and (sweep_ref := newest_sweep(store)) is None:
        fail("no sweeps in the database; start one with `flctl sweep TASK ...`")
    found = find(store.get_sweep, sweep_ref, "sweep")
    if as_json:
        print_json(ledger(store, found["id"]))
        return
    if newest:                # a person who named none is told which this is, and how to see another
        console.print(_newest_line(store))
    if watch_:
        error_summary(watch(store, found["id"], until_done=True, root=folder.root))
    else:
        console.print(_ledger_table(ledger(store, found["id"])))
    failed_starts_line(folder.root, found["id"])


def _newest_line(store) -> str:
    """What `flctl status` without a sweep named says before the ledger: that it is the newest sweep, of how many."""
    from flctl.db.counts import count_sweeps

    n = count_sweeps(store)
    return ("the only sweep in the database:" if n == 1 else
            f"the newest of {n:,} sweeps (`flctl sweeps` lists them; `flctl status SWEEP` shows another):")


def failed_starts_line(root, sid: str, since: float | None = None) -> None:
    """A warning line for the sweep's worker jobs that never ran flctl's worker (flctl.launch.jobs.failed_starts;
    ``since`` None: since the last job in which one ran): the sweep went on without them, and nothing else would
    say why."""
    from flctl.launch.jobs import failed_starts

    failed = failed_starts(root, sid, since)
    if failed:
        job, why, log = failed[0]
        err_console.print(f"[yellow]warning:[/] {len(failed)} worker job(s) failed before they could train ({safe(why)}"
                          f"); the sweep went on without them: see {safe(log)}", highlight=False, soft_wrap=True)


def sweeps(
    as_json: JSON_OPT = False,
    db: DbOption = None,
    results_dir: ResultsDirOption = None,
) -> None:
    """List sweeps with their cell counts."""
    store = existing_store(results_folder(results_dir, db))
    if as_json:
        print_json(store.list_sweeps())
        return
    from rich.table import Table

    from flctl.db.counts import count_sweeps

    rows = store.list_sweeps(limit=SWEEPS_SHOWN)
    table = Table("id", "name", "task", "cells", Status.COMPLETED, "submissions", "created")
    for r in rows:
        table.add_row(safe(r["id"]), safe(r["name"] or ""), safe(r["task"]), str(r["cells"]), str(r[Status.COMPLETED]),
                      str(r["submissions"]), safe(r["created_at"][:19]))
    console.print(table)
    if len(rows) == SWEEPS_SHOWN and (more := count_sweeps(store) - SWEEPS_SHOWN) > 0:
        console.print(f"and {more:,} more sweep(s), older: `flctl sweeps --json` lists them all")


def cancel(
    sweep_ref: Annotated[str, typer.Argument(metavar="SWEEP", help="Sweep id, prefix or name.",
                                                                autocompletion=complete_sweep)],
    timeout: Annotated[float, typer.Option(help="Seconds to wait for workers to stop cleanly before killing them.")]
    = DEFAULT_CANCEL_TIMEOUT_S,
    as_json: JSON_OPT = False,
    db: DbOption = None,
    results_dir: ResultsDirOption = None,
) -> None:
    """Stop a sweep's workers and hand its running cells back; `flctl sweep` with the same axes resumes it.

    Workers finish the epoch they are in, checkpoint and exit (killed after --timeout); the cells they held
    are marked interrupted without counting an attempt.
    """
    from flctl.db import counts as cells
    from flctl.launch.cancel import cancel as cancel_sweep
    from flctl.launch.jobs import live_controllers, live_workers, missing_launchers, queued_jobs

    if not timeout >= 0:
        fail(f"--timeout must be a number of seconds >= 0, got {timeout}")
    folder = results_folder(results_dir, db)
    root = folder.root
    reader = existing_store(folder)        # read-only until there is something to cancel
    found = find(reader.get_sweep, sweep_ref, "sweep")
    sid = found["id"]
    if missing := missing_launchers(root, sid):
        fail(f"sweep {safe(sid)}'s workers were started through the launcher {safe(', '.join(missing))}, which is "
             "not installed here: this flctl can neither see nor stop them; run `flctl cancel` where it is installed")
    running = [run_id for run_id, _, _ in cells.running(reader, sid)]
    reader.close()
    queued = bool(queued_jobs(root, sid))
    if not (running or live_workers(root, sid) or live_controllers(root, sid) or queued):
        if as_json:
            print_json({"sweep": sid, "stopped": [], "killed": [], "handed_back": []})
        else:
            console.print(f"sweep {safe(sid)}: nothing to cancel (no live worker, no running cell)")
        return
    store = existing_store(folder, readonly=False)
    outcome = cancel_sweep(store, root, sid, timeout=timeout)
    # A worker that stops cleanly hands its own cell back before cancel_sweep looks, which then finds nothing left
    # to hand back: count every cell that was running and is now to do again, whoever handed it back.
    back = {run_id for run_id, (state, _) in cells.run_states(store, running).items() if state in TO_DO}
    outcome["handed_back"] = sorted(back | set(outcome["handed_back"]))
    if as_json:
        print_json(outcome)
        return
    console.print(f"sweep [bold]{safe(sid)}[/]: stopped {len(outcome['stopped'])} worker(s)"
                  + (f" ({len(outcome['killed'])} killed after {timeout:g} s)" if outcome["killed"] else "")
                  + f", {len(outcome['handed_back'])} running cell(s) handed back (interrupted); "
                  f"`flctl sweep` with the same axes resumes it")
    for w in outcome["stopped"]:
        console.print(safe(f"  {w['kind']} {w.get('pid') or ''} job {w.get('job_id') or '-'}"))
