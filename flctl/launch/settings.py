"""A sweep's launch settings: the spec's [launch] table, the command's flags and OMP_NUM_THREADS, checked once
(LaunchSettings); where its workers run (Slot: local processes on CPU cores or GPUs, Slurm array tasks) and how many
cells each trains together."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from flctl.errors import ConfigError
from flctl.knobs import (
    AUTO_BATCH_RUNS,
    DEFAULT_CHECKPOINT_EVERY_S,
    DEFAULT_MAX_ATTEMPTS,
    SLURM_DEFAULT_WORKERS,
    check_checkpoint_every,
    check_count,
)

EXECUTORS = ("debug", "local", "slurm")


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    gpus: int | None = None
    cpus: int | None = None
    mem_gb: float | None = None
    time_min: int | None = None
    account: str | None = None
    qos: str | None = None
    array_parallelism: int | None = None
    # Extra sbatch options (KEY=VALUE -> #SBATCH --KEY=VALUE): submitit writes each one as a line of the batch script
    # that bash runs, with the value shell-quoted and the key as it is; check_script_text() keeps both on their line.
    extra: dict[str, str] = field(default_factory=dict)

    def check_script_text(self) -> None:
        """Refuse what would break out of its `#SBATCH` line in the generated batch script: a newline there starts a
        line of its own, which bash runs when the job starts (any control character is refused, ESC included).
        Partition, account and qos are one word; sbatch keys are option names."""

        from flctl.text import first_control

        for name in ("partition", "account", "qos"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value)
                                      or first_control(value) is not None):
                raise ConfigError(f"--{name} must be one word, got {value!r}")
        for key, value in self.extra.items():
            if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", key):
                raise ConfigError(f"--sbatch {key!r}: an sbatch option name is letters, digits, '-' and '_' "
                                  "(e.g. --sbatch constraint=a100)")
            bad = first_control(value)
            if bad is not None:
                raise ConfigError(f"--sbatch {key}={value!r}: the value holds a control character (U+{ord(bad):04X}), "
                                  "which would start a line of its own in the Slurm batch script")

    def parameters(self) -> dict[str, Any]:
        p: dict[str, Any] = {}
        for key, value in (("slurm_partition", self.partition), ("gpus_per_node", self.gpus),
                           ("cpus_per_task", self.cpus), ("mem_gb", self.mem_gb), ("timeout_min", self.time_min),
                           ("slurm_account", self.account), ("slurm_qos", self.qos),
                           ("slurm_array_parallelism", self.array_parallelism)):
            if value is not None:
                p[key] = value
        if self.extra:
            p["slurm_additional_parameters"] = dict(self.extra)
        return p


@dataclass(frozen=True)
class Slot:
    """Where one worker runs: its index, its torch intra-op threads and, on GPUs, its CUDA_VISIBLE_DEVICES."""

    index: int
    threads: int | None = None
    cuda: str | None = None


def omp_threads() -> int | None:
    """OMP_NUM_THREADS when it is a positive integer: a machine's or shell's cap on every process's threads, which
    torch itself obeys and a worker's torch.set_num_threads(cores // W) would silently override (two workers'
    waiting threads then spin on each other's cores). Other values (OpenMP's nested lists) are left to torch."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def cuda_devices() -> list[str]:
    """The CUDA devices this process may use, as CUDA_VISIBLE_DEVICES entries (imports torch)."""
    import torch

    count = torch.cuda.device_count()
    listed = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return listed[:count] if "CUDA_VISIBLE_DEVICES" in os.environ else [str(i) for i in range(count)]


def local_slots(cells: int, *, device: str, workers: int | None = None, threads: int | None = None,
                per_gpu: int = 1, cores: int | None = None, gpus: Sequence[str] | None = None) -> list[Slot]:
    """The local executor's workers. On the CPU: W = max(1, cores // threads) unless given, each with
    threads = cores // W (at least 1). On CUDA: W = GPUs x per_gpu, worker i on GPU i // per_gpu. Never more
    workers than cells (threads are then shared among the workers that run)."""
    for name, value in (("--workers", workers), ("--threads", threads), ("--per-gpu", per_gpu)):
        check_count(name, value)
    cores = cores or cpu_count()
    if device.startswith("cuda"):
        if gpus is None:
            gpus = cuda_devices()
        if device != "cuda":                  # cuda:N: that one device
            index = int(device.partition(":")[2] or 0)
            if index >= len(gpus):
                raise ConfigError(f"--device {device}: this machine has {len(gpus)} visible CUDA device(s)")
            gpus = [gpus[index]]
        if not gpus:
            raise ConfigError(f"--device {device}: no CUDA device is visible here (torch.cuda.device_count() is 0)")
        w = min(workers or len(gpus) * per_gpu, max(cells, 1))
        t = threads or max(1, cores // w)
        return [Slot(i, t, gpus[(i // per_gpu) % len(gpus)]) for i in range(w)]
    w = min(workers or max(1, cores // (threads or 1)), max(cells, 1))
    t = threads or max(1, cores // w)     # the cores of workers a short sweep does not need go to the others
    return [Slot(i, t) for i in range(w)]


def slurm_workers(cells: int, workers: int | None, per_gpu: int) -> list[Slot]:
    """Slurm: W workers (default min(cells, SLURM_DEFAULT_WORKERS)); with ``per_gpu`` K they run K to a job."""
    for name, value in (("--workers", workers), ("--per-gpu", per_gpu)):
        check_count(name, value)
    w = min(workers or SLURM_DEFAULT_WORKERS, max(cells, 1))
    return [Slot(i) for i in range(math.ceil(w / per_gpu) * per_gpu)]


def _flag(help: str, panel: str = "launch") -> Any:
    """A launch flag of `flctl sweep` and `flctl paper`: None (not given) unless the command line says otherwise;
    its help text and help panel (launch or slurm) are read by flctl.cli.common.launch_options."""
    return field(default=None, metadata={"help": help, "panel": panel})


@dataclass(frozen=True)
class LaunchFlags:
    """What a command line said about launching (None: not given, so the spec's [launch] table or the default
    holds). One field per option, its help written here once; LaunchSettings.resolve merges it over the spec."""

    executor: str | None = _flag("debug (in process), local (subprocesses) or slurm [default: the spec's, else local].")
    workers: int | None = _flag("Pull workers [local: cores // threads, or GPUs x per-gpu with --device cuda; slurm: "
                                f"min(cells, {SLURM_DEFAULT_WORKERS})].")
    threads: int | None = _flag("torch threads per local worker [OMP_NUM_THREADS if set, else cores // workers].")
    per_gpu: int | None = _flag("Workers sharing one GPU [1].")
    batch_runs: int | None = _flag("Cells a worker trains together in one process, each equal to the cell alone "
                                   "(one grouped model on CUDA and for small models; others: step by step) [auto: on a GPU for small models an even share, at most "
                                   f"{AUTO_BATCH_RUNS}; else 1].")
    checkpoint_every: float | None = _flag("Seconds between a run's checkpoints (also at eval epochs) "
                                           f"[{DEFAULT_CHECKPOINT_EVERY_S:g}].")
    max_attempts: int | None = _flag(f"Give up on a cell after this many tries [{DEFAULT_MAX_ATTEMPTS}].")
    partition: str | None = _flag("Slurm partition (sbatch --partition).", "slurm")
    gpus: int | None = _flag("GPUs per job.", "slurm")
    cpus: int | None = _flag("CPUs per job.", "slurm")
    mem_gb: float | None = _flag("Memory per job in GB (sbatch --mem).", "slurm")
    time_min: int | None = _flag("Time limit per job.", "slurm")
    account: str | None = _flag("Slurm account to charge (sbatch --account).", "slurm")
    qos: str | None = _flag("Slurm quality of service (sbatch --qos).", "slurm")
    array_parallelism: int | None = _flag("Slurm array tasks running at once (sbatch --array=...%N).", "slurm")
    sbatch: dict[str, str] | None = _flag("Extra sbatch option KEY=VALUE (repeatable).", "slurm")

    def given(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


@dataclass(frozen=True)
class LaunchSettings:
    executor: str = "local"
    workers: int | None = None
    threads: int | None = None
    per_gpu: int = 1
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    checkpoint_every: float = DEFAULT_CHECKPOINT_EVERY_S
    batch_runs: int | None = None        # None: batch_runs_for() chooses
    slurm: SlurmOptions = field(default_factory=SlurmOptions)

    @classmethod
    def resolve(cls, spec_launch: Mapping[str, Any], flags: LaunchFlags = LaunchFlags()) -> LaunchSettings:
        """The command line wins over the spec's [launch] table, whose keys are the flags' names (LaunchFlags);
        --threads given by neither is OMP_NUM_THREADS when that is set (omp_threads)."""
        slurm_keys = {f.name for f in fields(LaunchFlags) if f.metadata["panel"] == "slurm"}
        unknown = set(spec_launch) - set(LaunchFlags.__dataclass_fields__)
        if unknown:
            raise ConfigError(f"unknown [launch] key(s) {', '.join(sorted(unknown))}; valid: "
                              f"{', '.join(sorted(LaunchFlags.__dataclass_fields__))}")
        merged = {**spec_launch, **flags.given()}
        if merged.get("threads") is None:
            merged["threads"] = omp_threads()
        sbatch = merged.pop("sbatch", None) or {}
        if not isinstance(sbatch, Mapping):
            raise ConfigError(f"sbatch must be a table of KEY = VALUE ([launch.sbatch]), got {sbatch!r}")
        extra = {str(k): str(v) for k, v in sbatch.items()}
        slurm = SlurmOptions(**{k: merged.pop(k) for k in list(merged) if k in slurm_keys}, extra=extra)
        settings = cls(**merged, slurm=slurm)
        if settings.executor not in EXECUTORS:
            raise ConfigError(f"unknown executor {settings.executor!r}; choose one of: {', '.join(EXECUTORS)}")
        for name in ("workers", "threads", "per_gpu", "max_attempts", "batch_runs"):
            check_count(f"--{name.replace('_', '-')}", getattr(settings, name))
        check_checkpoint_every(settings.checkpoint_every)
        # Slurm's own options, checked here rather than by sbatch after the cells were recorded
        for name, kind, least in (("gpus", int, 0), ("cpus", int, 1), ("time_min", int, 1),
                                  ("array_parallelism", int, 1), ("mem_gb", float, 0)):
            value = getattr(slurm, name)
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if value is not None and (not number or (kind is int and not isinstance(value, int)) or value < least
                                      or (name == "mem_gb" and value == 0)):
                what = "an integer of at least" if kind is int else "a number above"
                raise ConfigError(f"--{name.replace('_', '-')} must be {what} {least}, got {value!r}")
        slurm.check_script_text()
        return settings

    def cells_per_device(self, device: str) -> int:
        """Cells training at once on one device, as the cost estimate counts them: --batch-runs per worker, times
        --per-gpu workers on a GPU (on the CPU each worker has cores of its own)."""
        return (self.batch_runs or 1) * (self.per_gpu if device.startswith("cuda") else 1)

    def slots(self, cells: int, device: str) -> list[Slot]:
        """The workers to run for ``cells`` cells still to do (see local_slots and slurm_workers)."""
        if self.executor == "debug":
            return [Slot(0)] if cells else []
        if self.executor == "slurm":
            return slurm_workers(cells, self.workers, self.per_gpu)
        return local_slots(cells, device=device, workers=self.workers, threads=self.threads, per_gpu=self.per_gpu)


def batch_runs_for(task: str, cells: int, workers: int, device: str) -> int:
    """Cells a worker trains together when --batch-runs is not given: on a GPU, for a ``batched`` task, an even
    share of the cells per worker, at most AUTO_BATCH_RUNS; otherwise 1. On the CPU a small model's step is
    compute-bound and stacking saves only Python overhead: 25 two-moons cells took 18.4 s with 8 per worker vs
    16.6 s alone (benchmarks/bench_sweep.py), so the CPU default does not stack. ResNet cells (cifar10, utkface)
    stack only when asked (--batch-runs K): how many pay on a GPU has not been measured yet."""
    from flctl.tasks import get_task

    if not (device.startswith("cuda") and get_task(task).batched):
        return 1
    return max(1, min(AUTO_BATCH_RUNS, math.ceil(cells / workers)))
