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

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flctl.api_args import (
    DEVICE,
    LAUNCH,
    check_arg,
    check_fields,
    check_known,
    checked,
    in_memory,
    make_results,
    not_a_file,
    take_back,
    url_problem,
)
from flctl.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa

    from flctl.config import RunConfig
    from flctl.db import RunRecord, Store

DEFAULT_RESULTS = "results"


@checked(results_dir="give a folder, as a str or Path (e.g. results_dir='results')")
def results_root(results_dir: str | Path | None = None) -> Path:
    """The results folder: ``results_dir``, else FLCTL_RESULTS (an empty one is unset), else ./results; a path no
    file system takes is a ConfigError naming where it came from (the environment is read by no option parser)."""
    from flctl.text import path_problem

    chosen = results_dir if results_dir is not None else os.environ.get("FLCTL_RESULTS") or DEFAULT_RESULTS
    if (why := path_problem("results_dir" if results_dir is not None else "FLCTL_RESULTS", str(chosen))) is not None:
        raise ConfigError(why)
    return Path(chosen)


@checked(db="give a database URL as a str (sqlite:///results/flctl.db, postgresql://user@host/db)")
def database_url(db: str | None, root: Path) -> str:
    """The database: ``db``, else FLCTL_DB, else the results folder's flctl.db. An in-memory SQLite database is a
    ConfigError: it would lose every row when the process exits, and no worker or report could see it."""
    from flctl.layout import Layout

    url = db or os.environ.get("FLCTL_DB") or Layout(root).db_url
    if in_memory(url):
        raise ConfigError(f"{'--db' if db else 'FLCTL_DB'} {url!r} is an in-memory database, gone when this "
                          "command exits; give a file (sqlite:///results/flctl.db) or a server "
                          "(postgresql://user@host/db)")
    if (why := url_problem(url)) is not None:
        raise ConfigError(why)
    return url


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
    """The run database of a results folder (made when ``create``; else read-only, and it must exist)."""
    from flctl.db import Store
    from flctl.errors import StoreError
    from flctl.layout import Layout

    root = results_root(results_dir)
    url = database_url(db, root)
    not_a_file(root)
    if not create and db is None and not os.environ.get("FLCTL_DB") and not Layout(root).db.is_file():
        raise ConfigError(f"no runs in {str(root)!r}: it holds no flctl.db; give the results_dir the runs were "
                          "trained in")
    made = make_results(root) if create else []
    try:
        return Store.open(url, readonly=not create)
    except Exception as exc:
        # as `flctl` (cli.common.open_results): a database that cannot be opened (a bad db=, a server that does not
        # answer) leaves no results folder behind
        take_back(made)
        if isinstance(exc, StoreError) and str(exc).startswith("not a database URL"):   # the caller's input: one
            raise ConfigError(f"db={db!r}: {exc}") from None                             # line that names the fix
        raise


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
    from flctl.layout import Layout
    from flctl.loggers import check
    from flctl.runner import train_unless_done

    cfg = config(task, method, p_min=p_min, **fields)
    chosen = threads_of_a_run(threads)
    loggers = check([log_to] if isinstance(log_to, str) else log_to)
    store = open_store(results_dir, db)
    try:
        found, result = train_unless_done(cfg, store, Layout(results_root(results_dir)), rerun=rerun,
                                          on_epoch=on_epoch, threads=chosen, log_to=loggers)
        if found is not None:
            return found
        record = store.get_run(cfg.run_id)
        if result is None and record is not None:
            raise ConfigError(f"run {cfg.run_id} is being trained by {record.host} pid {record.pid}; wait for it")
        assert record is not None
        return record
    finally:
        store.close()


@checked(task="give one task's name, a str (see `flctl tasks`); several tasks are several sweeps",
         spec="give a sweep spec's TOML file, a str or Path (e.g. spec='sweeps/two-moons.toml')",
         options="give the task options as a dict, e.g. options={'degree': 10}", name="give the sweep's name, a str",
         device=DEVICE, data_dir="give the datasets' folder, a str or Path",
         objective="give a metric, a str such as 'test.max_loss'",
         tune="give the number of trials of the search, an int such as tune=20",
         parallel="give the number of trials launched at once, an int such as parallel=2", launch=LAUNCH)
def sweep(task: str | None = None, *, spec: str | Path | None = None, seeds: int | None = None,
          options: dict[str, Any] | None = None, name: str | None = None, device: str | None = None,
          data_dir: str | Path | None = None, results_dir: str | Path | None = None, db: str | None = None,
          wait: bool = True, tune: int | None = None, objective: str | None = None, direction: str = "min",
          parallel: int = 1, launch: dict[str, Any] | None = None, dry_run: bool = False, **axes: Any) -> Any:
    """Plan a grid of runs and fill what is not done, as ``flctl sweep`` does: the same checks, run ids, database
    rows, launchers (flctl.launch.backends) and workers. ``axes``: run fields, each a value, a list of values or a
    range written as on the command line (``lr="1e-4..1e-2:5"``); or ``spec``, a TOML spec file. ``launch``: the
    launch flags by name (``executor``, ``workers``, ``batch_runs``, ...; flctl.launch.LaunchFlags). With ``wait``
    (the default) it returns once no cell is left to train: ``{"sweep": id, "cells": N, "total": counts by status,
    "errors": ...}`` (flctl.status.ledger); without, once its workers are started. With ``tune``: a TPE search of
    that many trials (``{"sweep": id, "study": the Optuna study}``). With ``dry_run``: the plan, written nowhere
    (flctl.launch.plan.SweepPlan: its ``sweep_id``, ``configs``, ``settings``), as ``flctl sweep --dry-run``. Bad input
    raises ConfigError before anything is written; a wait its workers leave unfinished raises
    flctl.launch.wait.SweepStopped."""
    import dataclasses

    from flctl.launch import plan_sweep
    from flctl.launch.flow import fill_sweep
    from flctl.sweep import load_spec, spec_from_values

    if (spec is None) == (task is None):
        raise ConfigError("give either a task with axes or spec=, not both or neither")
    # launch keys that are not flctl's flags are the launcher's own options: the spec's [launch] table takes them
    extra = {k: v for k, v in (launch or {}).items() if k not in _flag_names()}
    flags = _launch_flags({k: v for k, v in (launch or {}).items() if k in _flag_names()})
    folder = None if data_dir is None else str(data_dir)
    if spec is not None:
        if axes or seeds is not None:
            raise ConfigError("give either spec= or axes, not both")
        chosen = load_spec(Path(spec))
        chosen = chosen if device is None else dataclasses.replace(chosen, device=device)
    else:
        assert task is not None
        chosen = spec_from_values(task, axes, seeds=seeds, options=options or {}, name=name,
                                  device="cpu" if device is None else device, data_dir=folder)
    if extra:
        chosen = dataclasses.replace(chosen, launch={**chosen.launch, **extra})
    root = results_root(results_dir)
    url = database_url(db, root)
    planned = plan_sweep(chosen, flags, results_root=root, objective=objective, direction=direction, tune=tune,
                         parallel=parallel, dry_run=dry_run)
    if dry_run:
        return planned
    store = open_store(results_dir, db)
    try:
        filled = fill_sweep(planned, store, url, root, wait=wait, direction=direction)
    finally:
        store.close()
    if filled.study is not None:
        return {"sweep": filled.sweep_id, "study": filled.study}
    if filled.stopped is not None:             # a signal stopped this process's worker: its cell went back
        from flctl.launch.wait import SweepStopped, stopped_line

        raise SweepStopped(stopped_line(root, filled.sweep_id), filled.stopped)
    return {"sweep": filled.sweep_id, **(filled.ledger or {})}


@checked(only="give the tables and figures as one str, e.g. only='table:1,figure:6' (or 'table')",
         specs="give the folder of the paper's specs, a str or Path", device=DEVICE,
         data_dir="give the datasets' folder, a str or Path",
         out="give the bundle's folder, a str or Path (default RESULTS/paper)", launch=LAUNCH)
def paper(*, only: str | None = None, scale: str = "paper", specs: str | Path | None = None,
          device: str | None = None, data_dir: str | Path | None = None, results_dir: str | Path | None = None,
          db: str | None = None, out: str | Path | None = None, report_only: bool = False, dry_run: bool = False,
          wait: bool = False, launch: dict[str, Any] | None = None) -> Any:
    """The paper's programme, as ``flctl paper`` runs it (flctl.paper.flow): planned with its cost, its missing cells
    launched (``only``: these tables and figures, e.g. "table:1"; ``scale`` "smoke": tiny and fast), then the bundle
    written (``out``, default RESULTS/paper or RESULTS/paper-smoke). Returns a flctl.paper.flow.PaperRun (its
    ``bundle``: the index.html written; ``programme``: what each table and figure has and lacks); with ``dry_run``,
    the PaperPlan (its ``programme``, with the cost), writing nothing. ConfigError for bad input, before anything is
    written."""
    from flctl.paper.flow import fill_paper, plan_paper
    from flctl.sweep import SHIPPED_SPECS

    if dry_run and report_only:
        raise ConfigError("give dry_run or report_only, not both")
    flags = _launch_flags(launch)
    root = results_root(results_dir)
    url = database_url(db, root)
    plan = plan_paper(url=url, specs=Path(specs) if specs is not None else SHIPPED_SPECS, launch=flags, only=only,
                      scale=scale, device=device, data_dir=None if data_dir is None else str(data_dir),
                      check_data=not (dry_run or report_only))
    not_a_file(root)                                # said as itself, not as a bundle folder under a file
    bundle = Path(out) if out is not None else None
    plan.bundle_folder(root, bundle)                 # as `flctl paper`: a bundle that cannot be written, before
    if dry_run:                                      # any folder is made, a dry run included
        return plan
    if not report_only:
        open_store(results_dir, db).close()          # the results folder and database, made as `flctl paper` does
    else:
        make_results(root)                          # reading the database only needs a folder for the bundle
    return fill_paper(plan, root=root, out=bundle, wait=wait, report_only=report_only)


def _flag_names() -> set[str]:
    from flctl.launch import LaunchFlags

    return set(LaunchFlags.__dataclass_fields__)


def _launch_flags(launch: dict[str, Any] | None) -> Any:
    """flctl.launch.LaunchFlags from a dict of them by name (ConfigError naming an unknown one)."""
    from flctl.launch import LaunchFlags

    check_arg("launch", launch, Mapping, LAUNCH)
    if unknown := sorted(set(launch or {}) - set(LaunchFlags.__dataclass_fields__)):
        raise ConfigError(f"launch: unknown key(s) {', '.join(unknown)}; valid: "
                          f"{', '.join(sorted(LaunchFlags.__dataclass_fields__))}")
    return LaunchFlags(**(launch or {}))


@checked(task="give one task as a str (or leave it out for all)",
         method="give one method as a str (or leave it out for all)",
         status="give one status as a str (or leave it out for all)")
def runs(*, results_dir: str | Path | None = None, db: str | None = None, task: str | None = None,
         method: str | None = None, status: str | None = None) -> list[RunRecord]:
    """The recorded runs, newest first, optionally of one task, method and status."""
    from flctl.status import STATUSES

    if status is not None and status not in STATUSES:
        raise ConfigError(f"status={status!r}: choose one of {', '.join(STATUSES)}")
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
    from flctl.report.flow import Request, make_report

    request = Request(table=table, plot=plot, samples=samples, by=by, sweep=sweep, task=task,
                      columns=None if columns is None else tuple(columns), split=split, k=k, min_seeds=min_seeds,
                      eps=eps, methods=methods, top=top, digits=digits, fmt=fmt,
                      out=None if out is None else Path(out)).check()
    store = open_store(results_dir, db, create=False)
    try:
        return make_report(store, results_root(results_dir), request)
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
    ``versions``: the libraries whose versions differ from the run's. The results folder and database are only
    read."""
    from flctl.layout import Layout
    from flctl.reproduce import reproduce as train_again

    store = open_store(results_dir, db, create=False)
    try:
        return train_again(store, Layout(results_root(results_dir)).records, run, on_epoch)
    finally:
        store.close()
