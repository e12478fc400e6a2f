"""What a sweep's launch leaves under ``results/jobs/<sweep>/``, and reads back.

Each worker leaves a small JSON file under ``workers/`` while it lives (host, pid, job id, and what the OS says of
its process: start time and command line), and `flctl sweep` records the jobs it started in ``submitted.json``
before it returns (a local job: its controller process, likewise). That is how `flctl cancel` and a re-run of
`flctl sweep` find the live workers of a sweep, also in the second before they register.

flctl signals the processes these files name and passes their job ids to Slurm's commands, so it trusts only
folders and files of its own user (a co-user who may write into results/ can create neither; results/jobs is
0700) and checks every field before use: a pid is signalled only while the process of that pid is still the one
recorded (start time, command line, owner) and one that flctl started for this sweep; a job id reaches scancel
only if it is one. Those checks are flctl.launch.trust's."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flctl.errors import ConfigError
from flctl.fs import write_text_atomic
from flctl.launch.backends import get_launcher, names
from flctl.launch.trust import (
    bad_job,
    bad_worker,
    launched_here,
    not_own_folder,
    own_folder,
    read_own_json,
    warn_once,
)
from flctl.layout import Layout
from flctl.procs import Process, children, end_without_collecting, process, recorded, still
from flctl.text import shown


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
        if (what := not_own_folder(st)) is not None:
            raise ConfigError(f"{str(path)!r} is {what}, not a folder of this user (id {os.geteuid()}); flctl "
                              "runs the jobs it finds there: move it aside or use another --results-dir")
        if st.st_mode & 0o077:
            path.chmod(0o700)
    return Path(folder)


def sweep_jobs(results_root: Path, sweep_id: str) -> Path:
    """The sweep's private jobs folder (results/jobs/<sweep>/, private_folder), where its workers' jobs live."""
    return private_folder(results_root, Layout(results_root).sweep_jobs(sweep_id))


@contextlib.contextmanager
def registered(results_root: Path, sweep_id: str, job_id: str | None, executor: str):
    if job_id is not None:     # a job's process ends with its worker (not the waiting command's, nor a test's)
        end_without_collecting()
    layout = Layout(results_root)
    private_folder(results_root, layout.workers(sweep_id))
    me = process(os.getpid())
    path = layout.worker_file(sweep_id, socket.gethostname(), os.getpid())
    write_text_atomic(path, json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "job_id": job_id,
                                        "executor": executor, **(me.identity() if me else {})}))
    try:
        yield
    finally:
        # the results folder may have gone or become a file meanwhile (the worker has told why it stopped): the
        # file is then gone with it
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            path.unlink()


def live_workers(results_root: Path, sweep_id: str) -> list[dict[str, Any]]:
    """Workers of the sweep that registered and are still alive: a Slurm worker while squeue lists its job, one of
    another host as long as its file is there, one of this host while its process is the one that registered and
    one flctl started. Files of workers that are gone (kill -9, scancel, a pid now another process's) are removed
    here; malformed ones, or ones naming a process flctl did not start, are reported and skipped."""
    found, active, here = [], {}, socket.gethostname()
    layout = Layout(results_root)
    folder, workers = layout.sweep_jobs(sweep_id), layout.workers(sweep_id)
    if not all(own_folder(f) for f in (layout.jobs, folder, workers)):
        return []
    for path in sorted(workers.glob("*.json")):
        info = read_own_json(path)
        if info is None:
            continue
        if (why := bad_worker(info, here)) is not None:
            warn_once(f"skipping worker file {str(path)!r}: {why}")
            continue
        launcher = get_launcher(info["executor"])
        if launcher.queued:                    # its scheduler says, for all the sweep's jobs of it at once
            if launcher.name not in active:
                active[launcher.name] = launcher().active(queued_jobs(results_root, sweep_id).get(launcher.name, []))
            alive = info["job_id"] in active[launcher.name]
        elif info["host"] != here:
            alive = True                       # cannot be checked from here
        else:
            registrant = recorded(info["pid"], info["start_time"], info["cmdline"])
            alive = registrant is not None and still(registrant)
            if alive and not launched_here(info["cmdline"], folder):
                warn_once(f"skipping worker file {str(path)!r}: pid {info['pid']} is not a process flctl started "
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
        if not get_launcher(job["executor"]).queued and job["host"] == here:
            controller = recorded(int(job["job_id"]), job["start_time"], job["cmdline"])
            if controller is not None and still(controller) and launched_here(controller.cmdline, folder):
                found.append(controller)
    return found


def missing_launchers(results_root: Path, sweep_id: str) -> list[str]:
    """The launchers the sweep's workers and jobs name (their files under results/jobs/) that are not installed
    here: a plugin of another environment, whose workers this process can neither see nor stop."""
    layout = Layout(results_root)
    named: set[str] = set()
    files = [*sorted(layout.workers(sweep_id).glob("*.json")), layout.submitted(sweep_id)]
    for path in files:
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(path.read_text())
            for entry in data if isinstance(data, list) else [data]:
                if isinstance(entry, dict) and isinstance(entry.get("executor"), str):
                    named.add(entry["executor"])
    return sorted(named - set(names()))


def has_workers(results_root: Path, sweep_id: str) -> bool:
    """Whether anything may still claim the sweep's cells: a live registered worker, a local job controller
    (its worker not registered yet), or a Slurm job of the sweep that squeue lists (pending ones included)."""
    if live_workers(results_root, sweep_id) or live_controllers(results_root, sweep_id):
        return True
    return any(get_launcher(name)().active(ids) for name, ids in queued_jobs(results_root, sweep_id).items())


def queued_jobs(results_root: Path, sweep_id: str) -> dict[str, list[str]]:
    """The sweep's jobs of queued launchers (a scheduler's: Slurm's), by launcher name."""
    found: dict[str, list[str]] = {}
    for j in submitted_jobs(results_root, sweep_id):
        if get_launcher(j["executor"]).queued:
            found.setdefault(j["executor"], []).append(j["job_id"])
    return found


def remember_jobs(path: Path, executor: str, jobs: Sequence[Any]) -> None:
    """Add the jobs to the sweep's submitted.json (``path``) before `flctl sweep` returns, so that `flctl cancel`
    finds them at once. A local job's id is its controller's pid; what the OS says of that process is recorded with
    it. Under a lock: a worker that lost its device adds its replacement while others may do the same."""
    import fcntl

    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _add_jobs(path, executor, jobs)


def _add_jobs(path: Path, executor: str, jobs: Sequence[Any]) -> None:
    known = _read_jobs(path)
    for job in jobs:
        entry: dict[str, Any] = {"executor": executor, "job_id": job.job_id, "host": socket.gethostname()}
        if not get_launcher(executor).queued:      # a local job's id is its controller's pid
            controller = _after_exec(int(job.job_id))
            if controller is None:           # already gone: nothing to stop later
                continue
            entry.update(controller.identity())
        known.append(entry)
    write_text_atomic(path, json.dumps(known))


def _after_exec(pid: int, within: float = 10.0) -> Process | None:
    """The local job controller ``pid`` once it runs the program it was started with (None: it is gone). A child
    just forked is still its parent's program, and in the middle of execve(2) its /proc/<pid>/cmdline reads empty;
    a command line read then never matches the process again, so `flctl cancel` would pass it over (an H100's
    suite recorded ``"cmdline": []``). The start time stays the same through exec; the command line is read once
    it is neither empty nor this process's own. A job that never execs within ``within`` s is recorded as it is."""
    own = process(os.getpid())
    deadline = time.monotonic() + within
    while (p := process(pid)) is not None and p.cmdline in ((), own and own.cmdline) and time.monotonic() < deadline:
        time.sleep(0.002)
    return p


def _read_jobs(path: Path) -> list[dict[str, Any]]:
    """The well-formed entries of a submitted.json; the rest are reported and skipped."""
    if not own_folder(path.parent.parent) or not own_folder(path.parent):
        return []
    data = read_own_json(path)
    if data is None:
        return []
    if not isinstance(data, list):
        warn_once(f"skipping {str(path)!r}: not a JSON list of jobs")
        return []
    good = []
    for i, entry in enumerate(data):
        if (why := bad_job(entry)) is None:
            good.append(entry)
        else:
            warn_once(f"skipping entry {i} of {str(path)!r}: {why}")
    return good


def submitted_jobs(results_root: Path, sweep_id: str) -> list[dict[str, Any]]:
    """The jobs launched for the sweep (executor, job id, host; a local one's controller process), checked."""
    return _read_jobs(Layout(results_root).submitted(sweep_id))


def local_workers(results_root: Path, sweep_id: str,
                   controllers: Sequence[Process]) -> list[tuple[Process, str | None]]:
    """The sweep's live worker processes on this host, with their job ids: those registered (debug and --wait
    workers included), and the job processes of its live local controllers, registered or not yet."""
    here = socket.gethostname()
    found = {}
    for w in live_workers(results_root, sweep_id):          # a scheduler's workers are stopped through it
        if w["host"] == here and not get_launcher(w["executor"]).queued:
            p = recorded(w["pid"], w["start_time"], w["cmdline"])
            if p is not None:
                found[p.pid] = (p, w["job_id"])
    folder = Layout(results_root).sweep_jobs(sweep_id)
    for parent, p in children({c.pid for c in controllers if still(c)}):
        if p.uid == os.geteuid() and launched_here(p.cmdline, folder):
            found.setdefault(p.pid, (p, str(parent)))     # a local job's id is its controller's pid
    return list(found.values())


def failed_starts(results_root: Path, sweep_id: str, since: float | None = None) -> list[tuple[str, str, Path]]:
    """The sweep's worker jobs that failed before flctl's worker ran in them, since ``since`` (wall-clock; None:
    since the last job in which a worker ran, so that a failure fixed since is not told again): submitit's result
    file says so, and its traceback never reached flctl/launch/worker.py (a node where flctl or one of its libraries
    does not import, a job whose function could not be unpickled). Each as (job id, the error's last line, its log).
    A worker that ran and stopped tells its own story (the database, its note, its line)."""
    from submitit.core.utils import pickle_load

    failed, ran = [], 0.0
    for path in sorted(Layout(results_root).sweep_jobs(sweep_id).glob("*_result.pkl")):
        try:
            at = path.stat().st_mtime
            outcome, value = pickle_load(path)
        except Exception:        # noqa: BLE001 - a result half written or of another submitit: not told
            continue
        trace = str(value)
        if outcome != "error" or f"flctl{os.sep}launch{os.sep}worker.py" in trace:
            ran = max(ran, at)
            continue
        job = path.name.removesuffix("_result.pkl")
        failed.append((at, (job, (trace.strip().splitlines() or ["?"])[-1][:200], path.with_name(f"{job}_log.err"))))
    since = ran if since is None else since
    return [told for at, told in failed if at >= since]
