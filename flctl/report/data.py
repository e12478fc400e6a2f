"""What reports read: finished runs from the database and their final per-sample records from Parquet."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.dataset as ds

from flctl import records
from flctl.errors import ConfigError
from flctl.layout import records_of
from flctl.status import REPORTABLE, Status
from flctl.text import shown

if TYPE_CHECKING:
    import numpy as np

    from flctl.db import RunRecord


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


def final_files(records_root: Path, run_ids: Sequence[str]) -> dict[str, Path]:
    """Each run's last eval-epoch file (the final records); ConfigError when a run has none."""
    out: dict[str, Path] = {}
    for run_id in run_ids:
        files = sorted(records_of(records_root, run_id).glob("epoch=*.parquet"))
        if not files:
            raise ConfigError(f"run {run_id} has no per-sample records under {records_root}; "
                              "was the results directory moved? (pass --results-dir)")
        out[run_id] = files[-1]
    return out


def final_records(records_root: Path, run_ids: Sequence[str], columns: Sequence[str] | None = None,
                  split: str | None = None) -> pa.Table:
    """The final per-sample records of the runs, reading only the needed files, columns and split."""
    files = final_files(records_root, run_ids)
    return records.table([str(p) for p in files.values()], columns,
                         filter=(ds.field("split") == split) if split else None)


def all_epochs(records_root: Path, run_ids: Sequence[str], columns: Sequence[str] | None = None) -> pa.Table:
    """Every eval epoch of the runs (for dynamics plots), reading only their folders."""
    files = [str(p) for r in run_ids for p in sorted(records_of(records_root, r).glob("epoch=*.parquet"))]
    return records.table(files, columns, filter=ds.field("run_id").isin(list(run_ids)))


def final_losses(records_root: Path, run_ids: Sequence[str], splits: Sequence[str] = ("train", "test"),
                 threads: int = 4) -> dict[tuple[str, str], np.ndarray]:
    """{(run_id, split): final per-sample losses (finite, float64)} with one small two-column read per run.

    Per-run reads in a few threads beat reading all runs into one table and grouping ~10^7 rows by run id.
    """
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    import pyarrow.parquet as pq

    files = final_files(records_root, run_ids)
    out: dict[tuple[str, str], np.ndarray] = {}

    def one(item) -> None:
        run_id, path = item
        try:
            t = pq.read_table(path, columns=["split", "loss"], filters=[("split", "in", list(splits))])
        except (OSError, pa.ArrowException) as exc:
            raise ConfigError(records.unreadable([str(path)], exc)) from None
        split_col = t["split"].to_numpy(zero_copy_only=False)
        loss = t["loss"].to_numpy()
        for sp in splits:
            values = loss[split_col == sp]
            out[(run_id, sp)] = values[np.isfinite(values)]

    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(one, files.items()))
    return out
