"""`flctl verify [RUN|SWEEP]`: check runs' per-sample records against their checksums and flctl's record schema."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from flctl import results
from flctl.cli.common import (
    DbOption,
    ResultsDirOption,
    console,
    existing_store,
    fail,
    results_folder,
    safe,
)
from flctl.cli.completion import complete_run
from flctl.cli.output import JSON_OPT, print_json
from flctl.cli.runs import run_or_sweep
from flctl.status import Status

if TYPE_CHECKING:
    from pathlib import Path

    from flctl.db import RunRecord
    from flctl.records import RunCheck

# Some run's records failed the check. (2 stays bad input: an unknown run or sweep, no database.)
VERIFY_FAILED_EXIT = 1
# A run a worker holds or will take up again: its files are being written (an epoch file lands before its checksum),
# so it is not checked until it is finished.
IN_PROGRESS = "in progress"
UNVERIFIED_MEANS = "no checksums: written before flctl kept them; their schema was checked"
# verify reads the records beside the database: a results folder that is a file is said as that folder
RECORDS_VOICE = dataclasses.replace(results.CLI, is_a_file="results folder {root!r} is a file, not a folder; give the "
                                    "folder that holds flctl.db and records/ (--results-dir or FLCTL_RESULTS)")


def verify(
    ref: Annotated[Optional[str], typer.Argument(metavar="RUN|SWEEP", help="A run (id or unique prefix) or a sweep "
                                                 "(id, prefix or name) [default: every run in the results folder].",
                                                 autocompletion=complete_run)] = None,
    as_json: JSON_OPT = False,
    db: DbOption = None,
    results_dir: ResultsDirOption = None,
) -> None:
    """Check runs' per-sample records against their checksums and the records' schema.

    Each file is checked against the checksum recorded when it was written, against the schema, and against its
    run (every row's run id); a run's folder holds its record files and checksums, nothing else. A run is ok,
    unverified (trained before flctl recorded checksums: not a failure) or failed, with the file and why (a checksum
    mismatch, a missing or unlisted file, checksums missing where its files were written with them, a file that is
    not the run's, another schema, another run's rows or checksums). Reports, export, the paper bundle and
    flctl.api.records make the same check and refuse what fails it. Runs still training are not checked. Exit 0 when
    no run failed, 1 when one did."""
    from flctl.records import FAILED

    folder = results_folder(results_dir, db, RECORDS_VOICE)
    store = existing_store(folder)
    records_root = folder.layout.records
    if records_root.exists() and not records_root.is_dir():
        fail(f"{str(records_root)!r} is a file, not a folder: flctl keeps the runs' records there, so none can be "
             "checked; move the file aside")
    runs, orphans = _select(store, ref, records_root)
    rows = _check(runs, orphans, records_root)
    counts = {s: sum(r["records"] == s for r in rows) for s in _states()}
    if as_json:
        print_json({"results": str(folder.root), "runs": rows, "summary": counts})
    else:
        _print(rows, counts, folder.root)
    if counts[FAILED]:
        raise typer.Exit(VERIFY_FAILED_EXIT)


def _states() -> tuple[str, ...]:
    """What a run's records are found to be, in the order the summary counts them."""
    from flctl.records import FAILED, OK, UNVERIFIED

    return OK, UNVERIFIED, FAILED, IN_PROGRESS


def _select(store, ref: str | None, records_root: Path) -> tuple[list[RunRecord], list[str]]:
    """The runs to check: ``ref`` as a run or a sweep, else every run in the database; and, without ``ref``, the
    run folders under the records that the database does not know."""
    if ref is None:
        runs = store.list_runs()
        known = {r.id for r in runs}
        folders = sorted(p.name.split("=", 1)[1] for p in records_root.glob("run_id=*") if p.is_dir())
        return runs, [f for f in folders if f not in known]
    run, sweep = run_or_sweep(store, ref)
    if run is not None or sweep is None:
        return [run] if run is not None else [], []
    ids = {r["id"] for r in store.sweep_runs(sweep["id"])}
    return [r for r in store.list_runs() if r.id in ids], []


def _check(runs: list[RunRecord], orphans: list[str], records_root: Path) -> list[dict[str, Any]]:
    """One row per run that has records, or should have (a completed run), in the order given; orphans last."""
    from concurrent.futures import ThreadPoolExecutor

    from flctl import records
    from flctl.layout import records_of
    from flctl.report.data import retrain_command

    def one(item: RunRecord | str) -> dict[str, Any] | None:
        run_id = item if isinstance(item, str) else item.id
        folder = records_of(records_root, run_id)
        row: dict[str, Any] = {"run": run_id, "task": None, "method": None, "status": None, "records": None,
                               "files": 0, "problems": [], "fix": None}
        if not isinstance(item, str):
            row |= {"task": item.task, "method": item.method, "status": item.status}
        completed = not isinstance(item, str) and item.status == Status.COMPLETED
        if not folder.is_dir() and not completed:
            return None                             # nothing written, nothing to check
        if not isinstance(item, str) and item.status in (Status.QUEUED, Status.RUNNING, Status.INTERRUPTED):
            return row | {"records": IN_PROGRESS, "files": len(records.run_files(records_root, run_id))}
        check: RunCheck = records.check_run(records_root, run_id, completed=completed)
        row |= {"records": check.state, "files": len(check.files),
                "problems": [{"path": str(p.path), "problem": p.text, "planted": p.planted} for p in check.problems]}
        if check.problems:
            row["fix"] = records.fix(check, f"train it again: {retrain_command(item)}")
        return row

    with ThreadPoolExecutor(max_workers=4) as pool:     # hashing reads whole files and releases the GIL
        found = list(pool.map(one, [*runs, *orphans]))
    return [r for r in found if r is not None]


def _print(rows: list[dict[str, Any]], counts: dict[str, int], root: Path) -> None:
    from rich.table import Table

    from flctl.records import FAILED, OK, UNVERIFIED

    if not rows:
        console.print(f"no run in {safe(root)} has records to check")
        return
    table = Table("run", "task", "method", "status", "records", "files", "problem")
    for r in rows:
        style = {OK: "green", UNVERIFIED: "yellow", FAILED: "red"}.get(r["records"], "dim")
        first = r["problems"][0]["problem"] if r["problems"] else ""
        more = len(r["problems"]) - 1
        table.add_row(safe(r["run"]), safe(r["task"] or "-"), safe(r["method"] or "-"),
                      safe(r["status"] or "not in the database"), f"[{style}]{r['records']}[/]", str(r["files"]),
                      safe(first) + (f" (+{more} more: --json lists them)" if more > 0 else ""))
    console.print(table)
    for r in rows:
        if r["fix"]:
            console.print(f"run {safe(r['run'])}: {safe(r['fix'])}", highlight=False, soft_wrap=True)
    said = [f"{counts[s]} {s}" + (f" ({UNVERIFIED_MEANS})" if s == UNVERIFIED else "") for s in _states() if counts[s]]
    console.print(f"{len(rows)} run{'s' if len(rows) != 1 else ''}: " + ", ".join(said)
                  + ("" if counts[FAILED] else f"; nothing {FAILED}"), highlight=False, soft_wrap=True)
