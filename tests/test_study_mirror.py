"""The grid mirror's trials written in one transaction (flctl.study.add_trials) are the trials Optuna's own
study.add_trial writes, field for field: on the newest Optuna here and on the lowest the bounds allow (.ci/run's
notorch leg runs this module there)."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from pathlib import Path

import pytest

pytestmark = pytest.mark.notorch


def _trials() -> list:
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState, create_trial

    dists = {"eps": CategoricalDistribution([None, 0.05, 0.1]), "method": CategoricalDistribution(["erm", "fl"]),
             "seed": CategoricalDistribution([0, 1, 2])}
    made = []
    for i, (eps, method, seed, value) in enumerate([(None, "erm", 0, 0.25), (0.05, "fl", 1, math.inf),
                                                    (0.1, "fl", 2, None), (0.05, "fl", 0, -1e-9)]):
        ok = value is not None
        trial = create_trial(params={"eps": eps, "method": method, "seed": seed}, distributions=dists, value=value,
                             state=TrialState.COMPLETE if ok else TrialState.FAIL,
                             user_attrs={"run_id": f"{i:016x}", "status": "completed" if ok else "diverged"})
        trial.datetime_complete = datetime(2026, 11, 28, 12, 0, i)
        trial.datetime_start = trial.datetime_complete - timedelta(seconds=3.5 * i)
        made.append(trial)
    return made


def _seen(study) -> list[tuple]:
    return [(t.number, t.state, t.value, t.params, t.distributions, t.user_attrs, t.system_attrs,
             t.intermediate_values, t.datetime_start, t.datetime_complete) for t in study.get_trials(deepcopy=False)]


def test_trials_added_in_one_transaction_are_those_add_trial_adds(tmp_path: Path) -> None:
    import optuna
    from sqlalchemy import event

    from flctl.study import add_trials

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'optuna.db'}")
    theirs = optuna.create_study(storage=storage, study_name="theirs")
    ours = optuna.create_study(storage=storage, study_name="ours")
    for trial in _trials():
        theirs.add_trial(trial)
    commits: list[int] = []
    event.listen(storage.engine, "commit", lambda conn: commits.append(1))
    add_trials(storage, ours, _trials()[:1])           # a later sync numbers its trials after those there
    add_trials(storage, ours, _trials()[1:])
    add_trials(storage, ours, [])
    assert len(commits) == 2
    assert _seen(optuna.load_study(study_name="ours", storage=storage)) == \
        _seen(optuna.load_study(study_name="theirs", storage=storage))
    assert [t.number for t in ours.get_trials()] == [0, 1, 2, 3]
