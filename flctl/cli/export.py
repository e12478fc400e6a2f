"""`flctl export RUN|SWEEP --to NAME`: finished runs logged after the fact to a tracker (flctl.loggers.export)."""

from __future__ import annotations

from typing import Annotated

import typer

from flctl.cli.common import (
    DbOption,
    ResultsDirOption,
    bad_input_exits_2,
    console,
    existing_store,
    fail,
    results_folder,
    safe,
)
from flctl.cli.completion import complete_logger, complete_run


def export(
    ref: Annotated[str, typer.Argument(metavar="RUN|SWEEP", help="A run (id or unique prefix) or a sweep (id, "
                                       "prefix or name).", autocompletion=complete_run)],
    to: Annotated[list[str], typer.Option("--to", help="The tracker: tensorboard, mlflow, wandb or an installed "
                                          "logger (repeatable).", autocompletion=complete_logger)],
    db: DbOption = None,
    results_dir: ResultsDirOption = None,
) -> None:
    """Log finished runs to a tracker after the fact, as `--log-to` logs them live.

    Each evaluated epoch's metrics as the run's records keep them, and its multipliers. A run is keyed by its id:
    exporting again replaces what an earlier export or live log of it left, never adds to it. A tracker that fails
    (or gives no answer within FLCTL_TRACKER_TIMEOUT_S) is tried for no further run: exit 1, with one error line."""
    from flctl.api import export_from
    from flctl.loggers import check, where

    chosen = bad_input_exits_2(check, to)
    folder = results_folder(results_dir, db)
    made = bad_input_exits_2(export_from, existing_store(folder), folder, ref, chosen.names)
    runs, finished, done = made.runs, made.finished, made.logging
    failed = {run_id for ids in done.not_logged.values() for run_id in ids}
    whole = len(finished) - len(failed)
    console.print(f"exported {whole if failed else len(finished)}{f' of {len(finished)}' if failed else ''} run(s) "
                  f"to {safe(where(chosen, folder.root))}"
                  + (f"; {len(runs) - len(finished)} not finished yet left out" if len(runs) > len(finished) else ""))
    if done.not_logged:      # a tracker's failure, not bad input: exit 1
        told = "; ".join(f"{name} did not log {len(ids)} of {len(finished)} run(s) ({done.why[name]})"
                         for name, ids in done.not_logged.items())
        again = " ".join(f"--to {name}" for name in done.not_logged)
        fail(f"{told}; the records are intact: `flctl export {ref} {again}` again once it answers", 1)
