"""What flctl trusts of the files it reads back under ``results/jobs/`` (flctl.launch.jobs), since it signals the
processes they name and passes their job ids to a scheduler: folders and plain files of this user's (never a link),
JSON of at most 1 MiB, a worker file's and a submitted job's fields (``bad_worker``, ``bad_job``: a launcher
installed here, a job id of its kind, the process that registered), a command line flctl starts for the sweep
(``launched_here``). What is skipped is said once per process (``warn_once``)."""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flctl.errors import ConfigError
from flctl.launch.backends import BUILT_IN, get_launcher, names
from flctl.procs import recorded
from flctl.text import say_once, shown

# A file flctl reads back under results/jobs holds a few fields: a larger one is not flctl's.
MAX_FILE_BYTES = 1 << 20


def warn_once(message: str) -> None:
    """One line on stderr, once per process (cancel reads the same files again while it waits)."""
    say_once("warning: " + " ".join(message.split()))


def not_own_folder(st: os.stat_result) -> str | None:
    """What keeps the entry of ``st`` (its lstat) from being a folder of this user's, in a few words; None: nothing."""
    if not stat.S_ISDIR(st.st_mode):
        return "a link or a file"
    return f"owned by user id {st.st_uid}" if st.st_uid != os.geteuid() else None


def own_folder(path: Path) -> bool:
    """Whether ``path`` is a folder of this user (not a link); a folder of someone else's is reported."""
    try:
        st = path.lstat()
    except OSError:
        return False
    if (what := not_own_folder(st)) is None:
        return True
    warn_once(f"skipping {str(path)!r}: it is {what}, not a folder of this user's")
    return False


def read_own_json(path: Path) -> Any:
    """The JSON in ``path`` when it is a plain file of this user's (not a link) of at most 1 MiB; None (reported)
    otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        warn_once(f"skipping {str(path)!r}: {exc.strerror or exc} (a link is not followed)")
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        why = ("not a plain file" if not stat.S_ISREG(st.st_mode) else
               f"owned by user id {st.st_uid}, not this user" if st.st_uid != os.geteuid() else
               "larger than 1 MiB" if st.st_size > MAX_FILE_BYTES else None)
        if why is None:
            try:
                return json.loads(f.read(MAX_FILE_BYTES + 1))
            except ValueError as exc:
                why = f"not JSON ({exc})"
    warn_once(f"skipping {str(path)!r}: {why}")
    return None


def launched_here(cmdline: Sequence[str], folder: Path) -> bool:
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


def bad_worker(info: Any, here: str) -> str | None:
    """What is wrong with a worker file's contents (None: nothing)."""
    if not isinstance(info, dict):
        return "not a JSON object"
    executor, job_id, pid = info.get("executor"), info.get("job_id"), info.get("pid")
    if not (isinstance(info.get("host"), str) and info["host"]):
        return "no host"
    if (launcher := launcher_named(executor)) is None:
        return f"executor {shown(str(executor))} is not one of {', '.join(names())}"
    if not (isinstance(pid, int) and not isinstance(pid, bool) and pid > 1):
        return f"pid {shown(str(pid))} is not a process id above 1"
    if not (job_id is None and not launcher.queued or isinstance(job_id, str) and launcher.job_id.fullmatch(job_id)):
        return f"job id {shown(str(job_id))} is not a {launcher.title or launcher.name} job's"
    if not launcher.queued and info["host"] == here and recorded(pid, info.get("start_time"),
                                                                 info.get("cmdline")) is None:
        return "it does not say which process registered (start_time, cmdline): not written by this flctl"
    return None


def launcher_named(name: Any) -> Any:
    """The launcher class named ``name`` (a field read from a file), or None when there is none of that name."""
    if not isinstance(name, str) or not (name in BUILT_IN or name in names()):
        return None
    try:
        return get_launcher(name)
    except ConfigError:
        return None


def bad_job(entry: Any) -> str | None:
    """What is wrong with an entry of submitted.json (None: nothing)."""
    if not isinstance(entry, dict):
        return "not a JSON object"
    executor, job_id = entry.get("executor"), entry.get("job_id")
    if not (isinstance(entry.get("host"), str) and entry["host"]):
        return "no host"
    launcher = launcher_named(executor)
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
