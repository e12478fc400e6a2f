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
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flctl.errors import ConfigError
from flctl.status import Status

if TYPE_CHECKING:
    import pyarrow as pa

    from flctl.config import RunConfig
    from flctl.db import RunRecord, Store

DEFAULT_RESULTS = "results"


def results_root(results_dir: str | Path | None = None) -> Path:
    """The results folder: ``results_dir``, else FLCTL_RESULTS (an empty one is unset), else ./results."""
    return Path(results_dir if results_dir is not None else os.environ.get("FLCTL_RESULTS") or DEFAULT_RESULTS)


def database_url(db: str | None, root: Path) -> str:
    """The database: ``db``, else FLCTL_DB, else the results folder's flctl.db. An in-memory SQLite database is a
    ConfigError: it would lose every row when the process exits, and no worker or report could see it."""
    from flctl.layout import Layout

    url = db or os.environ.get("FLCTL_DB") or Layout(root).db_url
    if _in_memory(url):
        raise ConfigError(f"{'--db' if db else 'FLCTL_DB'} {url!r} is an in-memory database, gone when this "
                          "command exits; give a file (sqlite:///results/flctl.db) or a server "
                          "(postgresql://user@host/db)")
    return url


def use_tasks(*entries: str | Path) -> None:
    """Load plugin tasks from files, folders of them or module names, as FLCTL_TASKS would (flctl.plugins). A path
    that is not there is a ConfigError here, not an unknown task later."""
    from flctl import plugins

    resolved = [plugins.resolve_entry(str(e), Path.cwd()) for e in entries]
    missing = [str(e) for e, r in zip(entries, resolved) if plugins.is_path(str(e)) and not Path(r).exists()]
    if missing:
        raise ConfigError(f"use_tasks: no such file or folder: {', '.join(missing)}")
    plugins.add(resolved)


def config(task: str, method: str = "fl", *, p_min: float | None = None, check_data: bool = True,
           **fields: Any) -> RunConfig:
    """The validated RunConfig of ``task`` trained with ``method``: the task's paper defaults, overridden by
    ``fields`` (RunConfig fields; task options as ``options={...}``). With ``check_data``, a task whose data is
    missing raises here."""
    from flctl.config import resolve
    from flctl.tasks import check_task_data, get_task

    spec = get_task(task)
    cfg = resolve(spec, method, dict(fields), p_min)
    check_task_data(spec, cfg.opts, cfg.data_dir, look=check_data)
    return cfg


def open_store(results_dir: str | Path | None = None, db: str | None = None, *, create: bool = True) -> Store:
    """The run database of a results folder (made when ``create``; else read-only, and it must exist)."""
    from flctl.db import Store

    root = results_root(results_dir)
    url = database_url(db, root)
    if create:
        root.mkdir(parents=True, exist_ok=True)
    return Store.open(url, readonly=not create)


def run(task: str, method: str = "fl", *, results_dir: str | Path | None = None, db: str | None = None,
        rerun: bool = False, on_epoch: Callable[[Any], None] | None = None, p_min: float | None = None,
        **fields: Any) -> RunRecord:
    """Train one configuration (or resume it, or find it completed) and return its run as recorded.

    As ``flctl run``: the same configuration is the same run; ``rerun`` trains a completed one again. A run
    held by a live worker elsewhere raises ConfigError; a training error propagates with the run marked failed."""
    from flctl.layout import Layout
    from flctl.runner import execute
    from flctl.status import TRAINABLE

    cfg = config(task, method, p_min=p_min, **fields)
    store = open_store(results_dir, db)
    try:
        previous = store.get_run(cfg.run_id)
        if previous is not None and previous.status == Status.COMPLETED and not rerun:
            return previous
        fresh = rerun or (previous is not None and previous.status == Status.DIVERGED)
        allow = (*TRAINABLE, Status.DIVERGED, Status.COMPLETED) if rerun else (*TRAINABLE, Status.DIVERGED)
        result = execute(cfg, store, Layout(results_root(results_dir)), on_epoch=on_epoch, allow=allow, fresh=fresh)
        record = store.get_run(cfg.run_id)
        if result is None and record is not None:
            raise ConfigError(f"run {cfg.run_id} is being trained by {record.host} pid {record.pid}; wait for it")
        assert record is not None
        return record
    finally:
        store.close()


def runs(*, results_dir: str | Path | None = None, db: str | None = None, task: str | None = None,
         method: str | None = None, status: str | None = None) -> list[RunRecord]:
    """The recorded runs, newest first, optionally of one task, method and status."""
    store = open_store(results_dir, db, create=False)
    try:
        return store.list_runs(task=task, method=method, status=status)
    finally:
        store.close()


def records(runs: Iterable[RunRecord | str], *, results_dir: str | Path | None = None, split: str | None = None,
            epoch: int | None = None) -> pa.Table:
    """The per-sample records of ``runs`` (records or run ids): one row per sample, split and evaluated epoch,
    with the columns of docs/design.md (loss, multiplier, prediction, ...). ``.to_pandas()`` for a DataFrame."""
    from flctl.layout import Layout, records_of
    from flctl.records import read

    ids = [r if isinstance(r, str) else r.id for r in runs]
    folder = Layout(results_root(results_dir)).records
    unknown = [i for i in ids if not records_of(folder, i).is_dir()]
    if unknown:     # a typo, or a run of another results folder: not an empty table
        raise ConfigError(f"no records of run(s) {', '.join(unknown)} in {folder}")
    return read(folder, ids, split=split, epoch=epoch)


def _in_memory(url: str) -> bool:
    if not url.startswith("sqlite"):
        return False
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:       # Store.open says what is wrong with it
        return False
    return parsed.get_backend_name() == "sqlite" and (
        not parsed.database or parsed.database == ":memory:" or parsed.query.get("mode") == "memory"
        or parsed.database.startswith("file::memory:"))
