"""A sweep's launch settings: the spec's [launch] table, the command's flags and OMP_NUM_THREADS, checked once
(LaunchSettings), with the launcher they name (flctl.launch.backends) and its own options. How many cells each worker
trains together is flctl.grouped.policy's."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, make_dataclass
from typing import TYPE_CHECKING, Any

from flctl.config import PANELS
from flctl.errors import ConfigError
from flctl.grouped.policy import AUTO_TOGETHER, WHEN_GROUPED, cells_together
from flctl.knobs import DEFAULT_CHECKPOINT_EVERY_S, DEFAULT_MAX_ATTEMPTS, check_checkpoint_every, check_count
from flctl.launch.backends import (  # Slot: where older workers' pickles look
    Launcher,
    Slot,
    built_in,
    get_launcher,
    make_launcher,
)


def _options_of(executor: Any) -> set[str] | None:
    """The [launch] keys launcher ``executor`` reads as its own (its options, and the flags that name them); None
    where no launcher of that name is installed here."""
    try:
        launcher = get_launcher(str(executor))
    except ConfigError:
        return None
    return {f.name for f in fields(launcher.Options)} | {f.name for f in fields(LaunchFlags)}


def omp_threads() -> int | None:
    """OMP_NUM_THREADS when it is a positive integer: a machine's or shell's cap on every process's threads, which
    torch itself obeys and a worker's torch.set_num_threads(cores // W) would silently override (two workers'
    waiting threads then spin on each other's cores). Other values (OpenMP's nested lists) are left to torch."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def _flag(help: str) -> Any:
    """A launch flag of `flctl sweep` and `flctl paper`: None (not given) unless the command line says otherwise;
    its help text is read by flctl.cli.common.launch_options."""
    return field(default=None, metadata={"help": help, "panel": PANELS["launch"]})


@dataclass(frozen=True)
class _Flags:
    """The launch flags of every launcher."""

    executor: str | None = _flag("How workers start: debug (in process), local (subprocesses), slurm (a job array) "
                                 "or an installed launcher [default: the spec's, else local].")
    workers: int | None = _flag("Pull workers [" + "; ".join(f"{launcher.name}: {launcher.default_workers}"
                                                             for launcher in built_in() if launcher.default_workers)
                                + "].")
    threads: int | None = _flag("torch threads per local worker [OMP_NUM_THREADS if set, else cores // workers].")
    per_gpu: int | None = _flag("Workers sharing one GPU [1].")
    batch_runs: int | None = _flag(f"Cells a worker trains together in one process, each its own run: {WHEN_GROUPED} "
                                   "[auto: for small-model tasks an even share, at most "
                                   f"{AUTO_TOGETHER['cuda']} on a GPU, {AUTO_TOGETHER['cpu']} on a CPU; else 1].")
    checkpoint_every: float | None = _flag("Seconds between a run's checkpoints (also at eval epochs) "
                                           f"[{DEFAULT_CHECKPOINT_EVERY_S:g}].")
    max_attempts: int | None = _flag(f"Give up on a cell after this many tries [{DEFAULT_MAX_ATTEMPTS}].")
    log_to: list[str] | None = _flag("Log every run, live, to this tracker: tensorboard, mlflow, wandb or an "
                                     "installed logger (repeatable; flctl export logs finished runs).")

    def given(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


def _launcher_flags() -> list[tuple[str, Any, Any]]:
    """Each field of flctl's own launchers' Options as a flag: None unless given, its help from the field, its panel
    the launcher's title. A launcher's flags are written once, in its own file."""
    import typing

    made = []
    for launcher in built_in():
        kinds = typing.get_type_hints(launcher.Options)
        for f in fields(launcher.Options):
            made.append((f.name, typing.Optional[kinds[f.name]], field(default=None, metadata={  # noqa: UP045
                "help": f.metadata.get("help", ""), "panel": launcher.title or launcher.name})))
    return made


# What a command line said about launching (None: not given, so the spec's [launch] table or the default holds): the
# general flags, then the built-in launchers' own; LaunchSettings.resolve merges it over the spec.
if TYPE_CHECKING:        # to a type checker, the general flags (the launchers' are read by name, from dicts)
    LaunchFlags = _Flags
else:
    LaunchFlags = make_dataclass("LaunchFlags", _launcher_flags(), bases=(_Flags,), frozen=True,
                                 namespace={"__module__": __name__})


@dataclass(frozen=True)
class LaunchSettings:
    executor: str = "local"              # the launcher's name (flctl.launch.backends)
    workers: int | None = None
    threads: int | None = None
    per_gpu: int = 1
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    checkpoint_every: float = DEFAULT_CHECKPOINT_EVERY_S
    batch_runs: int | None = None        # cells together (--batch-runs); None: flctl.grouped.policy chooses
    log_to: tuple[str, ...] = ()         # the loggers every run is logged to, live (flctl.loggers)
    options: Any = None                  # the launcher's own (its Options; None: their defaults)

    @property
    def launcher(self) -> Launcher:
        return make_launcher(self.executor, self.options)

    @classmethod
    def resolve(cls, spec_launch: Mapping[str, Any], flags: Any = None) -> LaunchSettings:
        """The command line wins over the spec's [launch] table, whose keys are the flags' names (LaunchFlags) and
        the launcher's own options; --threads given by neither is OMP_NUM_THREADS when that is set (omp_threads).
        A launcher's option given to another launcher is refused (ConfigError), as are unknown keys."""
        given = (flags or LaunchFlags()).given()
        launcher = get_launcher(str(given.get("executor", spec_launch.get("executor", cls.executor))))
        general = {f.name for f in fields(cls)} - {"options"}
        own = {f.name for f in fields(launcher.Options)}
        if given.get("executor", launcher.name) != spec_launch.get("executor", launcher.name):
            # the command line moved the spec to another launcher: the spec's options for its own one stay behind
            # (where that one is not installed here to say which they are: all but the general and the new one's)
            theirs = _options_of(spec_launch.get("executor", cls.executor))
            spec_launch = {k: v for k, v in spec_launch.items()
                           if k in general or k in own or (theirs is not None and k not in theirs)}
        merged = {**spec_launch, **given}
        known = general | own | {f.name for f in fields(LaunchFlags)}
        if unknown := set(merged) - known:
            raise ConfigError(f"unknown [launch] key(s) {', '.join(sorted(unknown))}; valid: {', '.join(sorted(known))}")
        if foreign := sorted(set(merged) - general - own):
            raise ConfigError(f"--{foreign[0].replace('_', '-')} is not an option of --executor {launcher.name}")
        if merged.get("threads") is None:
            merged["threads"] = omp_threads()
        if merged.get("log_to") is not None:      # found, each with its tool installed, before anything is written
            from flctl.loggers import check

            chosen = merged["log_to"]
            merged["log_to"] = check(chosen).names
        options = launcher.Options(**{k: merged.pop(k) for k in own if k in merged})
        settings = cls(**merged, options=options)
        for name in ("workers", "threads", "per_gpu", "max_attempts", "batch_runs"):
            check_count(f"--{name.replace('_', '-')}", getattr(settings, name))
        check_checkpoint_every(settings.checkpoint_every)
        options.check()
        return settings

    def cells_per_device(self, task: str, cells: int, device: str) -> int:
        """Cells training at once on one device, as the cost estimate counts them: the cells each worker trains
        together, as the launch decides them (``together``), times the workers that share it: --per-gpu on a GPU, and on the CPU every worker (each on cores of its
        own: two workers on two cores train two groups at once). Where the workers cannot be counted here (a GPU
        planned on a laptop, perhaps one without torch) the choice assumes the --workers given, else one."""
        try:
            workers = len(self.slots(cells, device))
        except (ConfigError, ImportError):
            workers = self.workers or 1
        return self.together(task, cells, workers, device) * (
            self.per_gpu if device.startswith("cuda") else max(1, min(workers, cells)))

    def together(self, task: str, cells: int, workers: int, device: str) -> int:
        """Cells each worker trains together: --batch-runs, else the automatic choice for ``cells`` cells among
        ``workers`` workers (flctl.grouped.policy.cells_together). The launch and the cost estimate both ask here."""
        return cells_together(self.batch_runs, task, cells, workers, device)

    def slots(self, cells: int, device: str) -> list[Slot]:
        """The workers to run for ``cells`` cells still to do (the launcher's)."""
        return self.launcher.slots(cells, device, workers=self.workers, threads=self.threads, per_gpu=self.per_gpu)
