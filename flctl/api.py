"""flctl from Python: notebooks and scripts run a task with a method and read runs and per-sample records back.

    from flctl import api

    api.use_tasks("my_task.py")                           # a plugin task file (or set FLCTL_TASKS)
    run = api.run("my-task", "fl", eps=0.1, epochs=5)      # trains, records, returns the run as the database has it
    table = api.records([run], split="train")             # a pyarrow Table, one row per sample and epoch
    df = table.to_pandas()
    done = api.runs(task="my-task", status=Status.COMPLETED)

The same functions back ``flctl run`` (the configuration, the results folder and database) so that both take the
same defaults: the results folder is ``results_dir``, else FLCTL_RESULTS, else ./results; the database is ``db``,
else FLCTL_DB, else results/flctl.db. Bad input raises flctl.errors.ConfigError before anything is written.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flctl import results
from flctl.api_args import DEVICE, check_arg, check_fields, check_known, checked
from flctl.api_launch import paper, sweep
from flctl.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa

    from flctl.config import RunConfig
    from flctl.db import RunRecord, Store

__all__ = ["Exported", "config", "database_url", "export", "open_store", "paper", "records", "reproduce", "report",
           "results_root", "run", "runs", "sweep", "use_tasks"]

DEFAULT_RESULTS = results.DEFAULT_RESULTS


@checked(results_dir="give a folder, as a str or Path (e.g. results_dir='results')")
def results_root(results_dir: str | Path | None = None) -> Path:
    """The results folder: ``results_dir``, else FLCTL_RESULTS (an empty one is unset), else ./results; a path no
    file system takes is a ConfigError naming where it came from (flctl.results.results_root)."""
    return results.results_root(results_dir)


@checked(db="give a database URL as a str (sqlite:///results/flctl.db, postgresql://user@host/db)")
def database_url(db: str | None, root: Path) -> str:
    """The database: ``db``, else FLCTL_DB, else the results folder's flctl.db. An in-memory SQLite database is a
    ConfigError: it would lose every row when the process exits, and no worker or report could see it."""
    return results.database_url(db, root)


@checked(entries="give each task file, folder or module name as its own str or Path argument: "
                 "use_tasks('a.py', 'b.py')")
def use_tasks(*entries: str | Path) -> None:
    """Load plugin tasks from files, folders of them or module names, as FLCTL_TASKS would (flctl.plugins). Each
    is imported here: a path that is not there, a module that cannot be imported or a file without ``TASK`` is a
    ConfigError here, not an unknown task later."""
    from flctl import plugins

    if not entries:
        raise ConfigError("use_tasks needs a task file, folder or module name: use_tasks('my_task.py')")
    wrong = [e for e in entries if not isinstance(e, (str, os.PathLike)) or not str(e).strip()]
    if wrong:
        raise ConfigError(f"use_tasks({', '.join(map(repr, wrong))}): give each task file, folder or module name as "
                          "its own str or Path argument: use_tasks('a.py', 'b.py')")
    resolved = [plugins.resolve_entry(str(e), Path.cwd()) for e in entries]
    missing = [str(e) for e, r in zip(entries, resolved) if plugins.is_path(str(e)) and not Path(r).exists()]
    if missing:
        raise ConfigError(f"use_tasks: no such file or folder: {', '.join(missing)}")
    for entry in resolved:
        if Path(entry).is_file() and Path(entry).suffix != ".py":
            raise ConfigError(f"use_tasks: {entry} is not a Python file; give the task's .py file (or its folder)")
        problems = plugins.check(entry)
        if problems:
            raise ConfigError(f"use_tasks: {problems[0]}")
    plugins.add(resolved)


@checked(task="give one task's name, a str (see `flctl tasks`)",
         method="give one method's name, a str such as 'fl'; several methods are a sweep (`flctl sweep TASK -m erm,fl`)",
         p_min="give a number in (0, 1], e.g. p_min=0.6")
def config(task: str, method: str = "fl", *, p_min: float | None = None, check_data: bool = True,
           **fields: Any) -> RunConfig:
    """The validated RunConfig of ``task`` trained with ``method``: the task's paper defaults, overridden by
    ``fields`` (RunConfig fields; task options as ``options={...}``). With ``check_data``, a task whose data is
    missing raises here."""
    from flctl.config import resolve
    from flctl.tasks import check_task_data, get_task

    check_arg("device", fields.get("device"), str, DEVICE)
    spec = get_task(task)
    check_fields(spec, fields)
    cfg = resolve(spec, method, dict(fields), p_min)
    check_task_data(spec, cfg.opts, cfg.data_dir, look=check_data)
    return cfg


@checked()
def open_store(results_dir: str | Path | None = None, db: str | None = None, *, create: bool = True) -> Store:
    """The run database of a results folder: made when ``create`` (with the folder, taken back should the database
    not open); else read-only, and it must exist (flctl.results)."""
    return _opened(results_dir, db, create=create)[1]


def _opened(results_dir: str | Path | None, db: str | None, *, create: bool) -> tuple[results.Results, Store]:
    """open_store's folder, found and checked once by the doorway (flctl.results.find, as the CLI finds it), and its
    run database opened: for the functions that need the folder too."""
    folder = results.find(results_dir, db, results.API)
    return folder, folder.open_to_write() if create else folder.open_to_read()


@checked(task="give one task's name, a str (see `flctl tasks`)",
         method="give one method's name, a str such as 'fl'; several methods are a sweep (`flctl sweep TASK -m erm,fl`)",
         p_min="give a number in (0, 1], e.g. p_min=0.6", on_epoch="give a function of one argument, called after each epoch")
def run(task: str, method: str = "fl", *, results_dir: str | Path | None = None, db: str | None = None,
        rerun: bool = False, on_epoch: Callable[[Any], None] | None = None, p_min: float | None = None,
        threads: int | None = None, log_to: str | Iterable[str] = (), **fields: Any) -> RunRecord:
    """Train one configuration (or resume it, or find it completed) and return its run as recorded.

    As ``flctl run``: the same configuration is the same run; ``rerun`` trains a completed one again. A run
    held by a live worker elsewhere raises ConfigError; a training error propagates with the run marked failed.
    ``threads``: torch's threads on a CPU (default: OMP_NUM_THREADS, else chosen from the model's size and the cores
    this process may use). ``log_to``: loggers its epochs go to, live (flctl.loggers: "tensorboard", "mlflow", "wandb")."""
    from flctl.knobs import threads_of_a_run
    from flctl.loggers import check
    from flctl.runner import train_unless_done

    cfg = config(task, method, p_min=p_min, **fields)
    chosen = threads_of_a_run(threads)
    loggers = check(log_to)      # the classes found once: the run's session holds them
    folder, store = _opened(results_dir, db, create=True)
    try:
        found, ending = train_unless_done(cfg, store, folder.layout, rerun=rerun,
                                          on_epoch=on_epoch, threads=chosen, log_to=loggers)
        if found is not None:
            return found
        record = store.get_run(cfg.run_id)
        if ending is None and record is not None:
            raise ConfigError(f"run {cfg.run_id} is being trained by {record.host} pid {record.pid}; wait for it")
        if ending is not None and ending.error is not None:    # recorded by its row (flctl.outcomes); raised as is
            raise ending.error
        assert record is not None
        return record
    finally:
        store.close()


@checked(task="give one task as a str (or leave it out for all)",
         method="give one method as a str (or leave it out for all)",
         status="give one status as a str (or leave it out for all)")
def runs(*, results_dir: str | Path | None = None, db: str | None = None, task: str | None = None,
         method: str | None = None, status: str | None = None) -> list[RunRecord]:
    """The recorded runs, newest first, optionally of one task, method and status."""
    from flctl.status import STATUSES

    if status is not None and status not in STATUSES:
        raise ConfigError(f"status={status!r}: choose one of {', '.join(STATUSES)}")
    from flctl.tasks import canonical_name

    task = None if task is None else canonical_name(task)     # TWO-MOONS is two-moons, as for api.run
    store = open_store(results_dir, db, create=False)
    try:
        found = store.list_runs(task=task, method=method, status=status)
        if not found:         # none: a typo of a name no run has, or truly none yet
            check_known(store, task, method)
        return found
    finally:
        store.close()


@checked(out="give a file (a plot's: a path stem), a str or Path",
         columns="give a list of column names, e.g. ['train.avg_loss']")
def report(*, table: str | None = None, plot: str | None = None, samples: str | None = None, by: str | None = None,
           sweep: str | None = None, task: str | None = None, columns: Iterable[str] | None = None,
           split: str | None = None, k: int = 16, min_seeds: int = 1, eps: float | None = None,
           methods: str | None = None, top: int = 20, digits: int = 2, fmt: str | None = None,
           out: str | Path | None = None, results_dir: str | Path | None = None, db: str | None = None) -> Any:
    """A report as `flctl report` makes it (flctl.report.flow), of a sweep, a task or every finished run: exactly one
    of ``table`` (its ``table``, a flctl.report.tables.Table, and ``text`` rendered in ``fmt``; written to ``out``
    if given), ``plot`` (PNG and PDF written to ``out``, a path stem, else under RESULTS/reports/) or ``samples`` (its
    ``frame``, a pyarrow Table, written as Parquet). Returns a flctl.report.flow.Made: also ``files`` written,
    ``notes`` and ``runs``. ConfigError for bad input, before any database is read; nothing is written to the
    database."""
    from functools import partial

    from flctl.db.reads import latest_sweeps
    from flctl.report.flow import Request, make_report

    request = Request(table=table, plot=plot, samples=samples, by=by, sweep=sweep, task=task,
                      columns=None if columns is None else tuple(columns), split=split, k=k, min_seeds=min_seeds,
                      eps=eps, methods=methods, top=top, digits=digits, fmt=fmt,
                      out=None if out is None else Path(out)).check()
    folder, store = _opened(results_dir, db, create=False)
    try:
        return make_report(store, folder.layout, request, partial(latest_sweeps, store))
    finally:
        store.close()


@checked(runs="records takes a list of runs or run ids, not a single one: records([run])")
def records(runs: Iterable[RunRecord | str], *, results_dir: str | Path | None = None, split: str | None = None,
            epoch: int | None = None) -> pa.Table:
    """The per-sample records of ``runs`` (records or run ids): one row per sample, split and evaluated epoch,
    with the columns of docs/design.md (loss, multiplier, prediction, ...). ``.to_pandas()`` for a DataFrame."""
    from flctl.db import RunRecord
    from flctl.layout import Layout, records_of
    from flctl.records import read

    given = list(runs)
    if not given:
        raise ConfigError("records: no runs given; pass a list of runs (api.runs(), api.run(...)) or run ids")
    wrong = [r for r in given if not isinstance(r, (str, RunRecord))]
    if wrong:
        raise ConfigError(f"records: {wrong[0]!r} is neither a run nor a run id; pass runs from api.runs() or "
                          "api.run(...), or their ids")
    if split is not None and split not in ("train", "test"):
        raise ConfigError(f"split={split!r}: choose 'train' or 'test' (or leave it out for both)")
    if epoch is not None and (isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0):
        raise ConfigError(f"epoch={epoch!r}: give an evaluated epoch as an int (or leave it out for all)")
    ids = [r if isinstance(r, str) else r.id for r in given]
    folder = Layout(results_root(results_dir)).records
    unknown = [i for i in ids if not records_of(folder, i).is_dir()]
    if unknown:     # a typo, or a run of another results folder: not an empty table
        raise ConfigError(f"no records of run(s) {', '.join(unknown)} in {folder}; give full run ids (api.runs()) "
                          "and the results_dir they were trained in")
    if epoch is not None:
        for i in ids:
            have = sorted(int(p.stem.partition("=")[2]) for p in records_of(folder, i).glob("epoch=*.parquet")
                          if p.stem.partition("=")[2].isdigit())
            if epoch not in have:
                raise ConfigError(f"run {i} has no records of epoch {epoch}; its evaluated epochs: "
                                  f"{', '.join(map(str, have)) or 'none'}")
    return read(folder, ids, split=split, epoch=epoch)


@checked(run="give a run's id (or a unique prefix of it) as a str, e.g. api.runs()[0].id",
         on_epoch="give a function of one argument, called after each epoch")
def reproduce(run: str, *, results_dir: str | Path | None = None, db: str | None = None,
              on_epoch: Callable[[Any], None] | None = None) -> Any:
    """Train the completed ``run`` again in a scratch folder, as ``flctl reproduce`` does, and return the
    flctl.reproduce.Reproduction: ``identical``, else its ``difference`` (epoch, split, sample id, column, size);
    ``versions``: the libraries whose versions differ from the run's among those that can move a number
    (flctl's own and flctl.versions.CHANGES_NUMBERS). The results folder and database are only
    read."""
    from flctl.reproduce import reproduce as train_again

    folder, store = _opened(results_dir, db, create=False)
    try:
        return train_again(store, folder.layout.records, run, on_epoch)
    finally:
        store.close()


@dataclasses.dataclass(frozen=True)
class Exported:
    """What an export did: the runs named, the finished ones it logged (or tried to), and each tracker's failures
    (``logging.not_logged``: tracker -> run ids it did not log; ``logging.why``: its first failure)."""

    runs: list[RunRecord]
    finished: list[RunRecord]
    loggers: tuple[str, ...]
    logging: Any


@checked(ref="give a run's id (or a unique prefix of it) or a sweep's id, prefix or name, as a str",
         to="give a tracker's name or a list of them, e.g. to=['tensorboard']")
def export(ref: str, *, to: str | Iterable[str], results_dir: str | Path | None = None,
           db: str | None = None) -> Exported:
    """Log the finished runs ``ref`` names (a run, or a sweep's cells) to trackers after the fact, as ``flctl export``
    does (flctl.loggers.export): each evaluated epoch's metrics as the run's records keep them, keyed by run id, so
    that exporting again replaces what an earlier export or live log left. The records are checked first (as
    `flctl verify`); ConfigError for bad input, no finished run or records that fail, before any tracker hears of
    one. A tracker that fails is tried for no further run: its failures are in the result, not raised."""
    from flctl.loggers import check

    loggers = check(to).names
    folder, store = _opened(results_dir, db, create=False)
    return export_from(store, folder, ref, loggers)


def export_from(store: Store, folder: results.Results, ref: str, loggers: tuple[str, ...]) -> Exported:
    """``export`` from a store opened already (closed here) in ``folder`` and loggers checked already: `flctl export`
    opens its database as every command does, with the command's words for what is missing."""
    from flctl.db.reads import runs_of
    from flctl.loggers.export import export as replay
    from flctl.report.data import gate
    from flctl.status import REPORTABLE

    try:
        runs, sweep_id = runs_of(store, ref)
    finally:
        store.close()
    finished = [r for r in runs if r.status in REPORTABLE]
    if not finished:
        raise ConfigError(f"{ref}: no finished run to export ({len(runs)} not finished yet; see `flctl status`)")
    gate(folder.layout.records, finished, read="all")    # as verify checks them, before any tracker hears of one
    return Exported(runs, finished, loggers, replay(finished, folder.root, loggers, sweep_id))
