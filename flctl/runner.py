"""Glue between the training loop and the run database: record a run's start, heartbeats and outcome.

Used by ``flctl run`` (and by sweep workers). Training itself lives in flctl.train and knows no database.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from flctl import records
from flctl.config import RunConfig
from flctl.store import Store


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
    return out.stdout.strip() or None if out.returncode == 0 else None


def execute(cfg: RunConfig, store: Store, layout: Layout, on_epoch: Callable | None = None):
    """Train ``cfg`` and record it in ``store``; returns the RunResult. Exceptions mark the run failed."""
    from flctl.train import train  # torch is imported here, not at CLI start-up

    store.begin_run(cfg.identity() | {"device": cfg.device, "data_dir": cfg.data_dir}, cfg.run_id,
                    cfg.config_hash, device=cfg.device, git_sha=git_revision())
    started = time.perf_counter()

    def beat(stats) -> None:
        store.heartbeat(cfg.run_id, stats.epoch)
        if on_epoch is not None:
            on_epoch(stats)

    try:
        result = train(cfg, layout.records, layout.run_dir(cfg.run_id), on_epoch=beat)
    except BaseException as exc:
        reason = "interrupted" if isinstance(exc, KeyboardInterrupt) else traceback.format_exc(limit=8)
        store.fail_run(cfg.run_id, reason, time.perf_counter() - started)
        raise
    store.finish_run(cfg.run_id, status=result.status, epochs_done=result.epochs_done, metrics=result.metrics,
                     diverged_at=result.diverged_at, lambda_capped=result.lambda_capped,
                     artifacts=result.artifacts, duration_s=time.perf_counter() - started)
    return result
