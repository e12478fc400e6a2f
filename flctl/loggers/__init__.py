"""Loggers: runs shown where researchers already look (TensorBoard, MLflow, Weights & Biases), live as they train
(`--log-to NAME`) and after the fact (`flctl export`). One file per logger, behind ``Logger``; flctl's own are
``tensorboard``, ``mlflow`` and ``wandb``, and an installed package adds one through the entry-point group
``flctl.loggers`` (docs/extending.md, "A logger of your own"), as launchers are added.

A logger is told what the training loop already brought to the host at each evaluation (``EpochStats``: the
epoch's mean and max training loss and largest multiplier, its summary metrics, the violation rate among them, and
the per-sample multipliers, of which it gets summary statistics and a histogram): it adds no host sync to a step. It is given the run's configuration as hyper-parameters, and the run and sweep ids, task,
method and library versions as tags. A logger that fails never fails the training: one warning per run, the records
intact, and a line at the end naming what was not logged (`flctl export` fills it in later).

Every call to a logger, its once-per-launch set-up included, goes through one guard (``guarded``): made in a thread
of its own and waited for at most FLCTL_TRACKER_TIMEOUT_S (flctl.knobs.tracker_timeout_s), so that a tracker that
never answers holds a command that long, not the minutes of its own retries; whatever it raises is a failure."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

from flctl.errors import ConfigError
from flctl.registry import entry_names, load_named

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
    title: str = ""         # what a person reads in the tracker's list of runs (RunConfig.title and the run id)


class Logger:
    """One run's log in one tool. Subclass it, set ``name`` (and ``needs``, the module of its tool, and ``extra``,
    the pip extra that installs it), and fill in ``start``, ``log`` and ``finish``."""

    name: ClassVar[str]
    needs: ClassVar[str | None] = None        # the tool's module: checked before anything trains
    extra: ClassVar[str | None] = None        # `pip install 'flctl[EXTRA]'` installs it
    imports: ClassVar[tuple[str, ...]] = ()   # what its calls import: imported off the clock of the first (guarded)

    def __init__(self, results_root: Path) -> None:
        self.results_root = Path(results_root)

    @classmethod
    def where(cls, results_root: Path) -> str:
        """Where its logs go, for the line that says so (a folder, a tracking server, a project)."""
        return cls.name

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
    return entry_names(GROUP, BUILT_IN)


def get_logger(name: str) -> type[Logger]:
    """The logger class named ``name``, its tool installed; ConfigError naming the choices, or the pip command that
    installs its tool."""
    if not isinstance(name, str):
        raise ConfigError(f"--log-to {name!r}: give a logger's name, one of: {', '.join(names())}")
    cls = load_named(GROUP, BUILT_IN, name, "logger", Logger, "unknown logger")
    if cls.needs is not None and importlib.util.find_spec(cls.needs) is None:
        how = install_extra(cls.extra) if cls.extra else f"pip install {cls.needs}"
        raise ConfigError(f"--log-to {name} needs {cls.needs}, which is not installed here: {how}")
    return cls


def where(chosen: Iterable[str], results_root: Path) -> str:
    """Where ``chosen`` loggers write, as one line's end: "tensorboard (results/tensorboard), mlflow (...)"."""
    from flctl.text import redact

    return ", ".join(f"{name} ({redact(get_logger(name).where(Path(results_root)))})" for name in chosen)


def install_extra(extra: str) -> str:
    """The pip command that installs flctl's ``extra`` where flctl is: from its checkout where it was installed so
    (`pip install -e .`, the README's way: 'flctl[x]' would look for flctl on the package index), else by name."""
    import json
    from importlib.metadata import PackageNotFoundError, distribution
    from urllib.parse import unquote, urlparse

    try:
        direct = json.loads(distribution("flctl").read_text("direct_url.json") or "{}")
    except (PackageNotFoundError, ValueError):
        direct = {}
    url = urlparse(direct.get("url", ""))
    if url.scheme == "file" and direct.get("dir_info", {}).get("editable"):
        return f"pip install -e '{unquote(url.path)}[{extra}]'"
    return f"pip install 'flctl[{extra}]'"


def check(chosen: Iterable[str]) -> tuple[type[Logger], ...]:
    """The classes of the loggers named (each once, in order), each found with its tool installed, and
    FLCTL_TRACKER_TIMEOUT_S read where any is (ConfigError otherwise): before anything is written or trained."""
    from flctl.knobs import tracker_timeout_s

    if isinstance(chosen, str):             # one name (a spec's `log_to = "mlflow"`, api's log_to="mlflow")
        chosen = [chosen]
    if not isinstance(chosen, Iterable) or isinstance(chosen, (bytes, dict)):
        raise ConfigError(f"log_to={chosen!r}: give a logger's name or a list of them, from: {', '.join(names())}")
    found = tuple(get_logger(name) for name in dict.fromkeys(chosen))
    if found:
        tracker_timeout_s()
    return found


def guarded(name: str, call: Callable[[], Any]) -> BaseException | None:
    """The one guard of every call to logger ``name``: None when ``call()`` returned within FLCTL_TRACKER_TIMEOUT_S,
    else what it raised, or a TimeoutError. The logger's tool (its ``needs`` and ``imports``) is imported first, in
    this thread and off the clock (an import of MLflow, W&B or torch's TensorBoard writer takes seconds, and is no
    answer of a tracker). The call itself runs in a daemon thread that this one waits for, so that calls are still
    made one at a time (a logging thread running beside training raced its imports); one given up on is left to end
    there, and never holds the process's exit."""
    from flctl.knobs import tracker_timeout_s

    try:
        cls = get_logger(name)
        for module in (cls.needs, *cls.imports):
            if module is not None:
                importlib.import_module(module)
        seconds = tracker_timeout_s()
    except Exception as exc:     # noqa: BLE001 - a tool that will not import fails its logger, not the command
        return exc
    said: list[BaseException | None] = []

    def made() -> None:
        try:
            call()
            said.append(None)
        except BaseException as exc:     # noqa: BLE001 - even a tool's KeyboardInterrupt (a prompt's closed stdin)
            said.append(exc)             # is the tool's: a user's Ctrl-C reaches the waiting thread, not this one

    thread = threading.Thread(target=made, name=f"flctl-{name}", daemon=True)
    thread.start()
    thread.join(seconds)
    return said[0] if said else TimeoutError(f"no answer within {seconds:g} s (FLCTL_TRACKER_TIMEOUT_S)")


def describe(failure: BaseException) -> str:
    """A failure in a warning: its kind and the first line of its message, after the socket's error it came from
    where there is one (a tool's own message, a URL and its retries, cuts off the "Connection refused" at its end)."""
    def first(exc: BaseException, most: int) -> str:
        return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:most]}"

    root, seen = failure, {id(failure)}
    while (below := root.__cause__ or root.__context__) is not None and id(below) not in seen:
        root = below
        seen.add(id(root))
    if root is failure or not isinstance(root, OSError):
        return first(failure, 200)
    return f"{first(root, 100)}, from {first(failure, 140)}"


def warn(text: str) -> None:
    print(f"flctl: warning: {text}", file=sys.stderr, flush=True)


def prepare(chosen: Sequence[str], results_root: Path, sweep_id: str) -> tuple[str, ...]:
    """Each logger's once-per-launch set-up (Logger.prepare), guarded as every call: the loggers ready. One whose
    set-up failed is one warning naming the export that fills its runs in later, and the sweep trains without it
    (each of its runs would otherwise wait out the same tracker)."""
    ready = []
    for name in chosen:
        failure = guarded(name, partial(get_logger(name).prepare, results_root))
        if failure is None:
            ready.append(name)
        else:
            warn(f"{name} could not be set up ({describe(failure)}); sweep {sweep_id} trains without it, its records "
                 f"intact: once {name} works here, `flctl export {sweep_id} --to {name}` fills it in")
    return tuple(ready)


def run_info(cfg: Any, sweep_id: str | None = None, *, replay: bool = False) -> RunInfo:
    """What a logger is told of the run of ``cfg`` (a RunConfig)."""
    from flctl.versions import library_versions

    params = {k: v for k, v in cfg.to_dict().items() if k != "options"}
    params |= {f"options.{k}": v for k, v in sorted(cfg.opts.items())}
    tags = {"flctl.run_id": cfg.run_id, "flctl.task": cfg.task, "flctl.method": cfg.method,
            **({"flctl.sweep_id": sweep_id} if sweep_id else {}),
            **{f"version.{k}": str(v) for k, v in library_versions().items()}}
    return RunInfo(cfg.run_id, sweep_id, cfg.task, cfg.method, params, tags, replay,
                   title=f"{cfg.title} · {cfg.run_id}")


def scalars(epoch_avg: float | None, epoch_max: float | None, max_multiplier: float | None,
            metrics: dict[str, float] | None, multipliers: Any) -> dict[str, float]:
    """An epoch's numbers as every logger gets them: the epoch's training-batch losses and largest multiplier
    (``epoch.*``), an evaluation's summary metrics under flctl's names, and the multipliers' summary statistics
    (``multipliers.*``: mean, max, the share above zero, the 50th, 90th and 99th percentiles)."""
    import numpy as np

    from flctl.metrics import EPOCH_NUMBERS

    out = {f"epoch.{k}": float(v) for k, v in zip(EPOCH_NUMBERS, (epoch_avg, epoch_max, max_multiplier)) if v is not None}
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
    # `flctl export`: finished runs logged again, replacing earlier logs; a logger that failed one is given up for
    # the rest (each would wait out the same tracker), and the command says it in one line, not a warning a run
    replay: bool = False
    open: dict[tuple[str, str], Logger] = field(default_factory=dict)      # (run id, logger) -> its log
    not_logged: dict[str, list[str]] = field(default_factory=dict)        # logger -> runs it failed
    why: dict[str, str] = field(default_factory=dict)                     # logger -> its first failure (describe)

    def start(self, cfg: Any) -> None:
        # in the training thread: a thread of the loggers' own raced its imports (a module half-imported in one
        # when the other used it), and made a two-moons run no faster
        if not self.chosen:         # no logger: nothing is told (not even the library versions looked up)
            return
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
        if stats.metrics is None or not self.open:
            return
        self.log(stats.run_id, stats.epoch, scalars(stats.train_avg_loss, stats.train_max_loss, stats.max_multiplier,
                                                    stats.metrics, stats.multipliers), stats.multipliers)

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
        """Run one logger call (``guarded``); a failure closes that run's log in that tool, with one warning."""
        # an export tries a tracker that failed no more; no process calls one again that gave no answer in time
        # (its call may still hang in its thread, and each later run would wait the whole timeout again)
        silent = name in _NO_ANSWER
        given_up = (self.replay and name in self.why) or silent
        failure = None if given_up else guarded(name, call)
        if failure is None and not given_up:
            return
        if isinstance(failure, TimeoutError):
            _NO_ANSWER.add(name)
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


# The loggers that gave no answer within FLCTL_TRACKER_TIMEOUT_S in this process: not called again (Logging._guard).
_NO_ANSWER: set[str] = set()

