"""Every path under a results folder, named once.

A results folder holds:

    flctl.db                          the run database (SQLite), unless --db / FLCTL_DB names another
    records/run_id=<id>/epoch=<e>.parquet   per-sample records (flctl.records writes the files of a run's folder)
    records/run_id=<id>/_checksums.json     their SHA-256s and sizes, written as each file is committed
    runs/<id>/checkpoint.pt           while a run trains (flctl.cell: the checkpoint format)
    runs/<id>/model.pt                the trained weights
    runs/<id>/extras.npz              what the task's figures need
    jobs/<sweep>/                     submitit's job files and logs (private to its owner: flctl.launch)
    jobs/<sweep>/controllers.log      what the local executor's job controllers print
    jobs/<sweep>/submitted.json       the jobs `flctl sweep` started
    jobs/<sweep>/workers/<host>-<pid>.json   one per live worker
    reports/<plot>.png, .pdf          a plot's default output
    reports/samples-<query>.parquet   a sample query's default output

The names are those of the first release: results folders written by any release keep working. No torch and no
database here, so the CLI and the training loop derive their paths from the same place.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path


def records_of(records: Path, run_id: str) -> Path:
    """One run's partition of a records dataset (``records/run_id=<id>/``, hive-style: the folder name is the
    ``run_id`` column pyarrow reads back)."""
    return Path(records) / f"run_id={run_id}"


@dataclass(frozen=True)
class RunFolder:
    """One run's folder, ``runs/<id>/``: what training writes there. Training is handed this folder, not the results
    root, so the names of its files live here rather than on ``Layout`` alone."""

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def checkpoint(self) -> Path:
        """``Cell.state_dict()`` while the run trains; removed once it is done."""
        return self.path / "checkpoint.pt"

    @property
    def model(self) -> Path:
        """The trainable weights of the finished run (an LLM: its LoRA adapter)."""
        return self.path / "model.pt"

    @property
    def extras(self) -> Path:
        """The arrays the task's figures read by key."""
        return self.path / "extras.npz"


@dataclass(frozen=True)
class Layout:
    """Where a results root keeps things. ``root`` may be given as a str; it is held as a Path."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    def not_a_folder(self) -> str | None:
        """Why training cannot write here: a folder flctl keeps under the results folder (records, runs, jobs,
        reports) is a file. Asked before anything trains: found after, it would fail a run that trained for nothing."""
        for folder in (self.records, self.root / "runs", self.jobs, self.reports):
            if folder.exists() and not folder.is_dir():
                return (f"{str(folder)!r} is a file, not a folder: flctl keeps its {folder.name} there; move the "
                        "file aside")
        return None

    # ---- the database ----

    @property
    def db(self) -> Path:
        return self.root / "flctl.db"

    # ---- records and run folders ----

    @property
    def records(self) -> Path:
        """The hive-partitioned Parquet dataset of every run (flctl.records reads and writes it)."""
        return self.root / "records"

    def run_records(self, run_id: str) -> Path:
        """The folder of one run's record files."""
        return records_of(self.records, run_id)

    def run(self, run_id: str) -> RunFolder:
        return RunFolder(self.root / "runs" / run_id)

    def run_dir(self, run_id: str) -> Path:
        return self.run(run_id).path

    def checkpoint(self, run_id: str) -> Path:
        return self.run(run_id).checkpoint

    def model(self, run_id: str) -> Path:
        return self.run(run_id).model

    def clear(self, run_id: str) -> None:
        """Delete a run's records and files (for --rerun): it then starts from scratch."""
        shutil.rmtree(self.run_records(run_id), ignore_errors=True)
        shutil.rmtree(self.run_dir(run_id), ignore_errors=True)

    # ---- sweep jobs (flctl.launch keeps these folders private and checks what it reads back) ----

    @property
    def jobs(self) -> Path:
        return self.root / "jobs"

    def sweep_jobs(self, sweep_id: str) -> Path:
        """The sweep's submitit folder: job pickles, logs, and flctl's own files below."""
        return self.jobs / sweep_id

    def workers(self, sweep_id: str) -> Path:
        return self.sweep_jobs(sweep_id) / "workers"

    def worker_file(self, sweep_id: str, host: str, pid: int) -> Path:
        """The file a live worker leaves while it runs."""
        return self.workers(sweep_id) / f"{host}-{pid}.json"

    def submitted(self, sweep_id: str) -> Path:
        return self.sweep_jobs(sweep_id) / "submitted.json"

    def cancelled(self, sweep_id: str) -> Path:
        """When `flctl cancel` last stopped the sweep (seconds since the epoch): what a waiting command stopped by
        its signal reads to say whether the whole sweep was cancelled."""
        return self.sweep_jobs(sweep_id) / "cancelled"

    def controllers_log(self, sweep_id: str) -> Path:
        return self.sweep_jobs(sweep_id) / "controllers.log"

    # ---- trackers (flctl.loggers) ----

    @property
    def tensorboard_root(self) -> Path:
        """TensorBoard's --logdir: every run logged to it."""
        return self.root / "tensorboard"

    def tensorboard(self, sweep_id: str | None, run_id: str) -> Path:
        """A run's TensorBoard event files: one folder per sweep (`flctl run`'s runs: "runs"), one per run in it."""
        return self.tensorboard_root / (sweep_id or "runs") / run_id

    @property
    def mlflow_db(self) -> Path:
        """The MLflow store runs are logged to where MLFLOW_TRACKING_URI names none."""
        return self.root / "mlflow.db"

    @property
    def wandb(self) -> Path:
        """W&B's folder: its offline runs, for `wandb sync`."""
        return self.root / "wandb"

    # ---- reports ----

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    def plot(self, name: str, of: str | None = None) -> Path:
        """A plot's default output stem (.png and .pdf are added to it), named for what it is ``of`` (a task, a
        sweep): a plot of another sweep is another file, never this one written over."""
        return self.reports / (name if of is None else f"{name}-{re.sub(r'[^A-Za-z0-9._-]+', '_', of)}")

    def samples(self, query: str) -> Path:
        """A per-sample query's default output file."""
        return self.reports / f"samples-{query}.parquet"
