"""`flctl export RUN|SWEEP --to NAME`: finished runs logged after the fact to a tracker (flctl.loggers.export)."""

from __future__ import annotations

from typing import Annotated

import typer

from flctl.cli.common import (
    DbOption,
    ResultsDirOption,
    console,
    existing_store,
    fail,
    results_root,
    safe,
)
from flctl.cli.completion import complete_run
from flctl.cli.runs import run_or_sweep
from flctl.errors import ConfigError
from flctl.status import REPORTABLE


def export(
    ref: Annotated[str, typer.Argument(metavar="RUN|SWEEP", help="A run (id or unique prefix) or a sweep (id, "
                                       "prefix or name).", autocompletion=complete_run)],
    to: Annotated[list[str], typer.Option("--to", help="The tracker: tensorboard, mlflow, wandb or an installed "
                                          "logger (repeatable).")],
    db: DbOption = None,
    results_dir: ResultsDirOption = None,
) -> None:
    """Log finished runs to a tracker after the fact, as `--log-to` logs them live.

    Each evaluated epoch's metrics as the run's records keep them, and its multipliers. A run is keyed by its id:
    exporting again replaces what an earlier export or live log of it left, never adds to it. A tracker that fails
    (or gives no answer within FLCTL_TRACKER_TIMEOUT_S) is tried for no further run: exit 1, with one error line."""
    from flctl.db.store import sweep_of as sweep_of_run
    from flctl.loggers import check, where
    from flctl.loggers.export import export as replay

    try:
        loggers = check(to)
    except ConfigError as exc:
        fail(str(exc))
    root = results_root(results_dir)
    store = existing_store(db, root)
    try:
        run, sweep = run_or_sweep(store, ref)
        if sweep is not None:
            ids = {r["id"] for r in store.sweep_runs(sweep["id"])}
            runs = [r for r in store.list_runs() if r.id in ids]
            sweep_of = {r.id: sweep["id"] for r in runs}
        else:
            runs = [run]
            sweep_of = {run.id: sweep_of_run(store, run.id)}
    finally:
        store.close()
    finished = [r for r in runs if r.status in REPORTABLE]
    if not finished:
        fail(f"{safe(ref)}: no finished run to export ({len(runs)} not finished yet; see `flctl status`)")
    from flctl.layout import Layout
    from flctl.report.data import gate

    gate(Layout(root).records, finished, read="all")     # as verify checks them, before any tracker hears of one
    done = replay(finished, root, loggers, sweep_of)
    failed = {run_id for ids in done.not_logged.values() for run_id in ids}
    whole = len(finished) - len(failed)
    console.print(f"exported {whole if failed else len(finished)}{f' of {len(finished)}' if failed else ''} run(s) "
                  f"to {safe(where(loggers, root))}"
                  + (f"; {len(runs) - len(finished)} not finished yet left out" if len(runs) > len(finished) else ""))
    if done.not_logged:      # a tracker's failure, not bad input: exit 1
        told = "; ".join(f"{name} did not log {len(ids)} of {len(finished)} run(s) ({done.why[name]})"
                         for name, ids in done.not_logged.items())
        again = " ".join(f"--to {name}" for name in done.not_logged)
        fail(f"{told}; the records are intact: `flctl export {ref} {again}` again once it answers", 1)
