"""Processes of this host as the OS describes them (Linux /proc), so that a pid read back from a file is signalled
only while it is still the process that was recorded there: pids are reused, and a file may lie."""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def end_without_collecting() -> None:
    """At this process's exit, move every object into the collector's permanent generation before the interpreter
    finalizes: its last collections then skip them. A run's process has torch, torch._dynamo and SQLAlchemy loaded, and
    walking their objects took 1.2-1.7 s of a 6-7 s `flctl run` (benchmarks/bench_overhead.py, "interpreter exit").
    Nothing is skipped that an exit promises: atexit handlers run (this one last: it is registered first), files are
    closed and flushed as modules are cleared; only objects in reference cycles keep their memory until the process
    is gone, as the operating system takes it back anyway. Call it only in a process that is about to end (the
    console script, a worker job), never in one that goes on allocating (a test session)."""
    atexit.register(gc.freeze)


@dataclass(frozen=True)
class Process:
    """One process: its pid and what tells it from a later process with the same pid."""

    pid: int
    start_time: int                  # clock ticks after boot (/proc/<pid>/stat field 22): with the pid, unique
    cmdline: tuple[str, ...]         # /proc/<pid>/cmdline, its arguments
    uid: int                         # its owner (the owner of /proc/<pid>)

    def identity(self) -> dict[str, Any]:
        """What a file records of it, beside its pid: the owner is checked against the reader's own user."""
        return {"start_time": self.start_time, "cmdline": list(self.cmdline)}


def process(pid: int) -> Process | None:
    """The live process ``pid`` of this host, or None: gone, exited (a zombie), not a pid above 1 (-1, 0 and 1 are
    not one process to kill(2)), or no /proc to ask."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        uid = os.stat(f"/proc/{pid}").st_uid
    except (OSError, ValueError):
        return None
    fields = stat.rsplit(")", 1)[1].split()      # the command name before ")" may hold spaces and parentheses
    if fields[0] in ("Z", "X"):
        return None
    args = tuple(a.decode("utf-8", "surrogateescape") for a in cmdline.split(b"\0")[:-1])
    return Process(pid, int(fields[19]), args, uid)


def recorded(pid: Any, start_time: Any, cmdline: Any) -> Process | None:
    """The process a file describes, owned by this user, or None when the fields are not a pid above 1, a start
    time and a command line."""
    ok = (isinstance(pid, int) and not isinstance(pid, bool) and pid > 1 and isinstance(start_time, int)
          and not isinstance(start_time, bool) and isinstance(cmdline, list)
          and all(isinstance(a, str) for a in cmdline))
    return Process(pid, start_time, tuple(cmdline), os.geteuid()) if ok else None


def still(p: Process) -> bool:
    """Whether ``p`` is still running as recorded (same pid, start time, command line and owner)."""
    return process(p.pid) == p


def children(pids: set[int]) -> list[tuple[int, Process]]:
    """The live processes whose parent is one of ``pids``, each with its parent's pid."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent in pids and (child := process(int(entry.name))) is not None:
            found.append((parent, child))
    return found


def send(p: Process, sig: int) -> bool:
    """Send ``sig`` to ``p`` if it is still that process and this user's own (checked right before); whether it
    was sent."""
    if p.pid <= 1 or p.uid != os.geteuid() or not still(p):
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(p.pid, sig)
        return True
    return False


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by its parent) still answers kill(0); it is dead for us.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def started_at(pid: int) -> float | None:
    """When process ``pid`` of this host started, in seconds since the epoch (None: no such process, no /proc)."""
    p = process(pid)
    try:
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
    except (OSError, StopIteration, ValueError):
        return None
    return None if p is None else boot + p.start_time / os.sysconf("SC_CLK_TCK")
