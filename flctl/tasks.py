"""Task registry. A task is one file defining ``TASK = Task(...)``: its data, model and the paper's defaults.

flctl's own tasks are the files under the top-level ``tasks/`` folder, installed as ``flctl_tasks``; a researcher's
come from an installed package's entry point or a file named by FLCTL_TASKS (flctl.plugins), without an edit here.
A task named ``two-moons`` lives in ``two_moons.py``: using one task imports only its module (not torchvision, nor
another task's module unless it builds on it: fashion-mnist takes cifar10's paper defaults); listing all tasks
imports them all. A task module imports torch, scikit-learn and torchvision inside the functions that use them, so
planning a sweep (its defaults, options, checks) starts the workers without those imports (tests/test_process.py checks it; orca-dpo's policy class needs torch).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from flctl import plugins
from flctl.errors import ConfigError
from flctl.plugins import Source

if TYPE_CHECKING:
    import numpy as np
    import torch


class OfATask(Protocol):
    """What the functions below read of a run's configuration (flctl.config.RunConfig, a layer beside this one)."""

    @property
    def task(self) -> str: ...

    @property
    def opts(self) -> dict[str, Any]: ...

    @property
    def data_dir(self) -> str | None: ...

# classification: cross-entropy of logits; regression: squared error; preference: DPO, where the model outputs
# the policy's log-ratio margin and the targets hold the frozen reference's (see flctl.losses).
Kind = Literal["classification", "regression", "preference"]


@dataclass(frozen=True)
class Augment:
    """A task's random augmentation of training batches, split so that a captured step can replay it: ``draw`` takes
    one batch's random parameters from a generator (eagerly, at the start of each epoch, batch after batch in the
    epoch's order: the draws of an augmentation that drew inside the step), ``apply`` uses them inside the step (no
    generator, no host sync). See flctl.data.crop_flip."""

    draw: Callable[[int, torch.Generator, torch.device], dict[str, torch.Tensor]]   # (batch size, generator, device)
    apply: Callable[[torch.Tensor, dict[str, torch.Tensor]], torch.Tensor]          # (x [B, ...], parameters) -> x


@dataclass(frozen=True)
class Task:
    name: str
    kind: Kind
    description: str
    # RunConfig fields with the paper's values (epochs, batch_size, optimizer, lr, ..., eps, alpha, dual_lr).
    defaults: Mapping[str, Any]
    # load(options, data_dir) -> flctl.data.Dataset
    load: Callable[..., Any]
    # build_model(options, dataset) -> torch.nn.Module; None for tasks solved without gradient training.
    build_model: Callable[..., Any] | None = None
    # Task-specific options with defaults (``-o KEY=VALUE`` on the command line); part of the run identity.
    options: Mapping[str, Any] = field(default_factory=dict)
    # Option defaults that depend on where a run trains, by device kind ("cuda", "cpu"), over ``options``: e.g. the
    # paper's ResNet-18 on a GPU and a small CNN on a CPU. Settled when the run is resolved, so its identity holds the
    # value it trained with.
    device_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # The methods the task accepts; None: every method described in flctl.method_info (see ``supported``).
    methods: tuple[str, ...] | None = None
    # Random augmentation of training batches on the device (flctl.data.Augment: its parameters are drawn once per
    # epoch from the cell's own generator, then applied batch by batch inside the step).
    augment: Augment | None = None
    # extras(model, dataset, options) -> {name: ndarray}, saved next to the records after training
    # (e.g. two-moons' MLP layers, which reports evaluate on a grid in numpy: they draw without torch).
    extras: Callable[..., dict] | None = None
    # solve(config, dataset) -> Solution for tasks with their own solver (polyfit: CVXPY).
    solve: Callable[..., Any] | None = None
    # check(options, data_dir) raises ConfigError when the dataset is missing or incomplete; run before
    # anything is written, so bad input leaves no database row behind (see ``check_data``).
    check: Callable[..., None] | None = None
    # False: the task makes its samples or a library bundles them, so it reads no --data (which is refused rather
    # than recorded as the run's data), and the paper programme's --data-dir does not reach it.
    reads_data: bool = True
    # prepare(model, dataset, options, precision) runs once the model is on the device, before training (and again on a
    # resume): for targets that depend on the initial model, e.g. DPO's reference log-ratios.
    prepare: Callable[..., None] | None = None
    # data_source(options, data_dir) -> str: what the data came from, recorded with each run (flctl.tasks.describe_data):
    # a package and its version, a folder and its files' hash. None: the data folder, or the task's own code.
    data_source: Callable[..., str] | None = None
    # Samples per forward pass when evaluating per-sample losses (small for long token sequences).
    eval_chunk: int = 4096
    # A small model: on the CPU too, cells of this task together in a worker become one grouped model rather than
    # step one by one, interleaved (it measured faster: benchmarks/bench_together.py), and a worker takes several by
    # default. On CUDA cells of every groupable model are grouped. flctl.grouped.policy reads it.
    batched: bool = False
    # Inclusive (low, high) bounds of numeric options (None: open); checked before anything is written.
    option_ranges: Mapping[str, tuple[float | None, float | None]] = field(default_factory=dict)
    # Per-method departures from ``defaults`` (e.g. the paper's CSERM step size of lr/10 on CIFAR-10 and UTKFace).
    method_defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # Why a run's numbers do not depend on its seed, for a task whose do not (its data drawn by an option, a
    # deterministic solver): a sweep over several seeds plans identical cells, and says so with this. None: they do.
    seed_free: str | None = None
    # The paper programme's smoke scale (flctl.paper.programme.scaled): run fields and, under "options", task options that
    # make a cell tiny beyond one seed, two epochs and 256 samples (e.g. a narrow network).
    smoke: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for kind, opts in self.device_options.items():   # a slip here would surface as a KeyError in a worker
            unknown = set(opts) - set(self.options)
            if kind not in ("cpu", "cuda") or unknown:
                raise ConfigError(f"task {self.name!r}: device_options are keyed by cpu or cuda and set declared "
                                  f"options; got {kind!r} with {', '.join(sorted(unknown)) or 'no unknown option'}")

    def options_for(self, device: str) -> dict[str, Any]:
        """The option defaults of runs on ``device`` (cpu, cuda, cuda:N)."""
        return {**self.options, **self.device_options.get(device.partition(":")[0], {})}

    def defaults_for(self, method: str) -> dict[str, Any]:
        """The paper's values of the run fields for ``method`` on this task; given values override them."""
        return {**self.defaults, **self.method_defaults.get(method, {})}

    @property
    def supported_methods(self) -> tuple[str, ...]:
        from flctl.method_info import METHOD_INFO

        if self.methods is not None:
            return self.methods
        return tuple(sorted(METHOD_INFO, key=lambda m: METHOD_INFO[m].order))


@dataclass
class Solution:
    """What a task with its own solver (no gradient loop) returns; see tasks/polyfit.py.

    ``train`` and ``test`` map "loss", "prediction", "target" (and "correct" if it applies) to per-sample
    arrays ordered by sample id, as flctl.losses.evaluate does for trained models.
    """

    train: dict[str, np.ndarray]
    test: dict[str, np.ndarray]
    extras: dict[str, np.ndarray] = field(default_factory=dict)
    multipliers: np.ndarray | None = None


def _builtin() -> dict[str, Task]:
    global _BUILTIN
    if _BUILTIN is None:
        import flctl_tasks

        found: dict[str, Task] = {}
        for mod in pkgutil.iter_modules(flctl_tasks.__path__):
            if mod.name.startswith("_"):
                continue
            task = getattr(importlib.import_module(f"flctl_tasks.{mod.name}"), "TASK", None)
            if isinstance(task, Task):
                found[task.name] = task
        _BUILTIN = dict(sorted(found.items()))
    return _BUILTIN


_BUILTIN: dict[str, Task] | None = None
_SOURCES: dict[str, Source] = {}     # task name -> where the task this process uses came from


def _builtin_one(name: str) -> Task | None:
    """flctl's own task ``name`` by the naming convention (its module alone imported), else by full discovery."""
    if _BUILTIN is None and name.replace("-", "_").isidentifier():
        try:
            task = getattr(importlib.import_module(f"flctl_tasks.{name.replace('-', '_')}"), "TASK", None)
        except ModuleNotFoundError as exc:
            if not (exc.name or "").startswith("flctl_tasks"):
                raise
            task = None
        if isinstance(task, Task) and task.name == name:
            return task
    return _builtin().get(name)


@dataclass(frozen=True)
class Listed:
    """One task name as `flctl tasks` shows it: the task, every definition of the name (flctl's own first) and, when
    there is more than one, the one line that refuses the name (``clash``)."""

    task: Task
    sources: tuple[Source, ...]
    clash: str | None = None


@dataclass(frozen=True)
class _Plugins:
    tasks: dict[str, tuple[Task, Source]]              # plugin tasks by name, each name defined once among them
    twice: dict[str, list[tuple[Task, Source]]]        # names several plugins define: every definition


def _plugin_tasks() -> _Plugins:
    """Every plugin task (flctl.plugins), with the names several plugins define set apart. Read once per plugin list
    (get_task is called per cell of a sweep: the entry point scan alone takes milliseconds)."""
    key = tuple(plugins.paths())
    if key not in _PLUGIN_TASKS:
        _PLUGIN_TASKS[key] = _read_plugin_tasks()
    return _PLUGIN_TASKS[key]


_PLUGIN_TASKS: dict[tuple[str, ...], _Plugins] = {}


def _read_plugin_tasks() -> _Plugins:
    defined: dict[str, list[tuple[Task, Source]]] = {}
    for task, source in plugins.task_modules():
        if not isinstance(task, Task):
            plugins.report(source.module, f"plugin {source.where()}: TASK is a {type(task).__name__}, not a "
                                          "flctl.tasks.Task")
            continue
        defined.setdefault(task.name, []).append((task, source))
    return _Plugins({n: d[0] for n, d in defined.items() if len(d) == 1},
                    {n: d for n, d in defined.items() if len(d) > 1})


def _twice(name: str, sources: Sequence[Source | None]) -> str:
    """The one line that refuses a task name defined more than once (None: flctl's own)."""
    count = "twice" if len(sources) == 2 else f"{len(sources)} times"
    where = [("built into flctl" if s is None else f"by {s.where()}") for s in sources]
    if sources[0] is None:          # flctl's own name: the plugins' tasks are the ones to rename
        fix = "rename the plugin's task" if len(sources) == 2 else "rename the plugins' tasks"
    else:
        fix = "remove or rename one" if len(sources) == 2 else "remove or rename all but one"
    return f"task {name!r} is defined {count}: {', '.join(where[:-1])} and {where[-1]}; {fix}"


def _clash(name: str, found: _Plugins, builtin: Task | None) -> ConfigError | None:
    """The refusal of ``name`` when it is defined more than once (by a plugin and flctl, or by several plugins)."""
    mine: list[Source | None] = [None] if builtin is not None else []
    theirs = [s for _, s in found.twice.get(name, [])] or ([found.tasks[name][1]] if name in found.tasks else [])
    return ConfigError(_twice(name, [*mine, *theirs])) if len(mine) + len(theirs) > 1 else None


def all_tasks() -> dict[str, Task]:
    """Every task a command can use: flctl's own and the plugins' (flctl.plugins), by name. A name defined more
    than once is left out (``listing`` shows it, flagged; get_task refuses it)."""
    return {item.task.name: item.task for item in listing() if item.clash is None}


def listing() -> list[Listed]:
    """Every task name, flctl's own and the plugins', sorted, each with where it is defined; a name defined more
    than once is listed all the same, with the line that refuses it (``flctl tasks`` flags it; the other tasks
    are still usable)."""
    found = _plugin_tasks()
    builtin = _builtin()
    items: list[Listed] = []
    for name in sorted({*builtin, *found.tasks, *found.twice}):
        own = builtin.get(name)
        defs = found.twice.get(name) or ([found.tasks[name]] if name in found.tasks else [])
        if own is None and len(defs) == 1:
            _SOURCES[name] = defs[0][1]
        clash = _clash(name, found, own)
        sources = ((plugins.module_source(own.load.__module__),) if own is not None else ()) + tuple(s for _, s in defs)
        items.append(Listed(own if own is not None else defs[0][0], sources, str(clash) if clash is not None else None))
    return items


def check_task_data(task: Task, options: Mapping[str, Any], data_dir: str | None, *, look: bool = True) -> None:
    """Before anything is written: a --data the task does not read is refused; with ``look`` (not a dry run), the
    task's own check runs, and for a task without one a --data path that is not there is refused (it would be
    recorded as the run's data)."""
    from pathlib import Path

    if data_dir is not None and not task.reads_data:
        raise ConfigError(f"{task.name} reads no --data: its samples come with the task ({task.description})")
    if not look:
        return
    if task.check is not None:
        task.check(options, data_dir)
    elif data_dir is not None and not Path(data_dir).exists():
        raise ConfigError(f"--data {data_dir}: no such file or folder")


def describe_data(cfg: OfATask) -> str:
    """What ``cfg``'s data came from, as its run records it: the task's ``data_source``, else the data folder, else
    the task's own code (generated or bundled data: the library versions the run records say which)."""
    task = get_task(cfg.task)
    if task.data_source is not None:
        return task.data_source(cfg.opts, cfg.data_dir)
    return f"folder {cfg.data_dir}" if cfg.data_dir else f"made by the task {cfg.task!r} (see the library versions)"


def task_source(name: str) -> Source:
    """Where task ``name``'s code comes from (what a run records as its provenance)."""
    task = get_task(name)              # a plugin's source is noted as it is found
    return _SOURCES.get(name) or plugins.module_source(task.load.__module__)


def canonical_name(name: str) -> str:
    """The task ``name`` means: itself where a task has it, else the one task whose name differs only in case
    (Two-Moons is two-moons, as FL is fl; a config and a sweep carry the task's own spelling, so a run's id is the same
    however it was typed), else ``name`` unchanged (get_task then refuses it)."""
    known = all_tasks()
    folded = [n for n in known if n.casefold() == name.casefold()]
    return name if name in known or len(folded) != 1 else folded[0]


def get_task(name: str) -> Task:
    # The plugins are few and light: all of them load, so that a plugin shadowing a built-in name is seen.
    found = _plugin_tasks()
    builtin = _builtin_one(name)
    clash = _clash(name, found, builtin)
    if clash is not None:
        raise clash
    if name in found.tasks:
        _SOURCES[name] = found.tasks[name][1]
        return found.tasks[name][0]
    if builtin is not None:
        return builtin
    if (named := canonical_name(name)) != name:
        return get_task(named)
    known = ", ".join(all_tasks())
    broken = plugins.problems()
    hint = f"; {len(broken)} plugin(s) did not load: {' | '.join(broken)}" if broken else ""
    if name.endswith(".toml"):
        hint += f"; a sweep spec is given as --spec {name}"
    raise ConfigError(f"unknown task {name!r}; choose one of: {known} (see `flctl tasks`){hint}")
