"""Waiting for a sweep to settle (`flctl sweep --wait`, `flctl paper`, ``flctl.api.sweep``): its ledger polled until
no cell is left to train, or until nothing is left that could train one (its database moved, no worker left)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from flctl.claimed import ground_moved
from flctl.db import poll_delays
from flctl.launch.backends import get_launcher
from flctl.launch.jobs import live_controllers, live_workers, queued_jobs
from flctl.layout import Layout
from flctl.procs import pid_alive, started_at
from flctl.shell import stop_exit_code
from flctl.status import DISK_FILLED, TO_DO, Status, ledger, settled

# A wait ends when no worker is left to take the cells still to do, once that has held this long: a worker that is
# starting (a new interpreter) registers within a second or two.
NO_WORKER_GRACE_S = 5.0


class SweepStopped(Exception):
    """A wait that cannot end with the sweep done: one line, and the exit code a command ends with (128 + the stop
    signal's number, 130 for `flctl cancel`: its workers were stopped and their cells handed back; 1: the disk filled,
    no worker is left, or the database moved)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# After a signal, how long the waiting command watches the workers that share its process group (a terminal's
# Ctrl-C reaches them too) stop at their epoch's end, so that what it says of each is what happened to it.
STOPPING_S = 10.0


def stopped_line(root: Path, sid: str, store: Any = None) -> str:
    """What `flctl sweep --wait` says when a signal stopped its own worker: its cell went back, and what became of
    the sweep's other workers: stopped too (`flctl cancel` since this command started: it says so in the sweep's
    jobs folder before its first signal; or a terminal's Ctrl-C, which reaches the local workers this command started,
    in its process group: watched for up to STOPPING_S as they stop) or going on (elsewhere, or sent nothing).
    With ``store``, the cells that a worker of this host left running as it died (submitit's controller kills its job
    a second after a Ctrl-C, which may land before the job hands its cell back) are queued again, so that "went back"
    is true of every one (the next launch would take them over anyway, counting the attempt)."""
    try:
        cancelled = float(Layout(root).cancelled(sid).read_text())
    except (OSError, ValueError):
        cancelled = None
    started = started_at(os.getpid())
    others = [] if cancelled is not None and (started is None or cancelled >= started) else live_workers(root, sid)
    here, group = socket.gethostname(), os.getpgrp()

    def ours(worker: dict) -> bool:
        try:
            return worker["host"] == here and os.getpgid(int(worker["pid"])) == group
        except (OSError, ValueError, KeyError, TypeError):
            return False

    going = others
    deadline = time.monotonic() + STOPPING_S
    while any(ours(w) for w in going) and time.monotonic() < deadline:
        time.sleep(0.2)
        going = live_workers(root, sid)
    if store is not None:               # a dead worker's cell is re-queued whether or not others go on
        from flctl.db.counts import stale_ids
        from flctl.db.queue import RunQueue

        with contextlib.suppress(Exception):         # a line about how the command ended: never a second error
            if lost := stale_ids(store, sid):
                RunQueue(store).reap(run_ids=lost)
    if not going:
        return (f"sweep {sid}'s workers were stopped; their cells went back to the queue, and `flctl sweep` with the "
                "same axes resumes it")
    stopped = f"{len(others) - len(going)} other worker(s) stopped too and " if len(going) < len(others) else "the other "
    return (f"this process's worker of sweep {sid} was stopped; its cell went back to the queue, {stopped}"
            f"{len(going)} worker(s) go on (`flctl cancel {sid}` stops them)")


def check_ground(store: Any, root: Path | None, sid: str) -> None:
    """SweepStopped (exit 1) where the sweep's database or results folder ``root`` moved while it ran (its workers
    told it and stopped): what follows would write into a file that is gone, or make one in its place."""
    if (moved := ground_moved(store, root)) is not None:
        raise SweepStopped(f"{moved} while sweep {sid} ran: its workers stop and write no more", 1)


def no_worker_left(root: Path, sid: str, data: dict) -> bool:
    """Whether the sweep being waited for has cells to do that no worker will take: none running, some queued,
    handed back (`flctl cancel`, a signal, a full disk) or left by workers now gone, and no worker, job controller or
    scheduler's job left. A sweep with a scheduler's jobs is never judged so: squeue may not answer, and a job may
    pend for hours."""
    total = data["total"]
    if total[Status.RUNNING] or not (total["stale"] or total[Status.INTERRUPTED] or total[Status.QUEUED]):
        return False
    if queued_jobs(root, sid):
        return False
    return not (live_workers(root, sid) or live_controllers(root, sid))


# The bytes a worker's disk note holds (DiskNote): one line of why, in JSON.
NOTE_BYTES = 512


class DiskNote:
    """How a worker tells whoever waits on its sweep that the disk filled up under it, with no new room on that disk:
    a file of its own beside its worker file (results/jobs/<sweep>/workers/<host>-<pid>.disk), given its room when
    the worker starts (``reserved``) and overwritten in place when the disk is full (``tell``). Its database may sit
    on that disk too: the cells it held then stay marked running under its pid, which a wait on them would otherwise
    take for training until the stale bound. A Slurm worker's note is in the shared results folder alike; on a
    copy-on-write file system (ZFS, btrfs) an overwrite may need room, and the wait then ends as before."""

    def __init__(self, path: Path) -> None:
        self.path, self.told = path, False

    @classmethod
    @contextlib.contextmanager
    def reserved(cls, root: Path, sweep_id: str) -> Iterator[DiskNote | None]:
        """This worker's note while it works (None where its room could not be had); removed at the end unless it
        was told. Notes of this host's workers that are gone go first: their news is old."""
        folder, here = Layout(root).workers(sweep_id), socket.gethostname()
        for old in folder.glob(f"{here}-*.disk"):
            pid = old.stem.rpartition("-")[2]
            if pid.isdigit() and not pid_alive(int(pid)):
                old.unlink(missing_ok=True)
        note = cls(folder / f"{here}-{os.getpid()}.disk")
        try:
            fd = os.open(note.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, b" " * NOTE_BYTES)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:           # no room even now: the wait ends as without a note
            with contextlib.suppress(OSError):
                note.path.unlink()
            yield None
            return
        try:
            yield note
        finally:
            if not note.told:      # the results folder may have gone meanwhile (the worker told why it stopped)
                with contextlib.suppress(OSError):
                    note.path.unlink()

    def tell(self, why: str) -> None:
        """Say the disk is full, and ``why`` (a DiskFull's line), into the room reserved: no block is added."""
        for size in range(len(why), -1, -32):          # cut to fit: the JSON may escape some characters
            body = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "at": time.time(),
                               "disk_full": why[:size]}).encode()
            if len(body) <= NOTE_BYTES:
                break
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.pwrite(fd, body.ljust(NOTE_BYTES), 0)
                with contextlib.suppress(OSError):
                    os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            return
        self.told = True


def disk_notes(root: Path, sweep_id: str) -> list[dict[str, Any]]:
    """The told notes (DiskNote) of the sweep's workers: host, pid, at (seconds since the epoch), disk_full (why).
    Only plain files of this user's are read, as the worker files beside them."""
    found = []
    for path in sorted(Layout(root).workers(sweep_id).glob("*.disk")):
        with contextlib.suppress(OSError, ValueError):
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                    continue
                text = f.read(NOTE_BYTES + 1).strip()
            note = json.loads(text) if text else None
            if isinstance(note, dict) and isinstance(note.get("disk_full"), str) and isinstance(note.get("host"), str) \
                    and isinstance(note.get("pid"), int) and isinstance(note.get("at"), (int, float)):
                found.append(note)
    return found


def others_at_work(root: Path, sweep_id: str, noted: set[tuple[str, int]]) -> bool:
    """Whether anything but the workers ``noted`` (host, pid) may still train the sweep's cells: a live worker, a
    local job controller (its worker starting) or a scheduler's job of it that is listed."""
    if any((w["host"], w["pid"]) not in noted for w in live_workers(root, sweep_id)):
        return True
    return bool(live_controllers(root, sweep_id)) or any(get_launcher(name)().active(ids) for name, ids in queued_jobs(root, sweep_id).items())


class CellsLost(Exception):
    """A wait that may take lost cells over (Settling's ``take_over``) met ``stale`` of them: running cells whose
    worker gave no heartbeat for the stale bound (frozen, cut off) or died on this host. Not a SweepStopped: the
    launch that waits takes them over (flctl.launch.plan.take_over) and waits again."""

    def __init__(self, sid: str, stale: int) -> None:
        super().__init__(f"sweep {sid}: {stale} cell(s) of a lost worker")
        self.stale = stale


class Settling:
    """The polls of one wait: ``poll()`` returns the sweep's ledger (flctl.status.ledger), or raises SweepStopped;
    with ``take_over`` (a launch that waits, not a watcher: it may start workers) CellsLost where cells went stale,
    which a worker of the sweep would take back only once nothing else is left, and no frozen worker ever."""

    def __init__(self, store: Any, sid: str, root: Path, until_done: bool = True, take_over: bool = False) -> None:
        self.store, self.sid, self.root, self.until_done, self.take_over = store, sid, root, until_done, take_over
        self.folder = root if root.is_dir() else None    # a --db elsewhere, its results folder not here: the database
        self.idle_since: float | None = None
        # a disk note from before this process (an earlier launch's) is news only where its cells are still held
        self.since = started_at(os.getpid()) or time.time()

    def poll(self) -> dict:
        check_ground(self.store, self.folder, self.sid)     # a query now would make an empty database
        data = ledger(self.store, self.sid)
        waiting = self.until_done and not settled(data)
        if waiting and (full := self._disk_full(data)) is not None:
            raise full
        if waiting and self.take_over and data["total"]["stale"]:
            raise CellsLost(self.sid, data["total"]["stale"])
        if not (waiting and no_worker_left(self.root, self.sid, data)):
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = time.monotonic()
        elif time.monotonic() - self.idle_since >= NO_WORKER_GRACE_S:
            raise self._stopped(data)
        return data

    def _disk_full(self, data: dict) -> SweepStopped | None:
        """SweepStopped (exit 1) once a worker told that the disk filled up under it (DiskNote) and nothing else
        trains the sweep's cells: at once, though the cells it held may still be marked running (its database could
        not be written) under a pid that lives on (this process's own worker). ``data``: the sweep's ledger."""
        from flctl.db.counts import running

        if not (notes := disk_notes(self.root, self.sid)):       # a look at a folder: no query while there is none
            return None
        held = {(host, pid) for _, host, pid in running(self.store, self.sid)}
        news = [n for n in notes if (n["host"], n["pid"]) in held or n["at"] >= self.since]
        if not news or others_at_work(self.root, self.sid, {(n["host"], n["pid"]) for n in notes}):
            return None
        left = sum(data["total"][k] for k in (Status.RUNNING, "stale", *TO_DO))
        return SweepStopped(f"the disk filled up under sweep {self.sid} ({news[0]['disk_full']}): its workers "
                            f"stopped with {left} cell(s) to do; free some space, then `flctl sweep` with the same "
                            "axes resumes them from their checkpoints", 1)

    def _stopped(self, data: dict) -> SweepStopped:
        from flctl.db.counts import has_error

        back, stale, queued = (data["total"][k] for k in (Status.INTERRUPTED, "stale", Status.QUEUED))
        if has_error(self.store, self.sid, Status.INTERRUPTED, DISK_FILLED):
            return SweepStopped(f"the disk filled up under sweep {self.sid}: its workers stopped, {back} cell(s) handed "
                                "back; free some space, then `flctl sweep` with the same axes resumes them from their "
                                "checkpoints", 1)
        if back:
            return SweepStopped(f"sweep {self.sid}'s workers were stopped (`flctl cancel`, a signal); {back} cell(s) "
                                "handed back, `flctl sweep` with the same axes resumes it", stop_exit_code())
        return SweepStopped(f"no worker is left for sweep {self.sid} ({stale + queued + back} cell(s) to do: their "
                            "workers stopped or are gone, see its logs under results/jobs/); `flctl sweep` with the "
                            "same axes starts workers again", 1)


def settle(store: Any, sid: str, root: Path, interval: float = 0.5,
           on_poll: Callable[[dict], None] | None = None, take_over: bool = False) -> dict:
    """Wait until sweep ``sid`` settles; its last ledger. SweepStopped when it cannot; CellsLost (``take_over``)
    where some of its cells went stale."""

    settling, delays = Settling(store, sid, root, take_over=take_over), poll_delays(interval)
    data = settling.poll()
    while not settled(data):
        if on_poll is not None:
            on_poll(data)
        time.sleep(next(delays))
        data = settling.poll()
    return data
