"""`flctl sweep --tune N`'s TPE search over a sweep's axes, in the sweep's Optuna study (flctl.study): log ranges
(``1e-4..1``) become log-uniform intervals, lists become categorical choices; each asked trial is one run, launched
like any sweep cell (flctl.launch.tune launches them). Several `--tune` processes may search one study at once: they
ask one at a time, under a database-wide lock, from samplers that never share a stream, so none proposes a trial
another did (``tune``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from flctl.config import RunConfig
from flctl.db import existing_storage, poll_delays
from flctl.errors import ConfigError
from flctl.status import TERMINAL, TO_DO, Status
from flctl.study import OPTUNA_LOCK, optuna_direction, search_space

# `--tune`'s TPESampler, every argument that moves its suggestions given here rather than left to Optuna's
# defaults: Optuna 5.0 turned multivariate TPE and the constant liar on, so the same seeded `--tune` asked other
# trials under Optuna 4 and 5. These are the values flctl's studies ran with under Optuna 4. The seeded random
# start-up trials are then the same under both; the TPE trials after them still differ, because 5.0 rewrote the
# Parzen estimator with no argument to restore 4's (tests/test_versions.py fixes both, by major version). The
# arguments Optuna deprecated (consider_prior, prior_weight, consider_magic_clip, consider_endpoints) kept their
# defaults and are not passed.
TPE_SETTINGS: dict[str, Any] = dict(seed=0, n_startup_trials=10, n_ei_candidates=24, multivariate=False, group=False,
                                    constant_liar=False)


def tune(spec, sweep_id: str, n_trials: int, objective: str, direction: str, *, store, url: str, resolve_cell: Callable,
         launch: Callable[[list[RunConfig]], None], fetch: Callable[[list[str]], dict[str, dict]],
         revive: Callable[[list[RunConfig]], None] | None = None, parallel: int = 1, poll_s: float = 0.5,
         told: Callable[[int, RunConfig, dict, float | None], None] | None = None) -> Any:
    """TPE search over the spec's axes: ask ``parallel`` trials, launch their runs, wait, tell; N trials in all.

    ``resolve_cell(params) -> RunConfig``; ``launch(configs)`` submits runs; ``fetch(run_ids)`` reads their rows;
    ``revive(configs)``, called while some of the runs waited on are still to do, starts a worker for them when
    none is alive (the one launched may have found its queue empty and exited just before they were added).
    Trials an earlier, interrupted `--tune` left running are waited on (their runs resume) and told first.
    ``told(number, cfg, row, value)`` hears of each trial as it is told (value None: a failed trial).

    Several tuners may search one study at once (`flctl sweep --tune` started twice on one database): each asks
    under the database-wide OPTUNA_LOCK, seeing every trial asked before it, so the study gets N trials in all and
    no tuner proposes a trial another one did (``_Asker``); a trial another live tuner asked is that tuner's to
    tell (``_Tuner``), and this one waits for it before it returns.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dists = search_space(spec)
    with store.exclusive(OPTUNA_LOCK):        # creating the schema and the study races other syncs otherwise
        study = optuna.create_study(storage=existing_storage(url), study_name=f"flctl-{sweep_id}",
                                    load_if_exists=True, direction=optuna_direction(direction),
                                    sampler=optuna.samplers.TPESampler(**TPE_SETTINGS))
    study.set_user_attr("objective", objective)
    me = _Tuner.here()
    _TUNING.add(me.token)
    try:
        return _search(study, me, dists, n_trials, objective, resolve_cell=resolve_cell, launch=launch, fetch=fetch,
                       revive=revive, parallel=parallel, poll_s=poll_s, told=told, store=store)
    finally:
        _TUNING.discard(me.token)


def _search(study, me: _Tuner, dists: dict[str, Any], n_trials: int, objective: str, *, store, resolve_cell: Callable,
            launch: Callable[[list[RunConfig]], None], fetch: Callable[[list[str]], dict[str, dict]],
            revive: Callable[[list[RunConfig]], None] | None, parallel: int, poll_s: float,
            told: Callable[[int, RunConfig, dict, float | None], None] | None) -> Any:
    """tune()'s loop, as ``me``."""
    from optuna.trial import TrialState

    asker, idle = _Asker(study), poll_delays(poll_s)
    while True:
        with store.exclusive(OPTUNA_LOCK):    # one tuner asks at a time, and sees every trial asked before
            trials = study.get_trials(deepcopy=False)
            batch = _orphans(study, trials, resolve_cell, me, fetch)
            want = min(parallel, n_trials - len(trials))
            if not batch and want > 0:
                batch = asker.ask(want, len(trials), dists, resolve_cell, me)
        if not batch:       # all N asked: wait for the trials other tuners have still running, then stop
            others = [t for t in trials if t.state == TrialState.RUNNING and t.number < n_trials]
            if not others:
                return study
            if revive is not None:
                _revive_others([t for t in others if not me.beside(t)], resolve_cell, fetch, revive)
            time.sleep(next(idle))
            continue
        idle = poll_delays(poll_s)
        configs = [cfg for _, cfg in batch]
        launch(configs)
        rows = _wait(configs, fetch, revive, poll_s)
        lacking = None
        for number, cfg in batch:
            metrics = rows[cfg.run_id].get("metrics") or {}
            value = metrics.get(objective)
            if rows[cfg.run_id]["status"] == Status.COMPLETED and value is None:
                lacking = (cfg.run_id, metrics)
            # skip_if_finished: a second `--tune` of the same study may have adopted and told the trial already
            if rows[cfg.run_id]["status"] == Status.COMPLETED and value is not None:
                study.tell(number, value, skip_if_finished=True)
            else:
                study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
                value = None
            if told is not None:
                told(number, cfg, rows[cfg.run_id], value)
        if lacking is not None and not any(n == "method" or n.startswith("opt.") for n in dists):
            # the task or method never records it (accuracy of a regression, multipliers of ERM) and no searched
            # axis could change that: every trial would fail, so stop instead of training them all for no best
            run_id, metrics = lacking
            raise ConfigError(f"run {run_id} finished without {objective!r}, so no trial of this search can have a "
                              f"value; its runs record: {', '.join(sorted(metrics))}")


class _Asker:
    """Asks one tuner's trials, under OPTUNA_LOCK. A seeded sampler is a fixed stream of suggestions, so two tuners
    of one study (or a tuner run again after an interrupted one) would ask the same trials: TPE's random start-up
    trials are the seeded stream's first draws, the same in every process. So the sampler stays the seeded one while
    the study holds only the trials this tuner asked (one tuner alone asks what it always did: tests/test_versions.py),
    and when others asked some since, it is seeded afresh from the number of trials the study holds, a number no
    other ask saw (asks are one at a time): no two tuners draw from one stream."""

    def __init__(self, study) -> None:
        self.study = study
        self.expected = 0            # trials in the study after this tuner's last ask, had no one else asked

    def ask(self, want: int, held: int, dists: dict[str, Any], resolve_cell: Callable,
            me: _Tuner) -> list[tuple[int, RunConfig]]:
        import optuna

        if held != self.expected:
            self.study.sampler = optuna.samplers.TPESampler(**{**TPE_SETTINGS, "seed": _stream_seed(held)})
        batch = []
        for _ in range(want):
            trial = self.study.ask(dists)
            cfg = resolve_cell(trial.params)
            trial.set_user_attr("run_id", cfg.run_id)
            trial.set_user_attr("tuner", me.attr())
            batch.append((trial.number, cfg))
        self.expected = held + want
        return batch


def _stream_seed(held: int) -> int:
    """The seed of a tuner's sampler that asks after others, the study holding ``held`` trials."""
    import hashlib

    return int(hashlib.sha256(f"{TPE_SETTINGS['seed']}:{held}".encode()).hexdigest()[:8], 16)


# The tune() calls of this process still searching (their _Tuner tokens).
_TUNING: set[str] = set()


@dataclass(frozen=True)
class _Tuner:
    """The tuner that asked a trial (its user attribute ``tuner``): a RUNNING trial is that tuner's to tell while it
    lives; one whose tuner is gone (Ctrl-C, a lost login node) is adopted by the next tuner, which waits on its run."""

    host: str
    pid: int
    start_time: int | None        # with the pid, this process and not a later one (flctl.procs)
    token: str                    # this tune() call: two tuners in one process are two

    @classmethod
    def here(cls) -> _Tuner:
        import os
        import socket
        import uuid

        from flctl.procs import process

        found = process(os.getpid())
        return cls(socket.gethostname(), os.getpid(), found.start_time if found else None, uuid.uuid4().hex)

    def beside(self, trial) -> bool:
        """Whether ``trial``'s tuner ran on this host (whose processes can be asked whether they live)."""
        other = trial.user_attrs.get("tuner")
        return isinstance(other, dict) and other.get("host") == self.host

    def attr(self) -> dict[str, Any]:
        return {"host": self.host, "pid": self.pid, "start_time": self.start_time, "token": self.token}

    def holds(self, trial, fetch: Callable[[list[str]], dict[str, dict]]) -> bool:
        """Whether a tuner still alive (this one, or another) asked or adopted ``trial``. Without a record of its
        tuner (an older flctl's trial), or without its run named (a tuner names it in the same locked step as it
        asks), it is nobody's. On another host a tuner's process cannot be asked: its trial is held until its run
        has been finished for FLCTL_STALE_AFTER (a live tuner tells a trial within a poll of its run's end)."""
        from flctl.db.liveness import STALE_AFTER_S
        from flctl.procs import pid_alive, process

        other = trial.user_attrs.get("tuner")
        run_id = trial.user_attrs.get("run_id")
        if not isinstance(other, dict) or not isinstance(run_id, str):
            return False
        if other.get("token") == self.token:
            return True
        pid = other.get("pid")
        if other.get("host") == self.host:
            if pid == self.pid:              # a tune() of this process: alive while it has not returned
                return other.get("token") in _TUNING
            if not isinstance(pid, int) or not pid_alive(pid):
                return False
            found = process(pid)
            return found is None or other.get("start_time") in (None, found.start_time)
        row = fetch([run_id]).get(run_id)
        if row is None or row["status"] not in TERMINAL or row.get("finished_at") is None:
            return True
        finished = row["finished_at"] if row["finished_at"].tzinfo else row["finished_at"].replace(tzinfo=UTC)
        return (datetime.now(UTC) - finished).total_seconds() <= STALE_AFTER_S


def _orphans(study, trials: list, resolve_cell: Callable, me: _Tuner,
             fetch: Callable[[list[str]], dict[str, dict]]) -> list[tuple[int, RunConfig]]:
    """Trials still RUNNING in the study that no live tuner holds: asked by a `--tune` that was stopped (Ctrl-C)
    before telling them. Each whose parameters still resolve to the run it launched is adopted (this tuner's from
    now on) and waited on again; the others are told FAIL. Under OPTUNA_LOCK: a trial is adopted once."""
    from optuna.trial import TrialState

    batch = []
    for t in trials:
        if t.state != TrialState.RUNNING or me.holds(t, fetch):
            continue
        try:
            cfg = resolve_cell(t.params)
        except ConfigError:
            cfg = None
        if cfg is not None and cfg.run_id == t.user_attrs.get("run_id"):
            # this tuner's from now on, so that a third one does not adopt it too (Optuna's API sets a user
            # attribute only through the Trial that asked it)
            study._storage.set_trial_user_attr(t._trial_id, "tuner", me.attr())
            batch.append((t.number, cfg))
        else:
            study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
    return batch


def _revive_others(others: list, resolve_cell: Callable, fetch: Callable[[list[str]], dict[str, dict]],
                   revive: Callable[[list[RunConfig]], None]) -> None:
    """While this tuner waits for other tuners' trials: a worker for those of their runs still to do when no worker
    of the sweep is alive (their tuner may be gone where it cannot be seen, on another host)."""
    ids = [t.user_attrs["run_id"] for t in others if isinstance(t.user_attrs.get("run_id"), str)]
    rows = fetch(ids) if ids else {}
    todo = []
    for t in others:
        row = rows.get(t.user_attrs.get("run_id"))
        if row is not None and row["status"] in TO_DO:
            try:
                todo.append(resolve_cell(t.params))
            except ConfigError:
                continue
    if todo:
        revive(todo)


def _wait(configs: list[RunConfig], fetch: Callable[[list[str]], dict[str, dict]],
          revive: Callable[[list[RunConfig]], None] | None, poll_s: float) -> dict[str, dict]:
    """The rows of ``configs`` once every one is finished. While some are still to do, ``revive`` is asked to make
    sure a worker is alive to take them: a wait on a cell that no worker will ever claim never ends."""
    ids, delays = [c.run_id for c in configs], poll_delays(poll_s)     # a short trial is told as it ends
    while True:
        rows = fetch(ids)
        if all(rows[i]["status"] in TERMINAL for i in ids):
            return rows
        if revive is not None and any(rows[i]["status"] in TO_DO for i in ids):
            revive([c for c in configs if rows[c.run_id]["status"] in TO_DO])
        time.sleep(next(delays))
