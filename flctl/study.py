"""Optuna studies kept in the run database, so optuna-dashboard can open a sweep.

- A grid sweep is mirrored as a study ``flctl-<sweep id>`` whose search space is the grid (GridSampler) and
  whose trials are the sweep's finished cells (params = the varying axes, value = the objective metric).
- ``flctl sweep --tune N`` runs a TPE search instead (flctl.tpe_search): its study ``flctl-<sweep id>`` (a ``t``
  id, flctl.sweep.tune_id) is the sweep's only study: its cells (one per trial, the set growing as trials are asked)
  are not mirrored as a grid, whose categorical space is fixed when the study is created.

What both kinds share is here: the objective and its direction, the lock every write of Optuna's tables holds, a
run's parameters as a trial's, and the space each searches (``varying``: the grid's; ``search_space``: the TPE's).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from flctl.config import AXIS_FIELDS, RunConfig
from flctl.db import SCHEMA_LOCK, existing_storage
from flctl.errors import ConfigError
from flctl.metrics import SPLITS, SUMMARY_METRICS
from flctl.status import REPORTABLE, Status

# The metric a sweep's study records when its spec and command line name none.
DEFAULT_OBJECTIVE = "train.avg_loss"
# Everything that writes Optuna's tables holds the database-wide lock that flctl's own schema is created under
# (Store.exclusive(SCHEMA_LOCK)): Optuna creates its schema under it, and each sync reads the study's trials and adds
# the missing ones under it, so a cell is one trial however many workers and waiting sweeps sync at once, and
# concurrent first syncs (or a sync beside a first `flctl run`) cannot both create tables.
OPTUNA_LOCK = SCHEMA_LOCK
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
    names = list(PARAM_FIELDS) + sorted({f"opt.{k}" for c in configs for k, _ in c.options})
    space: dict[str, list[Any]] = {}
    for n in names:
        values = list(dict.fromkeys(params_of(c, [n])[n] for c in configs))
        if len(values) > 1:
            space[n] = values
    return space


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


def sync_sweep(store, url: str, sweep_id: str, objective: str | None = None, direction: str = "min") -> int:
    """Mirror a sweep's finished cells into its Optuna study (optuna-dashboard reads the same database): called by
    `flctl sweep` and by each worker as it exits, one at a time (OPTUNA_LOCK). Returns how many trials were added."""
    with store.exclusive(OPTUNA_LOCK):
        sweep_row = store.get_sweep(sweep_id)
        if sweep_row is None or sweep_row["spec"].get("tune"):    # a --tune sweep's study is its TPE study (tune)
            return 0
        rows = store.sweep_runs(sweep_id)
        configs = [RunConfig.from_json(r["config"]) for r in rows]
        if not configs:
            return 0
        return sync_grid(url, sweep_id, configs, {r["id"]: r for r in rows},
                         objective or sweep_row["spec"].get("objective") or DEFAULT_OBJECTIVE, direction)


def sync_grid(url: str, sweep_id: str, configs: list[RunConfig], runs: dict[str, dict], objective: str,
              direction: str = "min") -> int:
    """Add the sweep's newly finished cells to its study (add_trials); returns how many trials were added. Only under
    OPTUNA_LOCK (sync_sweep): the check for a cell's trial and its addition are one critical section."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = varying(configs) or {"seed": [configs[0].seed]}
    # Its own engine, disposed at the end: a worker of the debug executor syncs inside a process that lives on (the
    # Python API, `flctl sweep --executor debug`), and a connection left open there keeps SQLite's -wal file.
    storage = existing_storage(url)
    try:
        study = optuna.create_study(storage=storage, study_name=f"flctl-{sweep_id}", load_if_exists=True,
                                    direction=optuna_direction(direction),
                                    sampler=optuna.samplers.GridSampler(space, seed=GRID_SEED))
        study.set_user_attr("objective", objective)
        known = {t.user_attrs.get("run_id") for t in study.get_trials(deepcopy=False)}
        trials = _new_trials(configs, runs, space, objective, known)
        add_trials(storage, study, trials)
        return len(trials)
    finally:
        storage.engine.dispose()


def _new_trials(configs: list[RunConfig], runs: dict[str, dict], space: dict[str, list], objective: str,
                known: set[str | None]) -> list[Any]:
    """The trials (Optuna's FrozenTrial, checked by create_trial) of the sweep's finished cells not in ``known``."""
    from optuna.distributions import BaseDistribution, CategoricalDistribution
    from optuna.trial import TrialState, create_trial

    dists: dict[str, BaseDistribution] = {k: CategoricalDistribution(v) for k, v in space.items()}
    made = []
    for cfg in configs:
        run = runs.get(cfg.run_id)
        if run is None or cfg.run_id in known or run["status"] not in REPORTABLE:
            continue
        value = (run.get("metrics") or {}).get(objective)
        ok = run["status"] == Status.COMPLETED and value is not None
        trial = create_trial(params=params_of(cfg, list(space)), distributions=dists, value=value if ok else None,
                             state=TrialState.COMPLETE if ok else TrialState.FAIL,
                             user_attrs={"run_id": cfg.run_id, "status": run["status"]})
        if run.get("finished_at") is not None:       # the run's own times, not those of this sync
            trial.datetime_complete = _optuna_time(run["finished_at"])
            trial.datetime_start = trial.datetime_complete - timedelta(seconds=run.get("duration_s") or 0.0)
        made.append(trial)
    return made


def add_trials(storage: Any, study: Any, trials: list[Any]) -> None:
    """``trials`` into ``study`` (kept by the RDBStorage ``storage``) in one transaction, each as ``study.add_trial``
    would add it. Optuna adds a trial at a time, about eleven statements and a commit each: 15 ms a cell of a two-moons
    sweep, most of what flctl itself spent on a cell (benchmarks/bench_overhead.py). So they are written here with
    Optuna's own table models, numbered after the study's trials (under OPTUNA_LOCK: no other sync numbers beside
    this one, and the study's row locked as Optuna locks it). tests/test_study_mirror.py holds them equal to
    add_trial's, field for field, on the newest Optuna and the lowest the bounds allow; where Optuna's models are not
    there, they go through add_trial."""
    try:
        from optuna.distributions import distribution_to_json
        from optuna.storages._rdb import models
        value_of = models.TrialValueModel.value_to_stored_repr
    except (ImportError, AttributeError):
        for trial in trials:
            study.add_trial(trial)
        return
    from sqlalchemy.exc import OperationalError

    for attempt in range(3):        # Optuna retries its writes (a lock held past SQLite's wait); so does this
        try:
            return _write_trials(storage, study, trials, models, value_of, distribution_to_json) if trials else None
        except OperationalError:
            if attempt == 2:
                raise


def _write_trials(storage: Any, study: Any, trials: list[Any], models: Any, value_of: Any, to_json: Any) -> None:
    import json

    session = storage.scoped_session()
    try:
        study_id = session.query(models.StudyModel.study_id).filter(
            models.StudyModel.study_name == study.study_name).scalar()
        # the study's row locked while its trials are numbered, as Optuna's own add_trial locks it
        models.StudyModel.find_or_raise_by_id(study_id, session, for_update=True)
        first = session.query(models.TrialModel).filter(models.TrialModel.study_id == study_id).count()
        for number, t in enumerate(trials, start=first):
            row = models.TrialModel(study_id=study_id, number=number, state=t.state, datetime_start=t.datetime_start,
                                    datetime_complete=t.datetime_complete)
            row.params = [models.TrialParamModel(param_name=name, param_value=t.distributions[name].to_internal_repr(v),
                                                 distribution_json=to_json(t.distributions[name]))
                          for name, v in t.params.items()]
            row.values = [] if t.value is None else \
                [models.TrialValueModel(objective=0, value=value_of(t.value)[0], value_type=value_of(t.value)[1])]
            row.user_attributes = [models.TrialUserAttributeModel(key=k, value_json=json.dumps(v))
                                   for k, v in t.user_attrs.items()]
            session.add(row)
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def _optuna_time(stamp: datetime) -> datetime:
    """A stored time (UTC; SQLite gives it back naive) the way Optuna keeps its own: naive local time."""
    return (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).astimezone().replace(tzinfo=None)
