"""A process's loggers at work: a launch's once-per-launch set-up (``prepare``), and the logs of the runs one process
trains or exports (``Logging``), each call through the tracker guard (flctl.loggers.tracker_guard), each logger's
class found once for the session, not at each call (an installed logger's lookup reads the entry points)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flctl.loggers.base import Logger, RunInfo, run_info, scalars
from flctl.loggers.registry import Chosen, get_logger
from flctl.loggers.tracker_guard import call_tracker, describe, gave_no_answer, no_answer, warn


def prepare(chosen: Sequence[str], results_root: Path, sweep_id: str) -> tuple[str, ...]:
    """Each logger's once-per-launch set-up (Logger.prepare), through the tracker guard as every call: the loggers
    ready. One whose set-up failed is one warning naming the export that fills its runs in later, and the sweep
    trains without it (each of its runs would otherwise wait out the same tracker)."""
    ready = []
    for name in chosen:
        cls = get_logger(name)
        failure = call_tracker(cls, functools.partial(cls.prepare, results_root))
        if failure is None:
            ready.append(name)
        else:
            warn(f"{name} could not be set up ({describe(failure)}); sweep {sweep_id} trains without it, its records "
                 f"intact: once {name} works here, `flctl export {sweep_id} --to {name}` fills it in")
    return tuple(ready)


@dataclass
class Logging:
    """The loggers of the runs one process trains: each run's log in each tool, told at each evaluation; its
    failures told once per run and kept (``not_logged``) for the line at the end. ``chosen``: the loggers, as
    ``check`` found them or by name (a worker's recipe), their classes then found here, once."""

    chosen: Sequence[str] | Chosen
    results_root: Path
    sweep_id: str | None = None
    # `flctl export`: finished runs logged again, replacing earlier logs; a logger that failed one is given up for
    # the rest (each would wait out the same tracker), and the command says it in one line, not a warning a run
    replay: bool = False
    open: dict[tuple[str, str], Logger] = field(default_factory=dict)      # (run id, logger) -> its log
    not_logged: dict[str, list[str]] = field(default_factory=dict)        # logger -> runs it failed
    why: dict[str, str] = field(default_factory=dict)                     # logger -> its first failure (describe)
    # logger -> its class, or why it could not be found here (each run's log in it then fails with that)
    classes: dict[str, type[Logger] | Exception] = field(default_factory=dict, init=False, repr=False)
    names: tuple[str, ...] = field(default=(), init=False, repr=False)     # the loggers' names, in order

    def __post_init__(self) -> None:
        if isinstance(self.chosen, Chosen):
            self.classes = {cls.name: cls for cls in self.chosen.classes}
            self.names = self.chosen.names
            return
        self.names = tuple(self.chosen)
        for name in self.names:
            try:
                self.classes[name] = get_logger(name)
            except Exception as exc:     # noqa: BLE001 - a logger not found here fails its logs, not the training
                self.classes[name] = exc

    def start(self, cfg: Any) -> None:
        # in the training thread: a thread of the loggers' own raced its imports (a module half-imported in one
        # when the other used it), and made a two-moons run no faster
        if not self.names:          # no logger: nothing is told (not even the library versions looked up)
            return
        info = run_info(cfg, self.sweep_id, replay=self.replay)
        for name in self.names:
            self._guard(name, cfg.run_id, lambda name=name: self._open(name, info))

    def _open(self, name: str, info: RunInfo) -> None:
        cls = self.classes[name]
        assert isinstance(cls, type)        # one not found fails in _guard before its call is made
        logger = cls(self.results_root)
        logger.start(info)
        self.open[(info.run_id, name)] = logger

    def epoch(self, stats: Any) -> None:
        """One epoch's end of a run (flctl.train.EpochStats): an evaluated one is logged (an epoch between two
        evaluations has nothing a logger is told of; its numbers, a value a step, would cost a tracking store more
        than a small model's epoch)."""
        if stats.metrics is None or not self.open:
            return
        from flctl.metrics import EPOCH_NUMBERS  # numpy's module: not at `flctl.loggers`' import (the CLI's check)

        told = {k: getattr(stats, k) for k in EPOCH_NUMBERS}
        self.log(stats.run_id, stats.epoch, scalars(told, stats.metrics, stats.multipliers), stats.multipliers)

    def log(self, run_id: str, epoch: int, numbers: dict[str, float], multipliers: Any = None) -> None:
        """A run's numbers at ``epoch`` to each of its logs; the multipliers as float64 whatever they came as (a
        live run's float32 tensor, an export's column), so that a histogram's bins are the same live and exported."""
        if multipliers is not None:
            import numpy as np

            multipliers = np.asarray(multipliers, dtype=np.float64)
        for (rid, name), logger in list(self.open.items()):
            if rid == run_id:
                self._guard(name, run_id, lambda logger=logger: logger.log(epoch, numbers, multipliers))

    def finish(self, run_id: str, status: str) -> None:
        for (rid, name), logger in list(self.open.items()):
            if rid == run_id:
                self.open.pop((rid, name), None)
                self._guard(name, run_id, lambda logger=logger: logger.finish(status))

    def _guard(self, name: str, run_id: str, call: Any) -> None:
        """Run one logger call (``call_tracker``); a failure closes that run's log in that tool, with one warning."""
        # an export tries a tracker that failed no more; no process calls one again that gave no answer in time
        # (its call may still hang in its thread, and each later run would wait the whole timeout again)
        silent = gave_no_answer(name)
        given_up = (self.replay and name in self.why) or silent
        cls = self.classes[name]
        if given_up:
            failure = None
        else:
            failure = cls if isinstance(cls, Exception) else call_tracker(cls, call)
        if failure is None and not given_up:
            return
        if isinstance(failure, TimeoutError):
            no_answer(name)
        self.open.pop((run_id, name), None)
        first = run_id not in self.not_logged.setdefault(name, [])
        if first:
            self.not_logged[name].append(run_id)
        if failure is not None:
            self.why.setdefault(name, describe(failure))
        if not self.replay and (failure is not None or first):
            why = describe(failure) if failure is not None else "not tried: it gave no answer in time for an earlier run"
            warn(f"{name} stopped logging run {run_id} ({why}); its records are intact: "
                 f"once {name} works here, `flctl export {run_id} --to {name}` fills it in")

    def lines(self) -> list[str]:
        """What was not logged, a line per logger, for the end of the command."""
        return [f"{name} did not log {len(ids)} run(s) ({', '.join(ids[:5])}{', ...' if len(ids) > 5 else ''}): "
                f"once it works here, `flctl export {ids[0] if len(ids) == 1 else self.sweep_id or 'RUN'} --to {name}` fills "
                f"{'it' if len(ids) == 1 else 'them'} in" for name, ids in self.not_logged.items()]
