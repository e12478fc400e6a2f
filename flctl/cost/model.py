"""What cells cost on one device (``CostEstimate``), and how a cost is printed (``format_cost``): the model the fit to
the database's runs (flctl.cost.fit) and the committed benchmark's figures (flctl.cost.reference) both fill."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flctl.config import RunConfig
from flctl.text import say_once

# The interval an estimate prints: at least 1.25x either side (a few runs that agree by luck say nothing of the
# next), at most WIDEST, under 3x end to end as printed (rounded): wider helps no one plan. How often the time taken
# falls inside it is measured by benchmarks/bench_estimates.py (its coverage), not assumed.
NARROWEST, WIDEST = 1.25, 1.7
FROM_ANOTHER_MACHINE = WIDEST


@dataclass(frozen=True)
class CostEstimate:
    """What cells cost on one device, fitted to the database's finished runs (``estimate_cost``) or a benchmark's
    figures (``reference_cost``). Cells take ``s_per_start + s_per_process + sum(s_per_cell + E * s_per_epoch *
    scale(cell)) / cells_per_device`` seconds: ``s_per_start`` once (the processes' interpreter, imports and database:
    workers start side by side, so a sweep waits for it once, not per cell), ``s_per_process`` once too (what the first
    cell of a worker pays and the next ones do not: a solver's import, data read once per process), then each cell of
    E epochs in its process, where ``scale``
    is the cell's training samples over those ``s_per_epoch`` was measured on (a ``--subset 256`` smoke cell is priced
    at its 256 samples, not the full data's), with ``cells_per_device`` cells training at once (together in a worker,
    times the workers: --per-gpu on a GPU, every worker on the CPU; LaunchSettings.cells_per_device). A paper plan
    prices each of its items so, each with the start-up once, though one launch may train several items.
    ``spread``: the factor either side of the estimate that the fit's own runs fell within (9 of 10 of them), from
    NARROWEST to WIDEST."""

    s_per_cell: float           # a cell's own start-up in its process (data, model, evaluation, records); 0 when the
    #                             history has one epoch count (it is then inside s_per_epoch)
    s_per_epoch: float          # at the size it was measured on
    history: int                # finished runs it is fitted to
    epochs: int                 # epochs left to train over the cells to do
    cells: int                  # cells to do
    cells_per_device: int
    source: str | None = None   # None: the database's runs; else the benchmark file the figures come from
    scale: Callable[[RunConfig], float] = lambda cfg: 1.0
    spread: float = WIDEST
    work: float | None = None   # sum of epochs x scale over the cells to do (None: ``epochs``)
    s_per_start: float = 0.0    # before the first cell: the committed benchmark's (0 where none tells it)
    s_per_process: float = 0.0  # a worker's first cell's own extra (0 where nothing tells it apart: then in s_per_cell)
    # of a cell's own start-up, what grows with its samples (its evaluations), at the size s_per_epoch was measured on
    s_per_cell_scaled: float = 0.0
    size: float | None = None   # sum of scale over the cells to do (None: ``cells``)

    def _hours(self, cells: int, work: float, size: float) -> float:
        if not cells:
            return 0.0
        own = cells * self.s_per_cell + size * self.s_per_cell_scaled + work * self.s_per_epoch
        return (self.s_per_start + self.s_per_process + own / self.cells_per_device) / 3600

    def hours(self, configs: Sequence[RunConfig]) -> float:
        """Device-hours of ``configs``."""
        return self._hours(len(configs), sum(c.epochs * self.scale(c) for c in configs),
                           sum(self.scale(c) for c in configs))

    @property
    def device_hours(self) -> float:
        """Device-hours of the cells to do."""
        return self._hours(self.cells, self.epochs if self.work is None else self.work,
                           self.cells if self.size is None else self.size)

    @property
    def s_per_cell_here(self) -> float:
        """A cell's own start-up at the size of the cells to do (their mean)."""
        size = self.cells if self.size is None else self.size
        return self.s_per_cell + self.s_per_cell_scaled * (size / self.cells if self.cells else 1.0)

    @property
    def s_per_epoch_here(self) -> float:
        """Seconds per epoch at the size of the cells to do (their mean)."""
        return self.s_per_epoch * (1.0 if self.work is None or not self.epochs else self.work / self.epochs)


def is_number(value: Any) -> bool:
    """Whether ``value`` (a figure, a row's field) is a finite number >= 0: a damaged file or row may hold text."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def warn(line: str) -> None:
    """Damaged data left out of an estimate (a committed figure, a run's row): ``flctl: warning: LINE`` on stderr,
    once per process; the estimate goes on without it."""
    say_once(f"flctl: warning: {line}")


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


def left_epochs(configs: Sequence[RunConfig], started: Mapping[str, int]) -> dict[str, int]:
    """Each cell's epochs still to train: all of them, less those a resumed cell has done."""
    return {c.run_id: max(0, c.epochs - min(started.get(c.run_id, 0), c.epochs)) for c in configs}


def at_once(cells_per_device: int, to_do: Sequence[Any]) -> int:
    """Cells training at once: never more than there are cells to do (a 25-cell sweep is not 26 cells at once)."""
    return max(1, min(cells_per_device, len(to_do)))
