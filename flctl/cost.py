"""What cells cost on one device: fitted to the database's finished runs of the same task and device, or, where
it has none, taken from the per-task figures a benchmark committed for that kind of device
(benchmarks/results/task-costs-*.json, written by benchmarks/bench_task_costs.py); and how a cost is printed."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flctl.config import RunConfig
from flctl.status import Status

# Where a checkout keeps its committed benchmark results (an installed wheel has none: its estimates then need runs).
REFERENCE = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


@dataclass(frozen=True)
class CostEstimate:
    """What cells cost on one device, fitted to the database's finished runs (``estimate_cost``): a cell of E epochs
    takes ``s_per_cell + E * s_per_epoch`` seconds, and ``cells_per_device`` cells share a device."""

    s_per_cell: float           # its start-up (data, model, warm-up); 0 when the history has one epoch count
    s_per_epoch: float
    history: int                # finished runs it is fitted to
    epochs: int                 # epochs left to train over the cells to do
    cells: int                  # cells to do
    cells_per_device: int
    source: str | None = None   # None: the database's runs; else the benchmark file the figures come from

    def _hours(self, cells: int, epochs: int) -> float:
        return (cells * self.s_per_cell + epochs * self.s_per_epoch) / self.cells_per_device / 3600

    def hours(self, configs: Sequence[RunConfig]) -> float:
        """Device-hours of ``configs``."""
        return self._hours(len(configs), sum(c.epochs for c in configs))

    @property
    def device_hours(self) -> float:
        """Device-hours of the cells to do."""
        return self._hours(self.cells, self.epochs)


def format_cost(hours: float | None, device: str) -> str:
    """Device time as a person reads it, the one format of every cost flctl prints: ``0.2 s``, ``45 s``,
    ``3.7 min``, ``1.4 cpu-hours``, ``1,250 cuda-hours``; "unknown" for None (no history to estimate from)."""
    return "unknown" if hours is None else format_seconds(hours * 3600, device)


def format_seconds(s: float, device: str) -> str:
    """``s`` seconds of ``device`` time as ``format_cost`` writes them: below a second with one significant digit
    (``0.2 s``, ``0.004 s``: never 4e-03), then seconds, minutes, and ``{device}-hours`` from an hour on."""
    if not s > 0:           # 0, a negative fit, NaN
        return "0 s"
    if s < 0.9995:
        decimals = min(max(1, -math.floor(math.log10(s))), 6)
        return f"{s:.{decimals}f} s" if s >= 5e-7 else "< 0.000001 s"
    if s < 9.95:
        return f"{s:.1f} s"
    if s < 59.5:
        return f"{s:.0f} s"
    if s < 9.95 * 60:
        return f"{s / 60:.1f} min"
    if s < 59.5 * 60:
        return f"{s / 60:.0f} min"
    h = s / 3600
    return f"{h:.1f} {device}-hours" if h < 9.95 else f"{h:,.0f} {device}-hours"


def estimate_cost(runs: Sequence[Any], configs: Sequence[RunConfig], cells_per_device: int) -> CostEstimate | None:
    """The cost of the cells of ``configs`` not completed yet, fitted to ``runs`` (store records) that completed on the
    same task and device; None without such history. A run's seconds are its duration (every attempt, data loading
    included). Over runs of several epoch counts, seconds = start-up + epochs x per-epoch is fitted robustly (the
    median of pairwise slopes, then the median intercept): a few 2-epoch runs no longer make a 3,000-epoch cell look
    1,000 x its start-up. Over one epoch count the start-up cannot be told apart: the median seconds per epoch, which
    errs long for longer cells."""
    import itertools
    import statistics

    task, device = configs[0].task, configs[0].device
    done = {r.id for r in runs if r.status == Status.COMPLETED}
    points = [(r.epochs_done, r.duration_s) for r in runs
              if r.task == task and r.device == device and r.status == Status.COMPLETED and r.duration_s
              and r.epochs_done]
    if not points:
        return None
    sample = sorted(points)[::max(1, len(points) // 200)]          # pairwise slopes: quadratic in the sample
    slopes = [(d2 - d1) / (e2 - e1) for (e1, d1), (e2, d2) in itertools.combinations(sample, 2) if e2 != e1]
    if slopes:
        per_epoch = max(0.0, statistics.median(slopes))
        per_cell = max(0.0, statistics.median(d - per_epoch * e for e, d in points))
    else:
        per_epoch, per_cell = statistics.median(d / e for e, d in points), 0.0
    to_do = [c for c in configs if c.run_id not in done]
    return CostEstimate(per_cell, per_epoch, len(points), sum(c.epochs for c in to_do), len(to_do),
                        max(1, cells_per_device))


def reference_cost(configs: Sequence[RunConfig], cells_per_device: int, folder: Path = REFERENCE
                   ) -> CostEstimate | None:
    """The cost of ``configs`` (one task, one device) from the newest committed figures for that kind of device
    (``task-costs-<date>-<cpu|cuda>.json``), measured on another machine; None where none has the task."""
    task, kind = configs[0].task, configs[0].device.split(":")[0]
    for path in sorted(folder.glob(f"task-costs-*-{kind}.json"), reverse=True):
        try:
            figures = json.loads(path.read_text())["tasks"].get(task)
        except (OSError, ValueError, KeyError, AttributeError):
            continue
        if figures:
            return CostEstimate(float(figures["s_per_cell"]), float(figures["s_per_epoch"]), 0,
                                sum(c.epochs for c in configs), len(configs), max(1, cells_per_device),
                                source=f"benchmarks/results/{path.name}")
    return None
