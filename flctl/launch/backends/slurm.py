"""The ``slurm`` launcher: W workers as a Slurm job array (submitit's Slurm executor); its options are sbatch's,
and every Slurm command flctl runs itself (sinfo, squeue, scancel) is here; sbatch and srun are submitit's."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flctl.errors import ConfigError
from flctl.knobs import check_count
from flctl.launch.backends import Slot, SubmititLauncher, option

# Workers of a sweep without --workers: one per cell up to this many array tasks.
DEFAULT_WORKERS = 64
# What flctl and submitit run: sbatch submits, srun starts each job's task (submitit's batch script), sacct and
# squeue tell a job's state, scancel stops it, sinfo proves the cluster answers (check_slurm_cluster).
SLURM_COMMANDS = ("sbatch", "srun", "sacct", "squeue", "scancel", "sinfo")
# How long sinfo may take to answer before the cluster counts as unreachable.
SLURM_ANSWER_S = 15.0


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = option("Slurm partition (sbatch --partition).")
    gpus: int | None = option("GPUs per job.")
    cpus: int | None = option("CPUs per job.")
    mem_gb: float | None = option("Memory per job in GB (sbatch --mem).")
    time_min: int | None = option("Time limit per job.")
    account: str | None = option("Slurm account to charge (sbatch --account).")
    qos: str | None = option("Slurm quality of service (sbatch --qos).")
    array_parallelism: int | None = option("Slurm array tasks running at once (sbatch --array=...%N).")
    # Extra sbatch options (KEY=VALUE -> #SBATCH --KEY=VALUE): submitit writes each one as a line of the batch script
    # that bash runs, with the value shell-quoted and the key as it is; check() keeps both on their line.
    sbatch: dict[str, str] = option("Extra sbatch option KEY=VALUE (repeatable).", {})

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
    default_workers = f"min(cells, {DEFAULT_WORKERS})"
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
        check_script_path(results_root)
        if not dry_run:
            check_commands()
            check_slurm_cluster()   # before the sweep is recorded: sbatch would fail after

    def slots(self, cells: int, device: str, *, workers: int | None, threads: int | None, per_gpu: int
              ) -> list[Slot]:
        return slurm_workers(cells, workers, per_gpu)

    def parameters(self, slots: Sequence[Slot]) -> tuple[dict[str, Any], list[Slot]]:
        params = self.options.parameters()
        per_gpu = slots[0].shared if slots else 1
        if per_gpu > 1:                    # K workers per job, as K tasks sharing the job's GPUs
            params["tasks_per_node"] = per_gpu
        # Requeue on preemption/timeout through submitit's checkpointing; Slurm sends USR2 before the end.
        params.setdefault("slurm_signal_delay_s", 120)
        return params, list(slots[::per_gpu] if per_gpu > 1 else slots)

    def active(self, job_ids: Sequence[str]) -> set[str]:
        return active_job_ids(job_ids)

    def stop(self, job_ids: Sequence[str], *, hard: bool) -> None:
        if hard:
            scancel(job_ids)
        else:              # pending array tasks never start; running ones checkpoint and hand their cells back
            scancel(job_ids, "--state=PENDING")
            scancel(job_ids, "--signal=INT")

    def job_group(self, job_id: str) -> str:
        return job_id.split("_")[0]

    @staticmethod
    def cpus_here() -> int | None:
        """The CPUs Slurm allocated to this job. Torch would otherwise start a thread per core of the node, and
        jobs sharing a node fight over its cores: on a 2-core machine, two 1000-epoch two-moons runs side by side
        took 89 s with 2 threads each and 7 s with 1 thread each (9 s alone with either)."""
        for name in ("SLURM_CPUS_PER_TASK", "SLURM_CPUS_ON_NODE"):
            value = os.environ.get(name, "")
            if value.isdigit() and int(value) > 0:
                return int(value)
        return None


def slurm_workers(cells: int, workers: int | None, per_gpu: int) -> list[Slot]:
    """Slurm: W workers (default min(cells, DEFAULT_WORKERS)); with ``per_gpu`` K they run K to a job."""
    for name, value in (("--workers", workers), ("--per-gpu", per_gpu)):
        check_count(name, value)
    w = min(workers or DEFAULT_WORKERS, max(cells, 1))
    return [Slot(i, shared=per_gpu) for i in range(math.ceil(w / per_gpu) * per_gpu)]


def check_commands() -> None:
    """Slurm's commands are on PATH (ConfigError naming those missing)."""
    if missing := [c for c in SLURM_COMMANDS if shutil.which(c) is None]:
        raise ConfigError(f"--executor slurm needs Slurm's commands on PATH ({', '.join(missing)} "
                          f"{'is' if len(missing) == 1 else 'are'} missing); use --executor local on this machine")


def check_slurm_cluster() -> None:
    """ConfigError unless a Slurm controller answers `sinfo` within SLURM_ANSWER_S: with Slurm's commands installed
    but no cluster configured, sbatch fails only after the sweep and its job files were recorded."""
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True,
                             timeout=SLURM_ANSWER_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"--executor slurm: the Slurm controller did not answer `sinfo` within "
                          f"{SLURM_ANSWER_S:g} s; is this a cluster's login node?") from None
    except OSError as exc:
        raise ConfigError(f"--executor slurm: cannot run sinfo ({exc.strerror or exc})") from None
    if out.returncode != 0:
        said = (out.stderr.strip().splitlines() or out.stdout.strip().splitlines() or [f"exit {out.returncode}"])[-1]
        raise ConfigError(f"--executor slurm: no Slurm cluster answers here (sinfo: {said.strip()[:200]}); "
                          "use --executor local on this machine")


def active_job_ids(job_ids: Sequence[str]) -> set[str]:
    """The ids (array tasks as ARRAY_TASK) of the given jobs that squeue still lists (pending or running)."""
    bases = sorted({j.split("_")[0] for j in job_ids})
    if not bases or shutil.which("squeue") is None:
        return set()
    out = subprocess.run(["squeue", "-h", "-r", "-o", "%i", "-j", ",".join(bases)], capture_output=True,
                         text=True, timeout=60)
    return set(out.stdout.split()) if out.returncode == 0 else set()


def check_script_path(results_root: Path) -> None:
    """Slurm: the results folder is written into the batch script submitit generates (its #SBATCH --output and
    --error lines); a newline or other control character in it would start a script line of its own (ConfigError)."""
    from flctl.text import first_control

    path = str(Path(results_root).absolute())
    if first_control(path) is not None:
        raise ConfigError(f"--results-dir {path!r}: the Slurm batch script would hold this path, which has a "
                          "control character (newline, ESC, ...); use another folder")


def scancel(job_ids: Sequence[str], *options: str) -> None:
    """scancel the jobs (ids checked by flctl.launch.jobs before they get here) with ``options``, e.g. --signal=INT."""
    subprocess.run(["scancel", *options, *job_ids], capture_output=True, timeout=60)
