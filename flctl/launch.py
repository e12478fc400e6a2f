"""Launching a sweep: W pull workers through submitit, debug (in process), local (subprocesses) or Slurm.

A sweep's cells are rows in the database, not arguments of jobs. Each worker loops "claim the sweep's next cell
(the store's compare-and-swap) -> train it -> repeat" until none is left, then exits: cells of different lengths
balance themselves, and interpreter and torch start-up are paid once per worker, not per cell. A cell whose
worker died (kill -9, lost node) is claimed again by any worker once it is stale.

Stopping: a worker that gets SIGINT (and SIGTERM, except under Slurm) finishes the epoch it is in, checkpoints,
hands its cell back (interrupted, attempt not counted) and exits; `flctl cancel` sends that signal. Under Slurm,
SIGTERM keeps submitit's meaning (preemption: USR2 follows and ``Worker.checkpoint`` hands the cell back and
requeues the job), so Slurm's own preemption and timeouts keep resuming cells.

Each worker leaves a small JSON file under ``results/jobs/<sweep>/workers/`` while it lives (host, pid, job id, and
what the OS says of its process: start time and command line), and `flctl sweep` records the jobs it started in
``results/jobs/<sweep>/submitted.json`` before it returns (a local job: its controller process, likewise). That is
how `flctl cancel` and a re-run of `flctl sweep` find the live workers of a sweep, also in the second before they
register. results/jobs is private to its owner (0700), and what is read back from it is checked before use.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import submitit

import flctl.plugins
from flctl.config import RunConfig
from flctl.db import STALE_AFTER_S, RunQueue, Store
from flctl.errors import ConfigError
from flctl.fs import write_text_atomic
from flctl.knobs import (
    AUTO_BATCH_RUNS,
    DEFAULT_CANCEL_TIMEOUT_S,
    DEFAULT_CHECKPOINT_EVERY_S,
    DEFAULT_MAX_ATTEMPTS,
    SLURM_DEFAULT_WORKERS,
    check_checkpoint_every,
    check_count,
)
from flctl.layout import Layout
from flctl.procs import Process, children, process, recorded, send, still
from flctl.runner import git_revision, stop_on_signals, train_claimed
from flctl.status import TRAINABLE
from flctl.text import shown

EXECUTORS = ("debug", "local", "slurm")
# A --tune sweep adds its next trial's cell a moment after the last one finished: its workers wait this long for
# one before they exit, so that one worker serves trial after trial instead of a new process (torch start-up,
# seconds) per trial.
TUNE_LINGER_S = 10.0
_LINGER_POLL_S = 0.2


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
        import re

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


class TaskUnavailable(Exception):
    """A worker claimed a cell whose task it cannot load (a plugin missing on its node); the cell is failed."""

    def __init__(self, run_id: str, why: str) -> None:
        super().__init__(why)
        self.run_id = run_id


class Worker(submitit.helpers.Checkpointable):
    """The job body: pull the sweep's cells one at a time until none is left. Picklable; holds only plain data."""

    def __init__(self, db_url: str, results_root: str, sweep_id: str, *, executor: str = "local",
                 max_attempts: int = DEFAULT_MAX_ATTEMPTS, stale_after: float = STALE_AFTER_S,
                 checkpoint_every: float = DEFAULT_CHECKPOINT_EVERY_S, batch_runs: int = 1,
                 sync_study: bool = True, linger_s: float = 0.0, plugins: Sequence[str] | None = None) -> None:
        self.db_url, self.results_root, self.sweep_id, self.executor = db_url, results_root, sweep_id, executor
        # The plugin task files and modules the launching process used (FLCTL_TASKS, a spec's task_module): a
        # worker on another node or under another environment loads the same ones.
        self.plugins = tuple(flctl.plugins.paths() if plugins is None else plugins)
        self.sync_study, self.linger_s = sync_study, linger_s
        self.max_attempts, self.stale_after, self.checkpoint_every = max_attempts, stale_after, checkpoint_every
        self.batch_runs = batch_runs
        self.current: dict[str, str] = {}        # the cells training now: run id -> claim token
        self.stopped = False

    def __call__(self, slot: Slot) -> dict[str, str]:
        if slot.cuda is not None:   # before CUDA is initialised; submitit's local executor hides every GPU
            os.environ["CUDA_VISIBLE_DEVICES"] = slot.cuda
        flctl.plugins.add(self.plugins)
        threads = slot.threads or _slurm_cpus()
        if threads:
            import torch

            torch.set_num_threads(threads)
        store = Store.open(self.db_url)
        layout = Layout(Path(self.results_root))
        job_id, git_sha = _job_id(), git_revision()
        outcome: dict[str, str] = {}
        signals = ("SIGINT",) if self.executor == "slurm" else ("SIGINT", "SIGTERM")
        with _registered(Path(self.results_root), self.sweep_id, job_id, self.executor), \
                stop_on_signals(signals) as stop:
            try:
                while not stop.is_set():
                    try:
                        claimed = self._claim(store, job_id, git_sha) or self._linger(store, job_id, git_sha, stop)
                    except TaskUnavailable as exc:   # the next cells would fail alike: leave them to other workers
                        outcome[exc.run_id] = "failed: task unavailable"
                        print(f"flctl worker: {exc}", file=sys.stderr)
                        break
                    if not claimed:
                        break
                    cfgs = [c for c, _ in claimed]
                    self.current = {c.run_id: token for c, token in claimed}
                    try:
                        results = train_claimed(cfgs, dict(self.current), store, layout,
                                                checkpoint_every=self.checkpoint_every, stop=stop.is_set)
                    except Exception as exc:  # recorded as failed by train_claimed; go on with the next cells
                        outcome.update(dict.fromkeys(self.current, f"failed: {type(exc).__name__}"))
                        continue
                    finally:
                        self.current = {}
                    outcome.update((r.run_id, r.status) for r in results)
                if self.sync_study and outcome:
                    _sync_study_once(store, self.db_url, self.sweep_id)
            finally:
                store.close()
                self.stopped = stop.is_set()
        return outcome

    def _claim(self, store: Store, job_id: str | None, git_sha: str | None) -> list[tuple[RunConfig, str]]:
        """The next cell, and up to ``batch_runs - 1`` more that can train together with it, with their claims'
        fencing tokens."""
        from flctl.tasks import get_task

        def claim(accept=None) -> tuple[RunConfig, str] | None:
            got = RunQueue(store).claim_next(self.sweep_id, max_attempts=self.max_attempts, stale_after=self.stale_after,
                                   job_id=job_id, git_sha=git_sha, accept=accept)
            run = None if got is None else store.get_run(got[0])
            return None if run is None or got is None else (RunConfig.from_json(run.config), got[1])

        first = claim()
        if first is None:
            return []
        try:
            task = get_task(first[0].task)
        except ConfigError as exc:      # a plugin this node cannot import: one line in the run, no traceback
            why = f"task {first[0].task!r} cannot be loaded by the worker on {socket.gethostname()}: {exc}"
            RunQueue(store).fail_run(first[0].run_id, first[1], why, 0.0)
            raise TaskUnavailable(first[0].run_id, why) from None
        claimed = [first]
        if self.batch_runs > 1 and task.build_model is not None:   # every task with a model
            key = first[0].together_key()
            while len(claimed) < self.batch_runs:
                more = claim(lambda config: RunConfig.from_json(config).together_key() == key)
                if more is None:
                    break
                claimed.append(more)
        return claimed

    def _linger(self, store: Store, job_id: str | None, git_sha: str | None, stop) -> list[tuple[RunConfig, str]]:
        """Wait up to ``linger_s`` for a cell to be added (a --tune sweep's next trial); [] when none came."""
        deadline = time.monotonic() + self.linger_s
        while time.monotonic() < deadline and not stop.is_set():
            time.sleep(_LINGER_POLL_S)
            if claimed := self._claim(store, job_id, git_sha):
                return claimed
        return []

    def checkpoint(self, slot: Slot) -> submitit.helpers.DelayedSubmission:
        # Called from submitit's signal handler on preemption/timeout, while runs train in this process: hand
        # them back (their epoch checkpoints are on disk) so the requeued worker, or any other, resumes them.
        if self.current:
            store = Store.open(self.db_url)
            try:
                for run_id, token in self.current.items():
                    RunQueue(store).requeue(run_id, token, "preempted or timed out; job requeued")
            finally:
                store.close()
        return submitit.helpers.DelayedSubmission(
            Worker(self.db_url, self.results_root, self.sweep_id, executor=self.executor,
                   max_attempts=self.max_attempts, stale_after=self.stale_after,
                   checkpoint_every=self.checkpoint_every, batch_runs=self.batch_runs,
                   sync_study=self.sync_study, linger_s=self.linger_s, plugins=self.plugins), slot)


def _slurm_cpus() -> int | None:
    """The CPUs Slurm allocated to this job (None outside Slurm). Torch would otherwise start a thread per core of
    the node, and jobs sharing a node fight over its cores: on a 2-core machine, two 1000-epoch two-moons runs side
    by side took 89 s with 2 threads each and 7 s with 1 thread each (9 s alone with either)."""
    for name in ("SLURM_CPUS_PER_TASK", "SLURM_CPUS_ON_NODE"):
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None


def _sync_study_once(store: Store, url: str, sweep_id: str) -> None:
    """The sweep's finished cells into its Optuna study (flctl.study.sync_sweep: one sync at a time per database).
    A failed sync is not the worker's failure."""
    from flctl.study import sync_sweep

    try:
        sync_sweep(store, url, sweep_id)
    except Exception as exc:
        print(f"flctl worker: could not sync the Optuna study of sweep {sweep_id}: {exc}", file=sys.stderr)


# ---- what a sweep's launch leaves under results/jobs/<sweep>/, and reads back ----
#
# flctl signals the processes these files name and passes their job ids to Slurm's commands, so it trusts only
# folders and files of its own user (a co-user who may write into results/ can create neither) and checks every
# field before use: a pid is signalled only while the process of that pid is still the one recorded (start time,
# command line, owner) and one that flctl started for this sweep; a job id reaches scancel only if it is one.

# Slurm job ids as submitit records them: 123, an array task 123_4, or a range of pending tasks 123_[0-7%2].
SLURM_JOB_ID = re.compile(r"[0-9]+(?:_(?:[0-9]+|\[[0-9,%-]+\]))?")
# submitit's other job ids: a local job's controller pid, a debug job's DEBUG_<number>
LOCAL_JOB_ID = re.compile(r"[0-9]+|DEBUG_[0-9]+")
_MAX_FILE_BYTES = 1 << 20
_warned: set[str] = set()


def _warn(message: str) -> None:
    """One line on stderr, once per process (cancel reads the same files again while it waits)."""
    line = " ".join(message.split())
    if line not in _warned:
        _warned.add(line)
        print(f"warning: {line}", file=sys.stderr)


def private_folder(results_root: Path, folder: Path) -> Path:
    """``folder`` (results/jobs or a folder under it) and every folder from results/jobs down to it, made private
    to this user: created with mode 0700, or set to it when ours. Their files are read back and submitit's pickled
    jobs there are run, so a folder another user owns, or a link, is refused (ConfigError)."""
    jobs = Layout(results_root).jobs
    path = jobs
    for part in ("", *Path(folder).relative_to(jobs).parts):
        path = path / part if part else path
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
        st = path.lstat()
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            what = "a link or a file" if not stat.S_ISDIR(st.st_mode) else f"owned by user id {st.st_uid}"
            raise ConfigError(f"{str(path)!r} is {what}, not a folder of this user (id {os.geteuid()}); flctl "
                              "runs the jobs it finds there: move it aside or use another --results-dir")
        if st.st_mode & 0o077:
            path.chmod(0o700)
    return Path(folder)


def _own_folder(path: Path) -> bool:
    """Whether ``path`` is a folder of this user (not a link); a folder of someone else's is reported."""
    try:
        st = path.lstat()
    except OSError:
        return False
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
        return True
    what = "a link or a file" if not stat.S_ISDIR(st.st_mode) else f"owned by user id {st.st_uid}"
    _warn(f"skipping {str(path)!r}: it is {what}, not a folder of this user's")
    return False


def _read_own_json(path: Path) -> Any:
    """The JSON in ``path`` when it is a plain file of this user's (not a link) of at most 1 MiB; None (reported)
    otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        _warn(f"skipping {str(path)!r}: {exc.strerror or exc} (a link is not followed)")
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        why = ("not a plain file" if not stat.S_ISREG(st.st_mode) else
               f"owned by user id {st.st_uid}, not this user" if st.st_uid != os.geteuid() else
               "larger than 1 MiB" if st.st_size > _MAX_FILE_BYTES else None)
        if why is None:
            try:
                return json.loads(f.read(_MAX_FILE_BYTES + 1))
            except ValueError as exc:
                why = f"not JSON ({exc})"
    _warn(f"skipping {str(path)!r}: {why}")
    return None


def _launched_here(cmdline: Sequence[str], folder: Path) -> bool:
    """Whether ``cmdline`` is one flctl starts for the sweep whose jobs folder is ``folder``: submitit's job
    controller or job entry point (the local executor), which name that folder, or an `flctl sweep` command, whose
    own process is a worker (debug executor, --wait)."""
    args = list(cmdline)
    module = args[args.index("-m") + 1] if "-m" in args[:-1] else None
    if module in ("submitit.local._local", "submitit.core._submit"):
        with contextlib.suppress(OSError):
            return os.path.samefile(args[-1], folder)
        return False
    flctl = module == "flctl" or any(Path(a).name == "flctl" for a in args[:2])
    return flctl and "sweep" in args


def _bad_worker(info: Any, here: str) -> str | None:
    """What is wrong with a worker file's contents (None: nothing)."""
    if not isinstance(info, dict):
        return "not a JSON object"
    executor, job_id, pid = info.get("executor"), info.get("job_id"), info.get("pid")
    if not (isinstance(info.get("host"), str) and info["host"]):
        return "no host"
    if executor not in EXECUTORS:
        return f"executor {shown(str(executor))} is not one of {', '.join(EXECUTORS)}"
    if not (isinstance(pid, int) and not isinstance(pid, bool) and pid > 1):
        return f"pid {shown(str(pid))} is not a process id above 1"
    if executor == "slurm" and not (isinstance(job_id, str) and SLURM_JOB_ID.fullmatch(job_id)):
        return f"job id {shown(str(job_id))} is not a Slurm job id"
    if executor != "slurm" and not (job_id is None or (isinstance(job_id, str) and LOCAL_JOB_ID.fullmatch(job_id))):
        return f"job id {shown(str(job_id))} is not a local or debug job's"
    if executor != "slurm" and info["host"] == here and recorded(pid, info.get("start_time"),
                                                                  info.get("cmdline")) is None:
        return "it does not say which process registered (start_time, cmdline): not written by this flctl"
    return None


@contextlib.contextmanager
def _registered(results_root: Path, sweep_id: str, job_id: str | None, executor: str):
    layout = Layout(results_root)
    private_folder(results_root, layout.workers(sweep_id))
    me = process(os.getpid())
    path = layout.worker_file(sweep_id, socket.gethostname(), os.getpid())
    write_text_atomic(path, json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "job_id": job_id,
                                        "executor": executor, **(me.identity() if me else {})}))
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


def live_workers(results_root: Path, sweep_id: str) -> list[dict[str, Any]]:
    """Workers of the sweep that registered and are still alive: a Slurm worker while squeue lists its job, one of
    another host as long as its file is there, one of this host while its process is the one that registered and
    one flctl started. Files of workers that are gone (kill -9, scancel, a pid now another process's) are removed
    here; malformed ones, or ones naming a process flctl did not start, are reported and skipped."""
    found, active_arrays, here = [], None, socket.gethostname()
    layout = Layout(results_root)
    folder, workers = layout.sweep_jobs(sweep_id), layout.workers(sweep_id)
    if not all(_own_folder(f) for f in (layout.jobs, folder, workers)):
        return []
    for path in sorted(workers.glob("*.json")):
        info = _read_own_json(path)
        if info is None:
            continue
        if (why := _bad_worker(info, here)) is not None:
            _warn(f"skipping worker file {str(path)!r}: {why}")
            continue
        if info["executor"] == "slurm":
            if active_arrays is None:
                active_arrays = _slurm_active_ids([j["job_id"] for j in submitted_jobs(results_root, sweep_id)
                                                   if j["executor"] == "slurm"])
            alive = info["job_id"] in active_arrays
        elif info["host"] != here:
            alive = True                       # cannot be checked from here
        else:
            registrant = recorded(info["pid"], info["start_time"], info["cmdline"])
            alive = registrant is not None and still(registrant)
            if alive and not _launched_here(info["cmdline"], folder):
                _warn(f"skipping worker file {str(path)!r}: pid {info['pid']} is not a process flctl started "
                      f"for this sweep ({shown(' '.join(info['cmdline']), 60)})")
                continue
        if alive:
            found.append(info)
        else:
            path.unlink(missing_ok=True)
    return found


def live_controllers(results_root: Path, sweep_id: str) -> list[Process]:
    """The local job controllers flctl started for the sweep on this host that still run: from submitted.json,
    written before `flctl sweep` returns, so they are known before their workers register."""
    folder, here = Layout(results_root).sweep_jobs(sweep_id), socket.gethostname()
    found = []
    for job in submitted_jobs(results_root, sweep_id):
        if job["executor"] == "local" and job["host"] == here:
            controller = recorded(int(job["job_id"]), job["start_time"], job["cmdline"])
            if controller is not None and still(controller) and _launched_here(controller.cmdline, folder):
                found.append(controller)
    return found


def has_workers(results_root: Path, sweep_id: str) -> bool:
    """Whether anything may still claim the sweep's cells: a live registered worker, a local job controller
    (its worker not registered yet), or a Slurm job of the sweep that squeue lists (pending ones included)."""
    if live_workers(results_root, sweep_id) or live_controllers(results_root, sweep_id):
        return True
    slurm = [j["job_id"] for j in submitted_jobs(results_root, sweep_id) if j["executor"] == "slurm"]
    return bool(slurm) and _slurm_active(slurm)


def _job_id() -> str | None:
    try:
        return submitit.JobEnvironment().job_id
    except RuntimeError:  # not inside a submitit job (debug executor runs in process)
        return None


# What flctl and submitit run: sbatch submits, srun starts each job's task (submitit's batch script), sacct and
# squeue tell a job's state, scancel stops it, sinfo proves the cluster answers (check_slurm_cluster).
SLURM_COMMANDS = ("sbatch", "srun", "sacct", "squeue", "scancel", "sinfo")
# How long sinfo may take to answer before the cluster counts as unreachable.
SLURM_ANSWER_S = 15.0


def check_executor(executor: str) -> None:
    if executor not in EXECUTORS:
        raise ConfigError(f"unknown executor {executor!r}; choose one of: {', '.join(EXECUTORS)}")
    if executor == "slurm" and (missing := [c for c in SLURM_COMMANDS if shutil.which(c) is None]):
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


@contextlib.contextmanager
def _stdio_to(path: Path):
    """Point fds 1 and 2 at a file while local job controllers are spawned.

    submitit's local controllers inherit the submitting process's stdout/stderr; left attached, a pipe
    reader (`flctl sweep | tee`, subprocess capture) would wait until every job has finished.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600), "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def submit(sweep_id: str, slots: Sequence[Slot], *, db_url: str, results_root: Path, executor: str,
           slurm: SlurmOptions | None = None, per_gpu: int = 1, max_attempts: int = DEFAULT_MAX_ATTEMPTS,
           stale_after: float = STALE_AFTER_S, checkpoint_every: float = DEFAULT_CHECKPOINT_EVERY_S,
           batch_runs: int = 1, linger_s: float = 0.0) -> list[submitit.Job]:
    """Start one pull worker per slot (a job array; under Slurm with ``per_gpu`` K, K workers per job as K
    tasks sharing the job's GPUs). Returns without waiting, except debug, which runs its worker in process."""
    check_executor(executor)
    if not slots:
        return []
    layout = Layout(results_root)
    folder = private_folder(results_root, layout.sweep_jobs(sweep_id))
    ex = submitit.AutoExecutor(folder=str(folder), cluster=executor)
    params: dict[str, Any] = {"name": f"flctl-{sweep_id}", "timeout_min": 7 * 24 * 60}
    if executor == "slurm":
        params.update((slurm or SlurmOptions()).parameters())
        if per_gpu > 1:
            params["tasks_per_node"] = per_gpu
        # Requeue on preemption/timeout through submitit's checkpointing; Slurm sends USR2 before the end.
        params.setdefault("slurm_signal_delay_s", 120)
        slots = slots[::per_gpu] if per_gpu > 1 else slots
    ex.update_parameters(**params)
    worker = Worker(db_url, str(results_root), sweep_id, executor=executor, max_attempts=max_attempts,
                    stale_after=stale_after, checkpoint_every=checkpoint_every, batch_runs=batch_runs,
                    linger_s=linger_s)
    if executor == "local":
        with _stdio_to(layout.controllers_log(sweep_id)):
            jobs = ex.map_array(worker, list(slots))
    else:
        jobs = ex.map_array(worker, list(slots))
    if executor != "debug":
        _remember_jobs(layout.submitted(sweep_id), executor, jobs)
    if executor == "debug":  # submitit's debug jobs run in this process when their result is asked for
        for job in jobs:
            job.result()
    return jobs


def _remember_jobs(path: Path, executor: str, jobs: Sequence[submitit.Job]) -> None:
    """Add the jobs to the sweep's submitted.json (``path``) before `flctl sweep` returns, so that `flctl cancel`
    finds them at once. A local job's id is its controller's pid; what the OS says of that process is recorded with
    it."""
    known = _read_jobs(path)
    for job in jobs:
        entry: dict[str, Any] = {"executor": executor, "job_id": job.job_id, "host": socket.gethostname()}
        if executor == "local":
            controller = process(int(job.job_id))
            if controller is None:           # already gone: nothing to stop later
                continue
            entry.update(controller.identity())
        known.append(entry)
    write_text_atomic(path, json.dumps(known))


def _bad_job(entry: Any) -> str | None:
    """What is wrong with an entry of submitted.json (None: nothing)."""
    if not isinstance(entry, dict):
        return "not a JSON object"
    executor, job_id = entry.get("executor"), entry.get("job_id")
    if not (isinstance(entry.get("host"), str) and entry["host"]):
        return "no host"
    if executor == "slurm":
        ok = isinstance(job_id, str) and SLURM_JOB_ID.fullmatch(job_id) is not None
        return None if ok else f"job id {shown(str(job_id))} is not a Slurm job id"
    if executor == "local":
        pid = int(job_id) if isinstance(job_id, str) and job_id.isdigit() else None
        if pid is None or recorded(pid, entry.get("start_time"), entry.get("cmdline")) is None:
            return (f"local job {shown(str(job_id))} does not say which process it is (a process id above 1, "
                    "start_time, cmdline)")
        return None
    return f"executor {shown(str(executor))} is not local or slurm"


def _read_jobs(path: Path) -> list[dict[str, Any]]:
    """The well-formed entries of a submitted.json; the rest are reported and skipped."""
    if not _own_folder(path.parent.parent) or not _own_folder(path.parent):
        return []
    data = _read_own_json(path)
    if data is None:
        return []
    if not isinstance(data, list):
        _warn(f"skipping {str(path)!r}: not a JSON list of jobs")
        return []
    good = []
    for i, entry in enumerate(data):
        if (why := _bad_job(entry)) is None:
            good.append(entry)
        else:
            _warn(f"skipping entry {i} of {str(path)!r}: {why}")
    return good


def submitted_jobs(results_root: Path, sweep_id: str) -> list[dict[str, Any]]:
    """The jobs launched for the sweep (executor, job id, host; a local one's controller process), checked."""
    return _read_jobs(Layout(results_root).submitted(sweep_id))


def slurm_workers(cells: int, workers: int | None, per_gpu: int) -> list[Slot]:
    """Slurm: W workers (default min(cells, SLURM_DEFAULT_WORKERS)); with ``per_gpu`` K they run K to a job."""
    for name, value in (("--workers", workers), ("--per-gpu", per_gpu)):
        check_count(name, value)
    w = min(workers or SLURM_DEFAULT_WORKERS, max(cells, 1))
    return [Slot(i) for i in range(math.ceil(w / per_gpu) * per_gpu)]


# ---- cancel ----

def cancel(store: Store, results_root: Path, sweep_id: str, *,
           timeout: float = DEFAULT_CANCEL_TIMEOUT_S) -> dict[str, Any]:
    """Stop a sweep's workers and hand its running cells back (interrupted, attempt not counted, resumable).

    Local workers get SIGINT (they finish their epoch, checkpoint and hand their cell back) and are killed if
    still alive after ``timeout`` seconds: the registered ones, and the workers of the job controllers the sweep
    started (submitted.json), which are found before they register. Slurm jobs: pending array tasks are cancelled,
    running ones get SIGINT, then whatever is left is scancel-ed. Cells still marked running by a worker that is
    now gone are handed back. Only processes that are still those recorded, and that flctl started, get a signal.
    """
    stopped: dict[int, tuple[Process, str | None]] = {}
    controllers = live_controllers(results_root, sweep_id)
    slurm_ids = sorted({j["job_id"].split("_")[0] for j in submitted_jobs(results_root, sweep_id)
                        if j["executor"] == "slurm"})
    for p, job_id in _local_workers(results_root, sweep_id, controllers):
        if send(p, signal.SIGINT):
            stopped[p.pid] = (p, job_id)
    if slurm_ids:
        subprocess.run(["scancel", "--state=PENDING", *slurm_ids], capture_output=True, timeout=60)
        subprocess.run(["scancel", "--signal=INT", *slurm_ids], capture_output=True, timeout=60)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p, job_id in _local_workers(results_root, sweep_id, controllers):   # started since: stop them too
            if p.pid not in stopped and send(p, signal.SIGINT):
                stopped[p.pid] = (p, job_id)
        if not (any(still(p) for p, _ in stopped.values()) or any(still(c) for c in controllers)
                or (slurm_ids and _slurm_active(slurm_ids))):
            break
        time.sleep(0.2)
    for c in controllers:             # what is left is killed; its controllers frozen first, so they start no more
        send(c, signal.SIGSTOP)
    for p, job_id in _local_workers(results_root, sweep_id, controllers):
        stopped.setdefault(p.pid, (p, job_id))
    killed = [p.pid for p, _ in stopped.values() if send(p, signal.SIGKILL)]
    for c in controllers:
        send(c, signal.SIGKILL)
    if slurm_ids and _slurm_active(slurm_ids):
        subprocess.run(["scancel", *slurm_ids], capture_output=True, timeout=60)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _slurm_active(slurm_ids):
            time.sleep(0.5)
    host = socket.gethostname()
    for pid in stopped:   # a killed worker cannot unregister itself
        Layout(results_root).worker_file(sweep_id, host, pid).unlink(missing_ok=True)
    handed_back = RunQueue(store).hand_back(sweep_id, "cancelled; resumes from its checkpoint",
                                  pids=set(stopped), job_prefixes=set(slurm_ids))
    return {"sweep": sweep_id, "killed": killed, "handed_back": handed_back,
            "stopped": [{"kind": "process", "pid": p.pid, "job_id": job_id} for p, job_id in stopped.values()]
            + [{"kind": "slurm job", "job_id": j} for j in slurm_ids]}


def _local_workers(results_root: Path, sweep_id: str,
                   controllers: Sequence[Process]) -> list[tuple[Process, str | None]]:
    """The sweep's live worker processes on this host, with their job ids: those registered (debug and --wait
    workers included), and the job processes of its live local controllers, registered or not yet."""
    here = socket.gethostname()
    found = {}
    for w in live_workers(results_root, sweep_id):          # Slurm's workers are stopped through Slurm
        if w["host"] == here and w["executor"] != "slurm":
            p = recorded(w["pid"], w["start_time"], w["cmdline"])
            if p is not None:
                found[p.pid] = (p, w["job_id"])
    folder = Layout(results_root).sweep_jobs(sweep_id)
    for parent, p in children({c.pid for c in controllers if still(c)}):
        if p.uid == os.geteuid() and _launched_here(p.cmdline, folder):
            found.setdefault(p.pid, (p, str(parent)))     # a local job's id is its controller's pid
    return list(found.values())


def _slurm_active_ids(job_ids: Sequence[str]) -> set[str]:
    """The ids (array tasks as ARRAY_TASK) of the given jobs that squeue still lists (pending or running)."""
    bases = sorted({j.split("_")[0] for j in job_ids})
    if not bases or shutil.which("squeue") is None:
        return set()
    out = subprocess.run(["squeue", "-h", "-r", "-o", "%i", "-j", ",".join(bases)], capture_output=True,
                         text=True, timeout=60)
    return set(out.stdout.split()) if out.returncode == 0 else set()


def _slurm_active(job_ids: Sequence[str]) -> bool:
    return bool(_slurm_active_ids(job_ids))


# ---- a sweep's launch: settings from the spec's [launch] table and flags, then the workers ----

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
    def resolve(cls, spec_launch: Mapping[str, Any], flags: Mapping[str, Any]) -> LaunchSettings:
        """The command line wins over the spec's [launch] table; keys are the flags' names."""
        slurm_keys = {f for f in SlurmOptions.__dataclass_fields__ if f != "extra"} | {"sbatch"}
        own = {f for f in cls.__dataclass_fields__ if f != "slurm"}
        unknown = set(spec_launch) - own - slurm_keys
        if unknown:
            raise ConfigError(f"unknown [launch] key(s) {', '.join(sorted(unknown))}; valid: "
                              f"{', '.join(sorted(own | slurm_keys))}")
        merged = {**spec_launch, **{k: v for k, v in flags.items() if v is not None}}
        sbatch = merged.pop("sbatch", None) or {}
        if not isinstance(sbatch, Mapping):
            raise ConfigError(f"sbatch must be a table of KEY = VALUE ([launch.sbatch]), got {sbatch!r}")
        extra = {str(k): str(v) for k, v in sbatch.items()}
        slurm = SlurmOptions(**{k: merged.pop(k) for k in list(merged) if k in slurm_keys}, extra=extra)
        settings = cls(**merged, slurm=slurm)
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


@dataclass
class Launched:
    """What `flctl sweep` did: the sweep's cells, what was already there, and the workers it started."""

    cells: int
    added: int
    completed: int
    requeued: list[str]
    gave_up: list[str]
    todo: int
    live: int
    jobs: list[submitit.Job]
    here: _Here | None = None


def launch_sweep(store: Store, url: str, root: Path, sid: str, spec, configs: Sequence[RunConfig],
                 settings: LaunchSettings, join: bool = False) -> Launched:
    """Record the sweep, re-queue cells of lost workers, and start workers for the cells still to do: never more
    live workers than the settings ask for, counting those of an earlier launch still running.

    With ``join`` (``flctl sweep --wait`` on the local executor) one of the W workers is this process, which would
    otherwise only wait: it has its imports done and needs no start-up; ``Launched.here`` runs it.

    ConfigError, before anything is written, when results/jobs cannot be made private (another user's folder)."""
    private_folder(root, Layout(root).sweep_jobs(sid))
    added = store.create_sweep(sid, spec.name, spec.task, spec.to_json(), list(configs))
    ids = [c.run_id for c in configs]
    requeued, gave_up = RunQueue(store).reap(run_ids=ids, max_attempts=settings.max_attempts, stale_after=STALE_AFTER_S)
    cells = {r["id"]: r for r in store.sweep_runs(sid)}
    todo = [i for i in ids if cells[i]["status"] in TRAINABLE
            and cells[i]["attempts"] < settings.max_attempts]
    registered = live_workers(root, sid)
    # a job started by an earlier launch whose worker has not registered yet (a second or so) counts as one
    started = {w["job_id"] for w in registered}
    live = len(registered) + sum(str(c.pid) not in started for c in live_controllers(root, sid))
    slots = settings.slots(len(todo), configs[0].device if configs else "cpu")
    slots = slots[:max(0, len(slots) - live)] if todo else []
    batch_runs = settings.batch_runs or batch_runs_for(spec.task, len(todo), max(len(slots), 1), configs[0].device)
    here = None
    if join and settings.executor == "local" and slots and slots[0].cuda is None:
        here = _Here(Worker(url, str(root), sid, executor="local", max_attempts=settings.max_attempts,
                            checkpoint_every=settings.checkpoint_every, batch_runs=batch_runs,
                            sync_study=False), slots[0])      # the waiting command syncs once all is done
        slots = slots[1:]
    jobs = submit(sid, slots, db_url=url, results_root=root, executor=settings.executor, slurm=settings.slurm,
                  per_gpu=settings.per_gpu, max_attempts=settings.max_attempts,
                  checkpoint_every=settings.checkpoint_every, batch_runs=batch_runs,
                  linger_s=TUNE_LINGER_S if spec.tune and settings.executor != "debug" else 0.0)
    if jobs or here:
        store.count_submission(sid)
    return Launched(len(configs), added, sum(cells[i]["status"] == "completed" for i in ids), requeued,
                    gave_up, len(todo), live, jobs, here)


@dataclass
class _Here:
    """A worker to run in this process (see launch_sweep's ``join``)."""

    worker: Worker
    slot: Slot

    def __call__(self) -> bool:
        """Work until no cell is left; False when a signal stopped it first."""
        self.worker(self.slot)
        return not self.worker.stopped


# ---- `flctl sweep`: the plan, every check passed before anything is written ----

@dataclass(frozen=True)
class SweepPlan:
    """A sweep ready to launch (plan_sweep): nothing of it is written yet."""

    spec: Any                     # flctl.sweep.SweepSpec, its device resolved; a grid's names its study's objective
    configs: list[RunConfig]
    sweep_id: str                 # the grid's id; a --tune sweep's is flctl.sweep.tune_id of its spec
    settings: LaunchSettings
    objective: str
    tune: int | None              # trials of a TPE search; None: the grid


def plan_sweep(spec: Any, flags: Mapping[str, Any], *, results_root: Path, check_device: Callable[..., str],
               dry_run: bool = False, allow_large: bool = False, objective: str | None = None, direction: str = "min",
               tune: int | None = None, parallel: int = 1) -> SweepPlan:
    """`flctl sweep`'s plan of ``spec`` (a flctl.sweep.SweepSpec) with the launch ``flags`` over its [launch] table,
    checked in the order a user meets the errors: launch settings, device (``check_device(device, here=...)`` gives
    the device the runs train on, or stops the command), grid (with its data unless ``dry_run``; over MAX_CELLS
    only with ``allow_large``), objective and search space, Slurm script path, and unless ``dry_run`` that the
    executor and the workers' devices are there. The objective and trial count fall back to the spec's.
    ConfigError (TypeError from a malformed [launch] table) before anything is written."""
    from flctl.study import DEFAULT_OBJECTIVE, check_objective, search_space
    from flctl.sweep import plan, sweep_id

    settings = LaunchSettings.resolve(spec.launch, flags)
    # every worker would fail on a device that does not exist (here: Slurm's nodes are not this machine)
    spec = replace(spec, device=check_device(spec.device, here=settings.executor != "slurm"))
    configs = plan(spec, check_data=not dry_run, allow_large=allow_large)
    sid = sweep_id(spec, configs)
    objective = objective or spec.objective or DEFAULT_OBJECTIVE
    tune = tune if tune is not None else spec.tune
    check_objective(objective, direction)
    if tune is None:   # the workers mirror finished cells into the sweep's Optuna study with this objective
        spec = replace(spec, objective=objective)
    if tune is not None and (tune < 1 or parallel < 1):
        raise ConfigError(f"--tune and --parallel must be at least 1, got {tune} and {parallel}")
    if tune is not None:
        search_space(spec)     # a search needs a range or a list to search
    if settings.executor == "slurm":
        check_script_path(results_root)
    if not dry_run:
        check_executor(settings.executor)
        if settings.executor == "slurm":       # before the sweep is recorded: sbatch would fail after
            check_slurm_cluster()
        settings.slots(len(configs), configs[0].device)     # e.g. --device cuda without a GPU: fail now
    return SweepPlan(spec, configs, sid, settings, objective, tune)


def check_script_path(results_root: Path) -> None:
    """Slurm: the results folder is written into the batch script submitit generates (its #SBATCH --output and
    --error lines); a newline or other control character in it would start a script line of its own (ConfigError)."""
    from flctl.text import first_control

    path = str(Path(results_root).absolute())
    if first_control(path) is not None:
        raise ConfigError(f"--results-dir {path!r}: the Slurm batch script would hold this path, which has a "
                          "control character (newline, ESC, ...); use another folder")
