"""Optuna studies kept in the run database, so optuna-dashboard can open a sweep.

- A grid sweep is mirrored as a study ``flctl-<sweep id>`` whose search space is the grid (GridSampler) and
  whose trials are the sweep's finished cells (params = the varying axes, value = the objective metric).
- ``flctl sweep --tune N`` runs a TPE search instead (flctl.tpe_search): its study ``flctl-<sweep id>`` (a ``t``
  id, flctl.sweep.tune_id) is the sweep's only study: its cells (one per trial, the set growing as trials are asked)
  are not mirrored as a grid, whose categorical space is fixed when the study is created.

What both kinds share is here: the objective and its direction, the lock under which Optuna's tables are made, a
run's parameters as a trial's, and the space each searches (``varying``: the grid's; ``search_space``: the TPE's).
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from itertools import groupby
from typing import Any, Literal, NamedTuple

from flctl.config import AXIS_FIELDS, RunConfig
from flctl.db import SCHEMA_LOCK, existing_storage
from flctl.db.schema import Run, SweepCell
from flctl.db.sqlite import READ_ONLY
from flctl.errors import ConfigError
from flctl.metrics import SPLITS, SUMMARY_METRICS
from flctl.status import REPORTABLE
from flctl.study_rdb import Cells, add_trials, marking, trial_of

# The metric a sweep's study records when its spec and command line name none.
DEFAULT_OBJECTIVE = "train.avg_loss"
# Optuna's schema is created under the database-wide lock that flctl's own is created under (Store.exclusive): two
# first syncs, a tuner and a sync, or a sync beside a first `flctl run`, cannot both create tables. A tuner asks
# under it too (flctl.tpe_search).
OPTUNA_LOCK = SCHEMA_LOCK
# One grid mirror at a time (sync_sweep): a cell is one trial however many workers sync at once. Its own lock, not
# OPTUNA_LOCK, so that whoever holds it is a mirror, which takes the cells of a worker that found it held.
MIRROR_LOCK = "mirror"
# The finished cells a mirror reads and adds at a time (a transaction of trials each), and the most times a mirror
# takes the lock again for cells that finished while it held it: a worker exits, however busy the database.
PAGE, ROUNDS = 500, 10
# A trial's parameters: every field a sweep may vary (flctl.config.FIELDS), so distinct runs are distinct trials.
PARAM_FIELDS = AXIS_FIELDS
# The grid's sampler orders the grid only when it samples (flctl adds the cells as trials); seeded all the same.
GRID_SEED = 0


def check_objective(objective: str, direction: str) -> None:
    valid = [f"{s}.{m}" for s in SPLITS for m in SUMMARY_METRICS]
    if objective not in valid:
        raise ConfigError(f"unknown objective {objective!r}; choose one of: {', '.join(valid)}")
    if direction not in ("min", "max"):
        raise ConfigError(f"--direction must be min or max, got {direction!r}")


def optuna_direction(direction: str) -> Literal["minimize", "maximize"]:
    """Optuna's word for a study's ``direction`` (min or max)."""
    return "minimize" if direction == "min" else "maximize"


def params_of(cfg: RunConfig, names: list[str]) -> dict[str, Any]:
    return {n: (cfg.opts[n[4:]] if n.startswith("opt.") else getattr(cfg, n)) for n in names}


def varying(configs: list[RunConfig]) -> dict[str, list[Any]]:
    """The grid's axes: fields (and task options as ``opt.KEY``) that take more than one value."""
    # One column at a time, each value read once (params_of per cell and name was 5 s at 100,000 cells).
    options = [dict(c.options) for c in configs]
    fields = operator.attrgetter(*PARAM_FIELDS)
    columns: dict[str, Sequence[Any]] = dict(zip(PARAM_FIELDS, zip(*map(fields, configs)))) if configs else {}
    columns |= {f"opt.{k}": [o[k] for o in options] for k in sorted({k for o in options for k in o})}
    return {n: list(dict.fromkeys(column)) for n, column in columns.items()
            if column and (column.count(column[0]) < len(column) or len(set(map(type, column))) > 1)}


def search_space(spec) -> dict[str, Any]:
    """The TPE study's distributions: a log range is a log-uniform interval, a list of several values a choice."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    dists: dict[str, Any] = {}
    for name, values in spec.axes.items():
        if name in spec.ranges:
            lo, hi = spec.ranges[name]
            dists[name] = FloatDistribution(lo, hi, log=True)
        elif len(values) > 1:
            dists[name] = CategoricalDistribution(list(values))
    for name, values in spec.options.items():
        if len(values) > 1:
            dists[f"opt.{name}"] = CategoricalDistribution(list(values))
    if not dists:
        raise ConfigError("--tune needs at least one axis with several values or a range")
    return dists


def sync_sweep(store, url: str, sweep_id: str, objective: str | None = None, direction: str = "min", *,
               wait: bool = True) -> int:
    """Mirror the finished cells of grid sweeps into their Optuna studies (optuna-dashboard reads the same database);
    returns how many trials this call added. Called by `flctl sweep` (``wait``) and by each worker as it exits.

    One mirror at a time in a database (MIRROR_LOCK), and its holder mirrors the finished cells not mirrored yet of
    every grid sweep (SweepCell.mirrored), a page at a time: it reads neither the whole sweep nor the study's trials.
    A worker (``wait`` False) that finds the lock held returns at once and leaves its cells to the holder. Having
    let the lock go, a mirror looks once more and goes again while a cell is waiting, so a cell that finished before
    a sync began (its worker's, which may have found the lock held) is mirrored by a sync that ends after it: the
    holder it found, or one that took the lock after that holder let it go, and read the cell then. What is left:
    a cell whose worker died before its sync, a mirror that failed or was killed, and a mirror that went ROUNDS
    times (other workers finishing cells all the while: theirs sync as they exit). The next sync of any sweep of the
    database takes them: a later worker's, `flctl sweep` again, and `flctl sweep --wait`'s final one.

    ``wait``: `flctl sweep`'s sync, which waits for the lock and makes ``sweep_id``'s study (``direction``; its grid
    read from every cell, once) before any cell finished. ``objective``: that sweep's (else its spec's)."""
    studies = _Studies(store, url, sweep_id, objective, direction)
    added = 0
    try:
        for _ in range(ROUNDS):
            with _mirror_lock(store, wait) as held:
                if not held:
                    break
                if wait:
                    studies.grid(sweep_id)
                added += _drain(store, studies)
            if not _pending(store, None, 1, studies.skipped):
                break
        return added
    finally:
        studies.close()


def make_study(store, url: str, sweep_id: str, configs: list[RunConfig], objective: str, direction: str) -> None:
    """A grid sweep's study, made by its launch from the configs it holds, before any worker starts: so the study has
    the direction asked for (a worker that made it would give Optuna's default, and ``best_trial`` would be the worst
    cell), and no config is read back from the database (at 100,000 cells, 16 s). A study there already is kept as
    it is (Optuna fixes a study's direction when it is made)."""
    studies = _Studies(store, url, sweep_id, objective, direction)
    try:
        with store.exclusive(MIRROR_LOCK):
            studies._open(sweep_id, objective, direction, _space(configs))
    finally:
        studies.close()


@contextmanager
def _mirror_lock(store, wait: bool) -> Iterator[bool]:
    if wait:
        with store.exclusive(MIRROR_LOCK):
            yield True
    else:
        with store.try_exclusive(MIRROR_LOCK) as held:
            yield held


def _drain(store, studies: _Studies) -> int:
    """One pass over the finished cells not mirrored, in (sweep, run) order, a page at a time; under MIRROR_LOCK."""
    added, after = 0, None
    while page := _pending(store, after, PAGE, studies.skipped):
        for sid, rows in groupby(page, key=lambda row: row.sweep_id):
            added += studies.add(sid, list(rows))
        if len(page) < PAGE:
            return added
        after = (page[-1].sweep_id, page[-1].run_id)
    return added


def _pending(store, after: tuple[str, str] | None, limit: int, skipped: Collection[str] = ()) -> list[Any]:
    """Up to ``limit`` finished cells not mirrored (after the cell ``after``; none of the sweeps ``skipped``), with
    what their trials need. A read that takes no write lock (SQLite's READ_ONLY): workers finishing their cells do
    not wait for it."""
    from sqlalchemy import false, select, tuple_

    q = (select(SweepCell.sweep_id, SweepCell.run_id, Run.status, Run.metrics, Run.config, Run.finished_at,
                Run.duration_s).join(Run, Run.id == SweepCell.run_id)
         .where(SweepCell.mirrored == false(), Run.status.in_(REPORTABLE))
         .order_by(SweepCell.sweep_id, SweepCell.run_id).limit(limit))
    if after is not None:
        q = q.where(tuple_(SweepCell.sweep_id, SweepCell.run_id) > tuple_(*after))
    if skipped:
        q = q.where(SweepCell.sweep_id.not_in(list(skipped)))
    with store.engine.connect().execution_options(**{READ_ONLY: True}) as conn, conn.begin():
        return list(conn.execute(q).all())


class _Grid(NamedTuple):
    study: Any                   # optuna.Study
    dists: dict[str, Any]        # the grid's axes, each a CategoricalDistribution of its values
    objective: str


# What a study damaged by hand (its grid attribute, a stored value) raises as it is read or its trials are made:
# that sweep is left out of the sync with a warning, never every sweep after it in the mirror's order.
DAMAGED = (ValueError, TypeError, AttributeError, KeyError, ConfigError)


class _Studies:
    """The Optuna side of one sync: its storage (made at first need; Optuna's tables under OPTUNA_LOCK), each grid
    sweep's study, opened once, and the sweeps left out of it (``skipped``: their studies are damaged)."""

    def __init__(self, store, url: str, sweep_id: str, objective: str | None, direction: str) -> None:
        self.store, self.url, self.sweep_id = store, url, sweep_id
        self.objective, self.direction = objective, direction
        self.storage: Any = None
        self.grids: dict[str, _Grid | None] = {}
        self.skipped: set[str] = set()

    def add(self, sweep_id: str, rows: list[Any]) -> int:
        """The trials of ``rows`` (finished cells of ``sweep_id``) into its study, and the cells marked mirrored, in
        one transaction (add_trials): a cell is marked if and only if its trial is there. A --tune sweep's cells
        are only marked: its tuner keeps their trials. A grid that does not hold a cell (its attribute damaged) is
        made again from the sweep's cells; where even that fails, the sweep is skipped with a warning."""
        cells = Cells(sweep_id, {row.run_id: (row.status, row.finished_at) for row in rows})
        if (grid := self.grid(sweep_id)) is None:
            if sweep_id not in self.skipped:
                self.store.write(lambda s: s.execute(marking(sweep_id, list(cells.read))))
            return 0
        try:
            try:
                trials = _trials(grid, rows)
            except DAMAGED:
                if (rebuilt := self._open(sweep_id, grid.objective, "min", kept=False)) is None:
                    raise
                grid = self.grids[sweep_id] = rebuilt
                trials = _trials(grid, rows)
        except DAMAGED as exc:
            self._skip(sweep_id, exc)
            return 0
        add_trials(self.storage, grid.study, trials, cells)
        return len(cells.read)

    def grid(self, sweep_id: str) -> _Grid | None:
        """``sweep_id``'s study, made where there is none (None: a --tune sweep's, a sweep without cells, or one
        skipped)."""
        if sweep_id not in self.grids:
            row = self.store.get_sweep(sweep_id)
            grid = None
            if row is not None and not row["spec"].get("tune"):
                own = sweep_id == self.sweep_id
                objective = (self.objective if own else None) or row["spec"].get("objective") or DEFAULT_OBJECTIVE
                try:
                    grid = self._open(sweep_id, objective, self.direction if own else "min")
                except DAMAGED as exc:
                    self._skip(sweep_id, exc)
            self.grids[sweep_id] = grid
        return self.grids[sweep_id]

    def _skip(self, sweep_id: str, exc: BaseException) -> None:
        self.skipped.add(sweep_id)
        self.grids[sweep_id] = None
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        print(f"flctl: warning: the Optuna study flctl-{sweep_id} is damaged ({type(exc).__name__}: {first}); its "
              f"cells are not mirrored (delete it, e.g. `optuna delete-study --study-name flctl-{sweep_id}`, and the "
              "next sync makes it again)", file=sys.stderr, flush=True)

    def _open(self, sweep_id: str, objective: str, direction: str,
              space: dict[str, list[Any]] | None = None, kept: bool = True) -> _Grid | None:
        """The sweep's study, made where there is none. Its grid is the one kept in the study when it was made
        (``kept``, and it is a grid), else ``space``, else read from every cell once."""
        import optuna
        from optuna.distributions import CategoricalDistribution
        from sqlalchemy import update

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage, name = self._storage(), f"flctl-{sweep_id}"
        try:
            attrs: dict[str, Any] | None = storage.get_study_user_attrs(storage.get_study_id_from_name(name))
        except KeyError:
            attrs = None
            # a study deleted (optuna.delete_study, the dashboard's delete) is made again with every finished cell
            self.store.write(lambda s: s.execute(
                update(SweepCell).where(SweepCell.sweep_id == sweep_id, SweepCell.mirrored).values(mirrored=False)
                .execution_options(synchronize_session=False)))
        # The grid is kept in the study when it is made (a study made before it was: at its first sync since), so
        # that a sync reads the cells it adds, not every cell's config.
        held = (attrs or {}).get("grid") if kept else None
        space = held if _is_grid(held) else (space if kept else None) or _grid_of(self.store, sweep_id)
        if space is None:
            return None
        sampler = optuna.samplers.GridSampler(space, seed=GRID_SEED)
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler) if attrs is not None else \
            optuna.create_study(storage=storage, study_name=name, load_if_exists=True, sampler=sampler,
                                direction=optuna_direction(direction))
        for key, value in (("grid", space), ("objective", objective)):
            if (attrs or {}).get(key) != value:
                study.set_user_attr(key, value)
        return _Grid(study, {k: CategoricalDistribution(v) for k, v in space.items()}, objective)

    def _storage(self) -> Any:
        # Its own engine, disposed at the end (close): a worker of the debug executor syncs inside a process that
        # lives on (the Python API, `flctl sweep --executor debug`), and a connection left open keeps SQLite's -wal.
        if self.storage is None:
            from sqlalchemy import inspect

            with self.store.engine.connect() as conn:     # Optuna's schema is whole once its version table is there
                made = inspect(conn).has_table("alembic_version")
            with self.store.exclusive(OPTUNA_LOCK) if not made else nullcontext():
                self.storage = existing_storage(self.url)
        return self.storage

    def close(self) -> None:
        if self.storage is not None:
            self.storage.engine.dispose()


def _is_grid(value: Any) -> bool:
    """Whether a study's ``grid`` attribute is one: axes flctl varies, each a list of values."""
    return isinstance(value, dict) and bool(value) and all(
        isinstance(k, str) and (k in PARAM_FIELDS or k.startswith("opt.")) and isinstance(v, list) and v
        for k, v in value.items())


def _trials(grid: _Grid, rows: list[Any]) -> list[Any]:
    names = list(grid.dists)
    return [trial_of(params_of(RunConfig.from_json(row.config), names), grid.dists, grid.objective, row)
            for row in rows]


def _grid_of(store, sweep_id: str) -> dict[str, list[Any]] | None:
    """The grid of the sweep's cells (None: no cells): every config, read once."""
    from sqlalchemy import select

    with store.engine.connect().execution_options(**{READ_ONLY: True}) as conn, conn.begin():
        configs = [RunConfig.from_json(c) for c in conn.scalars(
            select(Run.config).join(SweepCell, SweepCell.run_id == Run.id).where(SweepCell.sweep_id == sweep_id)
            .order_by(Run.id))]
    return _space(configs)


def _space(configs: list[RunConfig]) -> dict[str, list[Any]] | None:
    """The grid of a sweep's cells: ``varying`` in run id order (the same whoever reads them), or its one seed."""
    configs = sorted(configs, key=lambda c: c.run_id)
    return (varying(configs) or {"seed": [configs[0].seed]}) if configs else None
