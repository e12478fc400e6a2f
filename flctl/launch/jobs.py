"""What a sweep's launch leaves under ``results/jobs/<sweep>/``, and reads back.

Each worker leaves a small JSON file under ``workers/`` while it lives (host, pid, job id, and what the OS says of
its process: start time and command line), and `flctl sweep` records the jobs it started in ``submitted.json``
before it returns (a local job: its controller process, likewise). That is how `flctl cancel` and a re-run of
`flctl sweep` find the live workers of a sweep, also in the second before they register.

flctl signals the processes these files name and passes their job ids to Slurm's commands, so it trusts only
folders and files of its own user (a co-user who may write into results/ can create neither; results/jobs is
0700) and checks every field before use: a pid is signalled only while the process of that pid is still the one
recorded (start time, command line, owner) and one that flctl started for this sweep; a job id reaches scancel
only if it is one."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flctl.errors import ConfigError
from flctl.fs import write_text_atomic
from flctl.launch.backends import BUILT_IN, get_launcher, names
from flctl.layout import Layout
from flctl.procs import Process, children, end_without_collecting, process, recorded, still
from flctl.text import shown

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
    if (launcher := _launcher(executor)) is None:
        return f"executor {shown(str(executor))} is not one of {', '.join(names())}"
    if not (isinstance(pid, int) and not isinstance(pid, bool) and pid > 1):
        return f"pid {shown(str(pid))} is not a process id above 1"
    if not (job_id is None and not launcher.queued or isinstance(job_id, str) and launcher.job_id.fullmatch(job_id)):
        return f"job id {shown(str(job_id))} is not a {launcher.title or launcher.name} job's"
    if not launcher.queued and info["host"] == here and recorded(pid, info.get("start_time"),
                                                                 info.get("cmdline")) is None:
        return "it does not say which process registered (start_time, cmdline): not written by this flctl"
    return None


def _launcher(name: Any) -> Any:
    """The launcher class named ``name`` (a field read from a file), or None when there is none of that name."""
    if not isinstance(name, str) or not (name in BUILT_IN or name in names()):
        return None
    try:
        return get_launcher(name)
    except ConfigError:
        return None


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
    if not all(_own_folder(f) for f in (layout.jobs, folder, workers)):
        return []
    for path in sorted(workers.glob("*.json")):
        info = _read_own_json(path)
        if info is None:
            continue
        if (why := _bad_worker(info, here)) is not None:
            _warn(f"skipping worker file {str(path)!r}: {why}")
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
        if not get_launcher(job["executor"]).queued and job["host"] == here:
            controller = recorded(int(job["job_id"]), job["start_time"], job["cmdline"])
            if controller is not None and still(controller) and _launched_here(controller.cmdline, folder):
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


def _bad_job(entry: Any) -> str | None:
    """What is wrong with an entry of submitted.json (None: nothing)."""
    if not isinstance(entry, dict):
        return "not a JSON object"
    executor, job_id = entry.get("executor"), entry.get("job_id")
    if not (isinstance(entry.get("host"), str) and entry["host"]):
        return "no host"
    launcher = _launcher(executor)
    if launcher is None or launcher.in_process:
        return f"executor {shown(str(executor))} is not one whose jobs are recorded"
    if launcher.queued:
        ok = isinstance(job_id, str) and launcher.job_id.fullmatch(job_id) is not None
        return None if ok else f"job id {shown(str(job_id))} is not a {launcher.title or launcher.name} job id"
    pid = int(job_id) if isinstance(job_id, str) and job_id.isdigit() else None
    if pid is None or recorded(pid, entry.get("start_time"), entry.get("cmdline")) is None:
        return (f"{launcher.name} job {shown(str(job_id))} does not say which process it is (a process id above 1, "
                "start_time, cmdline)")
    return None


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
        if p.uid == os.geteuid() and _launched_here(p.cmdline, folder):
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
