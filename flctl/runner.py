"""Glue between the training loop and the run database: claim a run, heartbeat it, record its outcome.

Used by ``flctl run`` and by sweep workers. Training itself lives in flctl.train and knows no database.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from flctl import records
from flctl.config import RunConfig
from flctl.store import HEARTBEAT_S, STALE_AFTER_S, Store


@dataclass(frozen=True)
class Layout:
    """Where a results root keeps things: records/ (Parquet dataset) and runs/<id>/ (checkpoint, model)."""

    root: Path

    @property
    def records(self) -> Path:
        return self.root / "records"

    def run_dir(self, run_id: str) -> Path:
        return self.root / "runs" / run_id

    def clear(self, run_id: str) -> None:
        """Delete a run's records and files (for --rerun): it then starts from scratch."""
        shutil.rmtree(records.run_dir(self.records, run_id), ignore_errors=True)
        shutil.rmtree(self.run_dir(run_id), ignore_errors=True)


def git_revision() -> str | None:
    """The revision of the flctl checkout, if it is one (recorded with each run)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


class _Heartbeat(threading.Thread):
    """Beats every ``period`` seconds while an epoch runs, so long epochs do not look like a lost worker."""

    def __init__(self, store: Store, run_id: str, period: float) -> None:
        super().__init__(daemon=True, name=f"heartbeat-{run_id}")
        self.store, self.run_id, self.period = store, run_id, period
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.period):
            try:
                self.store.heartbeat(self.run_id)
            except Exception:  # a missed beat is harmless; the next one retries
                pass


def execute(cfg: RunConfig, store: Store, layout: Layout, on_epoch: Callable | None = None, *,
            allow: Iterable[str] = ("queued", "failed"), max_attempts: int | None = None,
            stale_after: float = STALE_AFTER_S, job_id: str | None = None):
    """Claim ``cfg``'s run, train it and record the outcome. Returns the RunResult, or None when the run is
    not claimable (completed, or held by a live worker). Exceptions mark the run failed and propagate."""
    from flctl.train import train  # torch is imported here, not at CLI start-up

    store.add_runs([cfg])
    if not store.claim_run(cfg.run_id, allow=allow, max_attempts=max_attempts, stale_after=stale_after,
                           job_id=job_id, git_sha=git_revision(), device=cfg.device):
        return None
    started = time.perf_counter()
    beat = _Heartbeat(store, cfg.run_id, HEARTBEAT_S)
    beat.start()

    def epoch_done(stats) -> None:
        store.heartbeat(cfg.run_id, stats.epoch)
        if on_epoch is not None:
            on_epoch(stats)

    try:
        result = train(cfg, layout.records, layout.run_dir(cfg.run_id), on_epoch=epoch_done)
    except BaseException as exc:
        reason = "interrupted" if isinstance(exc, (KeyboardInterrupt, SystemExit)) else traceback.format_exc(limit=8)
        store.fail_run(cfg.run_id, reason, time.perf_counter() - started)
        raise
    finally:
        beat.stopped.set()
    store.finish_run(cfg.run_id, status=result.status, epochs_done=result.epochs_done, metrics=result.metrics,
                     diverged_at=result.diverged_at, lambda_capped=result.lambda_capped,
                     artifacts=result.artifacts, duration_s=time.perf_counter() - started)
    return result
