"""The ``slurm`` launcher: W workers as a Slurm job array (submitit's Slurm executor); its options are sbatch's."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flctl.errors import ConfigError
from flctl.knobs import SLURM_DEFAULT_WORKERS, check_count
from flctl.launch import slurm as commands
from flctl.launch.backends import Slot, SubmititLauncher

if TYPE_CHECKING:
    from flctl.launch.settings import LaunchSettings


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
    # that bash runs, with the value shell-quoted and the key as it is; check() keeps both on their line.
    sbatch: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        sbatch = self.sbatch or {}
        if not isinstance(sbatch, Mapping):
            raise ConfigError(f"sbatch must be a table of KEY = VALUE ([launch.sbatch]), got {sbatch!r}")
        object.__setattr__(self, "sbatch", {str(k): str(v) for k, v in sbatch.items()})

    def check(self) -> None:
        """Slurm's own options, checked here rather than by sbatch after the cells were recorded; and what would
        break out of its `#SBATCH` line in the generated batch script: a newline there starts a line of its own,
        which bash runs when the job starts (any control character is refused, ESC included). Partition, account
        and qos are one word; sbatch keys are option names."""
        from flctl.text import first_control

        for name, kind, least in (("gpus", int, 0), ("cpus", int, 1), ("time_min", int, 1),
                                  ("array_parallelism", int, 1), ("mem_gb", float, 0)):
            value = getattr(self, name)
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if value is not None and (not number or (kind is int and not isinstance(value, int)) or value < least
                                      or (name == "mem_gb" and value == 0)):
                what = "an integer of at least" if kind is int else "a number above"
                raise ConfigError(f"--{name.replace('_', '-')} must be {what} {least}, got {value!r}")
        for name in ("partition", "account", "qos"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value)
                                      or first_control(value) is not None):
                raise ConfigError(f"--{name} must be one word, got {value!r}")
        for key, value in self.sbatch.items():
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
        if self.sbatch:
            p["slurm_additional_parameters"] = dict(self.sbatch)
        return p


class Slurm(SubmititLauncher):
    name = cluster = "slurm"
    title = "Slurm"
    Options = SlurmOptions
    options: SlurmOptions
    runs_here = False
    queued = True
    # SIGTERM keeps submitit's meaning under Slurm (preemption: USR2 follows, Worker.checkpoint requeues the job)
    stop_signals = ("SIGINT",)
    # as submitit records them: 123, an array task 123_4, or a range of pending tasks 123_[0-7%2]
    job_id = re.compile(r"[0-9]+(?:_(?:[0-9]+|\[[0-9,%-]+\]))?")

    def describe(self) -> str:
        given = self.options.parameters()
        return "slurm: a job array" + (f" ({', '.join(f'{k}={v}' for k, v in given.items())})" if given else "")

    def check(self, results_root: Path, *, dry_run: bool) -> None:
        commands.check_script_path(results_root)
        if not dry_run:
            commands.check_commands()
            commands.check_slurm_cluster()   # before the sweep is recorded: sbatch would fail after

    def slots(self, cells: int, device: str, settings: LaunchSettings) -> list[Slot]:
        return slurm_workers(cells, settings.workers, settings.per_gpu)

    def parameters(self, slots: Sequence[Slot], per_gpu: int) -> tuple[dict[str, Any], list[Slot]]:
        params = self.options.parameters()
        if per_gpu > 1:                    # K workers per job, as K tasks sharing the job's GPUs
            params["tasks_per_node"] = per_gpu
        # Requeue on preemption/timeout through submitit's checkpointing; Slurm sends USR2 before the end.
        params.setdefault("slurm_signal_delay_s", 120)
        return params, list(slots[::per_gpu] if per_gpu > 1 else slots)

    def active(self, job_ids: Sequence[str]) -> set[str]:
        return commands.active_job_ids(job_ids)

    def stop(self, job_ids: Sequence[str], *, hard: bool) -> None:
        if hard:
            commands.scancel(job_ids)
        else:              # pending array tasks never start; running ones checkpoint and hand their cells back
            commands.scancel(job_ids, "--state=PENDING")
            commands.scancel(job_ids, "--signal=INT")

    def job_group(self, job_id: str) -> str:
        return job_id.split("_")[0]


def slurm_workers(cells: int, workers: int | None, per_gpu: int) -> list[Slot]:
    """Slurm: W workers (default min(cells, SLURM_DEFAULT_WORKERS)); with ``per_gpu`` K they run K to a job."""
    for name, value in (("--workers", workers), ("--per-gpu", per_gpu)):
        check_count(name, value)
    w = min(workers or SLURM_DEFAULT_WORKERS, max(cells, 1))
    return [Slot(i) for i in range(math.ceil(w / per_gpu) * per_gpu)]
