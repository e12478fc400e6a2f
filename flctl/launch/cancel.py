"""`flctl cancel`: stop a sweep's workers and hand their cells back."""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path
from typing import Any

from flctl.db import RunQueue, Store
from flctl.fs import write_text_atomic
from flctl.knobs import (
    DEFAULT_CANCEL_TIMEOUT_S,
)
from flctl.launch.backends import get_launcher
from flctl.launch.jobs import live_controllers, local_workers, queued_jobs
from flctl.layout import Layout
from flctl.procs import Process, send, still


def cancel(store: Store, results_root: Path, sweep_id: str, *,
           timeout: float = DEFAULT_CANCEL_TIMEOUT_S) -> dict[str, Any]:
    """Stop a sweep's workers and hand its running cells back (interrupted, attempt not counted, resumable).

    Local workers get SIGINT (they finish their epoch, checkpoint and hand their cell back) and are killed if
    still alive after ``timeout`` seconds: the registered ones, and the workers of the job controllers the sweep
    started (submitted.json), which are found before they register. Slurm jobs: pending array tasks are cancelled,
    running ones get SIGINT, then whatever is left is scancel-ed (any queued launcher: its ``stop``). Cells still marked running by a worker that is
    now gone are handed back. Only processes that are still those recorded, and that flctl started, get a signal.
    """
    stopped: dict[int, tuple[Process, str | None]] = {}
    # said before any signal: a `sweep --wait` whose own worker this stops tells the whole sweep was cancelled
    write_text_atomic(Layout(results_root).cancelled(sweep_id), repr(time.time()))
    controllers = live_controllers(results_root, sweep_id)
    # a scheduler's jobs (Slurm's), by launcher: stopped through the scheduler, by their groups (arrays)
    queued = {launcher: sorted({launcher.job_group(j) for j in ids})
              for launcher, ids in ((get_launcher(n)(), ids) for n, ids in queued_jobs(results_root, sweep_id).items())}
    for p, job_id in local_workers(results_root, sweep_id, controllers):
        if send(p, signal.SIGINT):
            stopped[p.pid] = (p, job_id)
    for launcher, ids in queued.items():
        launcher.stop(ids, hard=False)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p, job_id in local_workers(results_root, sweep_id, controllers):   # started since: stop them too
            if p.pid not in stopped and send(p, signal.SIGINT):
                stopped[p.pid] = (p, job_id)
        if not (any(still(p) for p, _ in stopped.values()) or any(still(c) for c in controllers)
                or any(launcher.active(ids) for launcher, ids in queued.items())):
            break
        time.sleep(0.2)
    for c in controllers:             # what is left is killed; its controllers frozen first, so they start no more
        send(c, signal.SIGSTOP)
    for p, job_id in local_workers(results_root, sweep_id, controllers):
        stopped.setdefault(p.pid, (p, job_id))
    killed = [p.pid for p, _ in stopped.values() if send(p, signal.SIGKILL)]
    for c in controllers:
        send(c, signal.SIGKILL)
    for launcher, ids in queued.items():
        if launcher.active(ids):
            launcher.stop(ids, hard=True)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and launcher.active(ids):
                time.sleep(0.5)
    host = socket.gethostname()
    for pid in stopped:   # a killed worker cannot unregister itself
        Layout(results_root).worker_file(sweep_id, host, pid).unlink(missing_ok=True)
    groups = {j for ids in queued.values() for j in ids}
    handed_back = RunQueue(store).hand_back(sweep_id, "cancelled; resumes from its checkpoint",
                                            pids=set(stopped), job_prefixes=groups)
    return {"sweep": sweep_id, "killed": killed, "handed_back": handed_back,
            "stopped": [{"kind": "process", "pid": p.pid, "job_id": job_id} for p, job_id in stopped.values()]
            + [{"kind": f"{launcher.name} job", "job_id": j} for launcher, ids in queued.items() for j in ids]}
