"""What reports read: finished runs from the database and their final per-sample records from Parquet.

Every read of records here checks the runs it reads first (``gate``: flctl.records.check_run, the check `flctl
verify` makes) and refuses a run that fails, in one line that names the run, the file, how to repair it and `flctl
verify RUN`. A run written before flctl kept checksums is unverified and read as it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Union

import pyarrow as pa
import pyarrow.dataset as ds

from flctl import records
from flctl.errors import ConfigError
from flctl.status import REPORTABLE, Status
from flctl.text import shown

if TYPE_CHECKING:
    import numpy as np

    from flctl.db import RunRecord

# A run as the readers take it: its record from the database (a refusal then spells out the command that trains it
# again) or its id.
RunRef = Union["RunRecord", str]


def select_runs(store, *, sweep: str | None = None, task: str | None = None,
                statuses: Iterable[str] = REPORTABLE) -> list[RunRecord]:
    """Finished runs of a sweep (id, prefix or name) or a task; ConfigError when nothing matches."""
    statuses = set(statuses)
    if sweep is not None:
        found = store.get_sweep(sweep)
        if found is None:
            raise ConfigError(f"no sweep {shown(sweep)}; list them with `flctl sweeps`")
        ids = {r["id"] for r in store.sweep_runs(found["id"])}
        runs = [r for r in store.list_runs(task=task) if r.id in ids]
        if not any(r.status == Status.COMPLETED for r in runs):
            raise ConfigError(f"sweep {found['id']} has no completed cells yet; see `flctl status {found['id']}`")
    else:
        runs = store.list_runs(task=task)
    runs = [r for r in runs if r.status in statuses]
    if not runs:
        what = f"task {task!r}" if task else "the database"
        raise ConfigError(f"no finished runs match in {what}; list them with `flctl runs`")
    return runs


def _id(run: RunRef) -> str:
    return run if isinstance(run, str) else run.id


def retrain_command(run: RunRef) -> str:
    """How to train ``run`` again from scratch, as the fix a refusal names: `flctl run TASK --method M ... --rerun`
    with the options that set it apart from the task's defaults (checked to resolve to the same run id), else, from
    an id alone or a configuration that does not resolve here, where to find its options."""
    if isinstance(run, str):
        return records.RETRAIN_BY_ID.format(run_id=run)
    import shlex

    from flctl.config import FIELDS, resolve
    from flctl.tasks import get_task

    stored = dict(run.config)
    try:
        task = get_task(run.task)
        # where it ran: the task's defaults may depend on the device (fashion-mnist's model)
        place = {k: stored[k] for k in ("device", "data_dir") if stored.get(k) not in (None, FIELDS[k].default)}
        base = resolve(task, run.method, place).to_dict()
        given = {name: stored.get(name) for name, f in FIELDS.items()
                 if name != "method" and stored.get(name) is not None and stored.get(name) != base.get(name)}
        given |= place
        options = {k: v for k, v in (stored.get("options") or {}).items() if base["options"].get(k) != v}
        if resolve(task, run.method, {**given, "options": options}).run_id != run.id:
            return records.RETRAIN_BY_ID.format(run_id=run.id)
    except (ConfigError, KeyError, TypeError, ValueError):
        return records.RETRAIN_BY_ID.format(run_id=run.id)
    words = ["flctl", "run", run.task, "--method", run.method]
    for name, value in given.items():
        words += [FIELDS[name].flag, repr(value) if isinstance(value, float) else str(value)]
    for key, value in sorted(options.items()):
        words += ["-o", f"{key}={repr(value) if isinstance(value, float) else value}"]
    return "`" + shlex.join([*words, "--rerun"]) + "`"


def gate(records_root: Path, runs: Sequence[RunRef], *, read: str = "final") -> list[records.RunCheck]:
    """Each run checked as `flctl verify` checks it (flctl.records.check_run; a completed run has records), reading
    ``read`` of its files whole (schema, SHA-256, rows): "final" (its last eval epoch's), "all", or "none" (names
    and sizes only, for a reader of none of them: a table of summary metrics); ConfigError, one line that names the
    run, the file, the fix and `flctl verify RUN`, for the first run that fails."""
    from concurrent.futures import ThreadPoolExecutor

    def one(run: RunRef) -> records.RunCheck:
        files = records.run_files(records_root, _id(run))
        deep = None if read == "all" else [files[-1].name] if read == "final" and files else []
        return records.check_run(records_root, _id(run), deep=deep,
                                 completed=not isinstance(run, str) and run.status == Status.COMPLETED)

    # Hashing reads whole files and releases the GIL: a few threads keep a disk or a page cache busy.
    with ThreadPoolExecutor(max_workers=4) as pool:
        checks = list(pool.map(one, runs))
    for run, check in zip(runs, checks):
        if check.problems:
            raise ConfigError(records.refusal(check, f"train it again: {retrain_command(run)}"))
    return checks


def checked(records_root: Path, runs: Sequence[RunRef], *, final: bool = True) -> dict[str, list[Path]]:
    """{run id: the record files a report reads (its last eval epoch's when ``final``, else every epoch's)}, each
    run checked first (``gate``, over those files); ConfigError, one line, for a run that has no records or fails the
    check."""
    for run in runs:
        if not records.run_files(records_root, _id(run)):
            raise ConfigError(f"run {_id(run)} has no per-sample records under {records_root}; "
                              "was the results directory moved? (pass --results-dir)")
    checks = gate(records_root, runs, read="final" if final else "all")
    return {c.run_id: (c.files[-1:] if final else c.files) for c in checks}


def final_files(records_root: Path, runs: Sequence[RunRef]) -> dict[str, Path]:
    """Each run's last eval-epoch file (the final records), checked; ConfigError when a run has none or fails."""
    return {run_id: files[-1] for run_id, files in checked(records_root, runs).items()}


def final_records(records_root: Path, runs: Sequence[RunRef], columns: Sequence[str] | None = None,
                  split: str | None = None) -> pa.Table:
    """The final per-sample records of the runs, reading only the needed files, columns and split."""
    files = final_files(records_root, runs)
    return records.table([str(p) for p in files.values()], columns,
                         filter=(ds.field("split") == split) if split else None)


def all_epochs(records_root: Path, runs: Sequence[RunRef], columns: Sequence[str] | None = None) -> pa.Table:
    """Every eval epoch of the runs (for dynamics plots), reading only their folders."""
    files = [str(p) for found in checked(records_root, runs, final=False).values() for p in found]
    return records.table(files, columns, filter=ds.field("run_id").isin([_id(r) for r in runs]))


def final_losses(records_root: Path, runs: Sequence[RunRef], splits: Sequence[str] = ("train", "test"),
                 threads: int = 4) -> dict[tuple[str, str], np.ndarray]:
    """{(run_id, split): final per-sample losses (finite, float64)} with one small two-column read per run.

    Per-run reads in a few threads beat reading all runs into one table and grouping ~10^7 rows by run id.
    """
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    files = final_files(records_root, runs)
    out: dict[tuple[str, str], np.ndarray] = {}

    def one(item) -> None:
        run_id, path = item
        t = records.read_file(path, ["split", "loss"], filter=ds.field("split").isin(list(splits)))
        split_col = t["split"].to_numpy(zero_copy_only=False)
        loss = t["loss"].to_numpy()
        for sp in splits:
            values = loss[split_col == sp]
            out[(run_id, sp)] = values[np.isfinite(values)]

    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(one, files.items()))
    return out
