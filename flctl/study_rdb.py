"""What flctl reads and writes of Optuna's tables itself, with Optuna's own table models (flctl.study uses them):
the grid mirror's page of finished cells as trials of their sweep's study, in one transaction with the cells' marks,
a cell that finished again replacing its trial rather than adding a second one (``add_trials``); and a launch's
look at a study there already, whose direction and objective are fixed (``check_study``).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from flctl.db.schema import Run, SweepCell
from flctl.errors import ConfigError
from flctl.status import REPORTABLE, Status


class Cells(NamedTuple):
    """A page of one sweep's finished cells as the mirror read them: run id -> (status, finished_at). A cell whose
    run is no longer so when the trials are written (claimed again, finished again) is left unmarked, trial-less."""

    sweep_id: str
    read: dict[str, tuple[str, Any]]


def trial_of(params: dict[str, Any], dists: dict[str, Any], objective: str, row: Any) -> Any:
    """The trial (Optuna's FrozenTrial, checked by create_trial) of a finished cell (``row``: its run's status,
    metrics, times) with ``params`` in ``dists``: FAIL without the objective. ValueError where a value is not among
    its distribution's choices (a damaged grid)."""
    from optuna.trial import TrialState, create_trial

    value = (row.metrics or {}).get(objective)
    ok = row.status == Status.COMPLETED and value is not None
    trial = create_trial(params=params, distributions=dists, value=value if ok else None,
                         state=TrialState.COMPLETE if ok else TrialState.FAIL,
                         user_attrs={"run_id": row.run_id, "status": row.status})
    if row.finished_at is not None:       # the run's own times, not those of this sync
        trial.datetime_complete = optuna_time(row.finished_at)
        trial.datetime_start = trial.datetime_complete - timedelta(seconds=row.duration_s or 0.0)
    return trial


def check_study(store, sweep_id: str, objective: str, direction: str) -> None:
    """ConfigError (one line, before anything is written) where the sweep's study is there already with another
    direction or objective than those asked: Optuna fixes a study's direction when it is made, and its trials'
    values are one objective's, so a launch that asked for another would be told a ``best_trial`` it did not ask
    for. Read without making Optuna's tables."""
    from sqlalchemy import inspect
    from sqlalchemy.orm import Session

    try:
        from optuna.storages._rdb import models
    except ImportError:             # an Optuna without them: its study is told as Optuna tells it
        return

    with store.engine.connect() as conn:
        if not inspect(conn).has_table("study_directions"):
            return
    name = f"flctl-{sweep_id}"
    with Session(store.engine) as s:
        had = s.query(models.StudyDirectionModel.direction).join(models.StudyModel).filter(
            models.StudyModel.study_name == name).scalar()
        attr = s.query(models.StudyUserAttributeModel.value_json).join(models.StudyModel).filter(
            models.StudyModel.study_name == name, models.StudyUserAttributeModel.key == "objective").scalar()
    if had is None:
        return
    was = "max" if had.name == "MAXIMIZE" else "min"
    try:
        recorded = json.loads(attr) if attr is not None else objective
    except ValueError:
        recorded = objective          # a damaged attribute: the mirror writes the launch's again
    if (was, recorded) != (direction, objective):
        raise ConfigError(f"sweep {sweep_id}'s Optuna study {name} records the {was} of {recorded}, fixed when it was "
                          f"first launched: launch it again with --objective {recorded} --direction {was}, or delete "
                          f"the study (optuna delete-study --storage URL --study-name {name}) to record another")


def marking(sweep_id: str, run_ids: list[str], mirrored: bool = True) -> Any:
    """The statement that marks the cells ``run_ids`` of ``sweep_id`` mirrored (or not)."""
    from sqlalchemy import update

    return (update(SweepCell).where(SweepCell.sweep_id == sweep_id, SweepCell.run_id.in_(run_ids))
            .values(mirrored=mirrored).execution_options(synchronize_session=False))


# The Optuna majors on which tests/test_study_mirror.py's first test held add_trials' rows equal to add_trial's, field
# for field: the newest the venv has and the lowest the bounds allow (.ci/run's second venv). Optuna's _rdb tables
# are private, and a new major may change them without changing their shape: on a major not here, add_trials goes
# through add_trial, and tests/test_study_mirror.py fails until that major is checked and added.
FIELD_CHECKED_MAJORS = (4, 5)


def writes_tables(version: str) -> bool:
    """Whether add_trials writes Optuna's tables itself on Optuna ``version`` (else it calls add_trial)."""
    major = version.split(".")[0]
    return major.isdigit() and int(major) in FIELD_CHECKED_MAJORS


def add_trials(storage: Any, study: Any, trials: list[Any], cells: Cells | None = None) -> None:
    """``trials`` into ``study`` (kept by the RDBStorage ``storage``) in one transaction, each as ``study.add_trial``
    would add it, and ``cells`` marked mirrored in the same one: a mirror killed midway leaves both or neither, never
    a trial whose cell the next mirror adds again. Optuna adds a trial at a time, about eleven statements and a
    commit each: 15 ms a cell of a two-moons sweep, most of what flctl itself spent on a cell
    (benchmarks/bench_overhead.py). So they are written here with Optuna's own table models, numbered after the
    study's trials (under MIRROR_LOCK: no other sync numbers beside this one, and the study's row locked as Optuna
    locks it); a cell that has a trial already (it finished again: flctl.db.claims.retrain unmarked it) has that
    trial's state, value, times and status replaced. tests/test_study_mirror.py holds them equal to add_trial's,
    field for field, on the newest Optuna and the lowest the bounds allow. On another major (FIELD_CHECKED_MAJORS), or
    where Optuna's models are not there, they go through add_trial, the cells marked after; the run ids the study
    has are skipped (a trial is not replaced)."""
    import optuna

    try:
        from optuna.distributions import distribution_to_json
        from optuna.storages._rdb import models
        value_of = models.TrialValueModel.value_to_stored_repr
    except (ImportError, AttributeError):
        return _one_by_one(storage, study, trials, cells)
    if not writes_tables(optuna.__version__):
        return _one_by_one(storage, study, trials, cells)
    from sqlalchemy.exc import OperationalError

    for attempt in range(3):        # Optuna retries its writes (a lock held past SQLite's wait); so does this
        try:
            return _Writer(storage, models, value_of, distribution_to_json).write(study, trials, cells) \
                if trials else None
        except OperationalError:
            if attempt == 2:
                raise


def _one_by_one(storage: Any, study: Any, trials: list[Any], cells: Cells | None) -> None:
    """add_trials through Optuna's add_trial: a trial at a time, then ``cells`` marked (see add_trials)."""
    known = {t.user_attrs.get("run_id") for t in study.get_trials(deepcopy=False)} if cells else set()
    for trial in trials:
        if trial.user_attrs.get("run_id") not in known:
            study.add_trial(trial)
    if cells:
        with storage.scoped_session() as session:
            session.execute(marking(cells.sweep_id, list(cells.read)))
            session.commit()


class _Writer:
    """One add_trials transaction, with Optuna's table ``models``."""

    def __init__(self, storage: Any, models: Any, value_of: Any, to_json: Any) -> None:
        self.storage, self.models, self.value_of, self.to_json = storage, models, value_of, to_json

    def write(self, study: Any, trials: list[Any], cells: Cells | None) -> None:
        models = self.models
        session = self.storage.scoped_session()
        try:
            marked = self._mark(session, cells, trials) if cells else 0
            trials = [t for t in trials if cells is None or t.user_attrs["run_id"] in cells.read]
            study_id = session.query(models.StudyModel.study_id).filter(
                models.StudyModel.study_name == study.study_name).scalar()
            # the study's row locked while its trials are numbered, as Optuna's own add_trial locks it
            models.StudyModel.find_or_raise_by_id(study_id, session, for_update=True)
            first = session.query(models.TrialModel).filter(models.TrialModel.study_id == study_id).count()
            # more trials than marked cells: some are of cells not marked (finished again since): look them up
            had = self._had(session, study_id, [t.user_attrs["run_id"] for t in trials]) \
                if cells and first > marked else {}
            number = first
            for t in trials:
                if (row := had.get(t.user_attrs["run_id"])) is not None:
                    self._replace(session, row, t)
                    continue
                row = models.TrialModel(study_id=study_id, number=number, state=t.state,
                                        datetime_start=t.datetime_start, datetime_complete=t.datetime_complete)
                number += 1
                row.params = [models.TrialParamModel(param_name=name,
                                                     param_value=t.distributions[name].to_internal_repr(v),
                                                     distribution_json=self.to_json(t.distributions[name]))
                              for name, v in t.params.items()]
                row.values = self._values(t)
                row.user_attributes = [models.TrialUserAttributeModel(key=k, value_json=json.dumps(v))
                                       for k, v in t.user_attrs.items()]
                session.add(row)
            session.commit()
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    def _mark(self, session: Any, cells: Cells, trials: list[Any]) -> int:
        """Marks the page's cells, first (on SQLite the write lock, taken before anything is read); drops from
        ``cells`` those whose run changed since the mirror read it, unmarked again; returns how many cells of the
        sweep were marked before this page. The runs are read locked (PostgreSQL's FOR SHARE): a claim that took
        one meanwhile has committed, and is seen, or waits for this transaction, and unmarks its cell after it."""
        from sqlalchemy import func, select

        ids = list(cells.read)
        session.execute(marking(cells.sweep_id, ids))
        now = {r.id: (r.status, r.finished_at) for r in session.execute(
            select(Run.id, Run.status, Run.finished_at).where(Run.id.in_(ids)).limit(len(ids))
            .with_for_update(read=True))}
        moved = [i for i in ids if now.get(i) != cells.read[i] or now[i][0] not in REPORTABLE]
        if moved:
            session.execute(marking(cells.sweep_id, moved, mirrored=False))
            for i in moved:
                del cells.read[i]
        total = session.execute(select(func.count()).select_from(SweepCell).where(
            SweepCell.mirrored, SweepCell.sweep_id == cells.sweep_id)).scalar_one()
        return total - len(cells.read)

    def _had(self, session: Any, study_id: int, run_ids: list[str]) -> dict[str, Any]:
        """The trials of the study whose run ids are among ``run_ids`` (run id -> Optuna's TrialModel)."""
        m = self.models
        found = (session.query(m.TrialUserAttributeModel.value_json, m.TrialModel)
                 .join(m.TrialModel, m.TrialModel.trial_id == m.TrialUserAttributeModel.trial_id)
                 .filter(m.TrialModel.study_id == study_id, m.TrialUserAttributeModel.key == "run_id",
                         m.TrialUserAttributeModel.value_json.in_([json.dumps(i) for i in run_ids]))
                 .order_by(m.TrialModel.number))
        had: dict[str, Any] = {}
        for value_json, trial in found:
            had.setdefault(json.loads(value_json), trial)
        return had

    def _replace(self, session: Any, row: Any, t: Any) -> None:
        """The trial ``row`` as ``t`` (its cell finished again): state, value, times and the run's status."""
        m = self.models
        row.state, row.datetime_start, row.datetime_complete = t.state, t.datetime_start, t.datetime_complete
        session.query(m.TrialValueModel).filter(m.TrialValueModel.trial_id == row.trial_id).delete()
        for value in self._values(t):
            value.trial_id = row.trial_id
            session.add(value)
        session.query(m.TrialUserAttributeModel).filter(
            m.TrialUserAttributeModel.trial_id == row.trial_id, m.TrialUserAttributeModel.key == "status") \
            .update({"value_json": json.dumps(t.user_attrs["status"])}, synchronize_session=False)

    def _values(self, t: Any) -> list[Any]:
        if t.value is None:
            return []
        stored, kind = self.value_of(t.value)
        return [self.models.TrialValueModel(objective=0, value=stored, value_type=kind)]


def optuna_time(stamp: datetime) -> datetime:
    """A stored time (UTC; SQLite gives it back naive) the way Optuna keeps its own: naive local time."""
    return (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).astimezone().replace(tzinfo=None)
