"""Loggers: runs shown where researchers already look (TensorBoard, MLflow, Weights & Biases), live as they train
(`--log-to NAME`) and after the fact (`flctl export`). One file per logger, behind ``Logger``; flctl's own are
``tensorboard``, ``mlflow`` and ``wandb``, and an installed package adds one through the entry-point group
``flctl.loggers`` (docs/extending.md, "A logger of your own"), as launchers are added.

A logger is told what the training loop already brought to the host at each evaluation (``EpochStats``: the
epoch's mean and max training loss and largest multiplier, its summary metrics, the violation rate among them, and
the per-sample multipliers, of which it gets summary statistics and a histogram): it adds no host sync to a step. It is given the run's configuration as hyper-parameters, and the run and sweep ids, task,
method and library versions as tags. A logger that fails never fails the training: one warning per run, the records
intact, and a line at the end naming what was not logged (`flctl export` fills it in later)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from flctl.errors import ConfigError

GROUP = "flctl.loggers"
BUILT_IN = {"tensorboard": "flctl.loggers.tensorboard:TensorBoard", "mlflow": "flctl.loggers.mlflow:MLflow",
            "wandb": "flctl.loggers.wandb:WandB"}


@dataclass(frozen=True)
class RunInfo:
    """What a logger is told of a run as it starts: ``params`` (its configuration, flat: task options as
    ``options.KEY``) and ``tags`` (run and sweep ids, task, method, library versions). ``replay``: `flctl export`
    logs a finished run again; what an earlier log of it left is replaced, never added to."""

    run_id: str
    sweep_id: str | None
    task: str
    method: str
    params: dict[str, Any]
    tags: dict[str, str]
    replay: bool = False


class Logger:
    """One run's log in one tool. Subclass it, set ``name`` (and ``needs``, the module of its tool, and ``extra``,
    the pip extra that installs it), and fill in ``start``, ``log`` and ``finish``."""

    name: ClassVar[str]
    needs: ClassVar[str | None] = None        # the tool's module: checked before anything trains
    extra: ClassVar[str | None] = None        # `pip install 'flctl[EXTRA]'` installs it

    def __init__(self, results_root: Path) -> None:
        self.results_root = Path(results_root)

    @classmethod
    def prepare(cls, results_root: Path) -> None:
        """Once, in the launching process, before a sweep's workers start: what they would otherwise all make at
        once (an MLflow store and its experiment)."""

    def start(self, run: RunInfo) -> None:
        raise NotImplementedError

    def log(self, epoch: int, scalars: dict[str, float], multipliers: Any = None) -> None:
        """An epoch's numbers (flctl's metric names), and at an evaluated epoch the multipliers (numpy, one per
        training sample; None for a method without them) for a histogram."""
        raise NotImplementedError

    def finish(self, status: str) -> None:
        raise NotImplementedError


def names() -> list[str]:
    """Every logger's name: flctl's own, then installed ones."""
    return list(BUILT_IN) + [ep.name for ep in _entry_points() if ep.name not in BUILT_IN]


def get_logger(name: str) -> type[Logger]:
    """The logger class named ``name``, its tool installed; ConfigError naming the choices, or the pip command that
    installs its tool."""
    from flctl.plugins import load_object

    if not isinstance(name, str):
        raise ConfigError(f"--log-to {name!r}: give a logger's name, one of: {', '.join(names())}")
    target = BUILT_IN.get(name) or next((ep.value for ep in _entry_points() if ep.name == name), None)
    if target is None:
        raise ConfigError(f"unknown logger {name!r}; choose one of: {', '.join(names())}")
    cls = load_object(target)
    if not (isinstance(cls, type) and issubclass(cls, Logger) and getattr(cls, "name", None) == name):
        raise ConfigError(f"{target} is not a flctl.loggers.Logger subclass named {name!r}")
    if cls.needs is not None and importlib.util.find_spec(cls.needs) is None:
        how = f"pip install 'flctl[{cls.extra}]'" if cls.extra else f"pip install {cls.needs}"
        raise ConfigError(f"--log-to {name} needs {cls.needs}, which is not installed here: {how}")
    return cls


def check(chosen: Iterable[str]) -> tuple[str, ...]:
    """The loggers named (each once, in order), each found with its tool installed (ConfigError otherwise): before
    anything is written or trained."""
    chosen = tuple(dict.fromkeys(chosen))
    for name in chosen:
        get_logger(name)
    return chosen


def run_info(cfg: Any, sweep_id: str | None = None, *, replay: bool = False) -> RunInfo:
    """What a logger is told of the run of ``cfg`` (a RunConfig)."""
    from flctl.versions import library_versions

    params = {k: v for k, v in cfg.to_dict().items() if k != "options"}
    params |= {f"options.{k}": v for k, v in sorted(cfg.opts.items())}
    tags = {"flctl.run_id": cfg.run_id, "flctl.task": cfg.task, "flctl.method": cfg.method,
            **({"flctl.sweep_id": sweep_id} if sweep_id else {}),
            **{f"version.{k}": str(v) for k, v in library_versions().items()}}
    return RunInfo(cfg.run_id, sweep_id, cfg.task, cfg.method, params, tags, replay)


def scalars(epoch_avg: float | None, epoch_max: float | None, max_multiplier: float | None,
            metrics: dict[str, float] | None, multipliers: Any) -> dict[str, float]:
    """An epoch's numbers as every logger gets them: the epoch's training-batch losses and largest multiplier
    (``epoch.*``), an evaluation's summary metrics under flctl's names, and the multipliers' summary statistics
    (``multipliers.*``: mean, max, the share above zero, the 50th, 90th and 99th percentiles)."""
    import numpy as np

    out: dict[str, float] = {}
    for key, value in (("epoch.train_avg_loss", epoch_avg), ("epoch.train_max_loss", epoch_max),
                       ("epoch.max_multiplier", max_multiplier)):
        if value is not None:
            out[key] = float(value)
    out |= {k: float(v) for k, v in (metrics or {}).items() if v is not None}
    if multipliers is not None and len(multipliers):
        lam = np.asarray(multipliers, dtype=np.float64)
        p50, p90, p99 = np.percentile(lam, [50, 90, 99])
        out |= {"multipliers.mean": float(lam.mean()), "multipliers.max": float(lam.max()),
                "multipliers.active_share": float((lam > 0).mean()), "multipliers.p50": float(p50),
                "multipliers.p90": float(p90), "multipliers.p99": float(p99)}
    return out


@dataclass
class Logging:
    """The loggers of the runs one process trains: each run's log in each tool, told at each evaluation; its
    failures told once per run and kept (``not_logged``) for the line at the end."""

    chosen: Sequence[str]
    results_root: Path
    sweep_id: str | None = None
    replay: bool = False                 # `flctl export`: finished runs logged again, replacing earlier logs
    open: dict[tuple[str, str], Logger] = field(default_factory=dict)      # (run id, logger) -> its log
    not_logged: dict[str, list[str]] = field(default_factory=dict)        # logger -> runs it failed

    def start(self, cfg: Any) -> None:
        # in the training thread: a thread of the loggers' own raced its imports (a module half-imported in one
        # when the other used it), and made a two-moons run no faster
        info = run_info(cfg, self.sweep_id, replay=self.replay)
        for name in self.chosen:
            self._guard(name, cfg.run_id, lambda name=name: self._open(name, info))

    def _open(self, name: str, info: RunInfo) -> None:
        logger = get_logger(name)(self.results_root)
        logger.start(info)
        self.open[(info.run_id, name)] = logger

    def epoch(self, stats: Any) -> None:
        """One epoch's end of a run (flctl.train.EpochStats): an evaluated one is logged (an epoch between two
        evaluations has nothing a logger is told of; its numbers, a value a step, would cost a tracking store more
        than a small model's epoch)."""
        if stats.metrics is None:
            return
        self.log(stats.run_id, stats.epoch, scalars(stats.train_avg_loss, stats.train_max_loss, stats.max_multiplier,
                                                    stats.metrics, stats.multipliers), stats.multipliers)

    def log(self, run_id: str, epoch: int, numbers: dict[str, float], multipliers: Any = None) -> None:
        for (rid, name), logger in list(self.open.items()):
            if rid == run_id:
                self._guard(name, run_id, lambda logger=logger: logger.log(epoch, numbers, multipliers))

    def finish(self, run_id: str, status: str) -> None:
        for (rid, name), logger in list(self.open.items()):
            if rid == run_id:
                self.open.pop((rid, name), None)
                self._guard(name, run_id, lambda logger=logger: logger.finish(status))

    def _guard(self, name: str, run_id: str, call: Any) -> None:
        """Run one logger call; a failure closes that run's log in that tool, with one warning."""
        try:
            call()
        except Exception as exc:     # noqa: BLE001 - a logger never fails the training
            self.open.pop((run_id, name), None)
            self.not_logged.setdefault(name, []).append(run_id)
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            print(f"flctl: warning: {name} stopped logging run {run_id} ({type(exc).__name__}: {first}); its "
                  f"records are intact: `flctl export {run_id} --to {name}` fills it in later",
                  file=sys.stderr, flush=True)

    def lines(self) -> list[str]:
        """What was not logged, a line per logger, for the end of the command."""
        return [f"{name} did not log {len(ids)} run(s) ({', '.join(ids[:5])}{', ...' if len(ids) > 5 else ''}): "
                f"`flctl export RUN --to {name}` fills them in" for name, ids in self.not_logged.items()]


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    return sorted(importlib.metadata.entry_points(group=GROUP), key=lambda ep: ep.name)
