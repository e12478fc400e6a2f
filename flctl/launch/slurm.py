"""Every Slurm command flctl runs itself (sinfo, squeue, scancel) and the checks of what goes into a batch script;
sbatch and srun are submitit's."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from flctl.errors import ConfigError

# What flctl and submitit run: sbatch submits, srun starts each job's task (submitit's batch script), sacct and
# squeue tell a job's state, scancel stops it, sinfo proves the cluster answers (check_slurm_cluster).
SLURM_COMMANDS = ("sbatch", "srun", "sacct", "squeue", "scancel", "sinfo")


# How long sinfo may take to answer before the cluster counts as unreachable.
SLURM_ANSWER_S = 15.0


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


def any_active(job_ids: Sequence[str]) -> bool:
    return bool(active_job_ids(job_ids))


def allocated_cpus() -> int | None:
    """The CPUs Slurm allocated to this job (None outside Slurm). Torch would otherwise start a thread per core of
    the node, and jobs sharing a node fight over its cores: on a 2-core machine, two 1000-epoch two-moons runs side
    by side took 89 s with 2 threads each and 7 s with 1 thread each (9 s alone with either)."""
    for name in ("SLURM_CPUS_PER_TASK", "SLURM_CPUS_ON_NODE"):
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None


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
