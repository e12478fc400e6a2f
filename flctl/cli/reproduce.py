"""`flctl reproduce RUN`: train a run again in a scratch folder and say whether its records come out bit-identical."""

from __future__ import annotations

from typing import Annotated

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
from flctl.cli.completion import complete_run

# The records differ, or could not be compared once trained again (2 stays bad input, found before any training: an
# unknown run, one not completed, its records missing or failing their check, no database).
DIFFERENT_EXIT = 1


def reproduce(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="Run id or a unique prefix of it.",
                                          autocompletion=complete_run)],
    db: DbOption = None,
    results_dir: ResultsDirOption = None,
) -> None:
    """Train a completed run again and compare every record file with the recorded one, bit for bit.

    It trains from the run's recorded configuration with the torch threads it recorded (and, for a cell of a grouped
    sweep, with the cells it was grouped with), in a scratch folder deleted after: the results folder and database
    are only read. A line warns where this machine's flctl or a library that can move numbers
    (flctl.versions.CHANGES_NUMBERS) is of another version than the run's; pyarrow, which computes none, is not
    compared. Exit 0 when every record file is bit-identical; 1 when one differs, with the first difference (epoch, split, sample id, column
    and its size); 2 for bad input (checked before training: the run, its state, its recorded records)."""
    from flctl.cli.progress import epoch_progress
    from flctl.errors import ConfigError
    from flctl.reproduce import NotCompared, prepare, train_and_compare, versions_line

    folder = results_folder(results_dir, db)
    store = existing_store(folder)
    records = folder.layout.records
    run = find(store.get_run, run_id, "run")
    try:        # every input checked before any training: a refusal here costs nothing and wrote nothing
        plan = prepare(store, records, run.id)
    except ConfigError as exc:
        fail(str(exc))
    finally:
        store.close()
    title = f"reproducing {run.id} ({run.task} · {run.method})"
    progress = epoch_progress(run.id, run.cfg.epochs, title)
    try:
        with progress as on_epoch:
            found = train_and_compare(plan, records, on_epoch)
    except ConfigError as exc:      # the task refused its configuration as it started: nothing trained
        fail(str(exc))
    except NotCompared as exc:      # found after the work: not bad input
        fail(str(exc), code=DIFFERENT_EXIT)
    if found.versions:
        err_console.print(f"[yellow]warning:[/] {safe(versions_line(found.versions))}", highlight=False,
                          soft_wrap=True)
    if len(found.group) < found.group_wanted:
        err_console.print(f"[yellow]warning:[/] run {found.run_id} trained grouped with {found.group_wanted} cells; "
                          f"the database names {len(found.group)} of them, so its rounding may differ",
                          highlight=False, soft_wrap=True)
    how = f"{found.threads} thread{'s' if found.threads != 1 else ''}" if found.threads else "this process's threads"
    if len(found.group) > 1:
        how += f", grouped with {len(found.group) - 1} other cell{'s' if len(found.group) > 2 else ''}"
    if found.difference is not None:
        console.print(safe(found.difference.line(found.run_id)) + f" (trained again with {how})", highlight=False,
                      soft_wrap=True)
        raise typer.Exit(DIFFERENT_EXIT)
    console.print(f"run {found.run_id}: all {found.files} record file{'s' if found.files != 1 else ''} "
                  f"bit-identical (trained again with {how})", highlight=False, soft_wrap=True)
