"""What cells cost on one device: fitted to the database's finished runs of the same task and device, or, where
it has none, taken from the per-task figures a benchmark committed for that kind of device
(benchmarks/results/task-costs-*.json, written by benchmarks/bench_task_costs.py); and how a cost is printed."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flctl.config import RunConfig
from flctl.status import Status
from flctl.text import say_once

if TYPE_CHECKING:
    from flctl.db import RunRecord

# Where a checkout keeps its committed benchmark results (an installed wheel has none: its estimates then need runs).
REFERENCE = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


@dataclass(frozen=True)
class CostEstimate:
    """What cells cost on one device, fitted to the database's finished runs (``estimate_cost``) or a benchmark's
    figures (``reference_cost``). Cells take ``s_per_start + sum(s_per_cell + E * s_per_epoch * scale(cell)) /
    cells_per_device`` seconds: ``s_per_start`` once (the processes' interpreter, imports and database: workers start
    side by side, so a sweep waits for it once, not per cell), then each cell of E epochs in its process, where ``scale``
    is the cell's training samples over those ``s_per_epoch`` was measured on (a ``--subset 256`` smoke cell is priced
    at its 256 samples, not the full data's), with ``cells_per_device`` cells training at once (together in a worker,
    times the workers: --per-gpu on a GPU, every worker on the CPU; LaunchSettings.cells_per_device). A paper plan
    prices each of its items so, each with the start-up once, though one launch may train several items.
    ``spread``: the factor either side of the estimate that the fit's own runs fell within (9 of 10 of them)."""

    s_per_cell: float           # a cell's own start-up in its process (data, model, evaluation, records); 0 when the
    #                             history has one epoch count (it is then inside s_per_epoch)
    s_per_epoch: float          # at the size it was measured on
    history: int                # finished runs it is fitted to
    epochs: int                 # epochs left to train over the cells to do
    cells: int                  # cells to do
    cells_per_device: int
    source: str | None = None   # None: the database's runs; else the benchmark file the figures come from
    scale: Callable[[RunConfig], float] = lambda cfg: 1.0
    spread: float = 2.0
    work: float | None = None   # sum of epochs x scale over the cells to do (None: ``epochs``)
    s_per_start: float = 0.0    # before the first cell: the committed benchmark's (0 where none tells it)
    # of a cell's own start-up, what grows with its samples (its evaluations), at the size s_per_epoch was measured on
    s_per_cell_scaled: float = 0.0
    size: float | None = None   # sum of scale over the cells to do (None: ``cells``)

    def _hours(self, cells: int, work: float, size: float) -> float:
        if not cells:
            return 0.0
        own = cells * self.s_per_cell + size * self.s_per_cell_scaled + work * self.s_per_epoch
        return (self.s_per_start + own / self.cells_per_device) / 3600

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


def _number(value: Any) -> bool:
    """Whether ``value`` (a figure, a row's field) is a finite number >= 0: a damaged file or row may hold text."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def warn(line: str) -> None:
    """Damaged data left out of an estimate (a committed figure, a run's row): ``flctl: warning: LINE`` on stderr,
    once per process; the estimate goes on without it."""
    say_once(f"flctl: warning: {line}")


def stored_runs(url: str, tasks: Sequence[str], status: str | None = None) -> list[RunRecord]:
    """The runs of ``tasks`` recorded at ``url`` (those in ``status``; None: all), read as a plan reads them
    (flctl.results.peek_plan: none where the real command would make or upgrade the database first, the latter with
    a warning; StoreError where it would refuse it): their finished ones price a plan (estimate_cost) and say what a
    programme has (flctl.paper.plan)."""
    from flctl.errors import OlderSchema
    from flctl.results import peek_plan

    try:
        store = peek_plan(url)
    except OlderSchema:
        warn("the database is from an older flctl: a plan reads none of its runs until it is upgraded (`flctl "
             "migrate`; so do flctl run and flctl sweep)")
        return []
    if store is None:
        return []
    try:
        return [r for t in sorted(set(tasks)) for r in store.list_runs(task=t, status=status)]
    finally:
        store.close()


def started_epochs(url: str, configs: Sequence[RunConfig]) -> dict[str, int]:
    """The epochs done of those of ``configs`` (one task) that a launch resumes (flctl.db.counts.epochs_started),
    read as a plan reads the database (``stored_runs``): none where it is not made yet or is from an older flctl."""
    from flctl.db.counts import epochs_started
    from flctl.errors import OlderSchema
    from flctl.results import peek_plan

    try:
        store = peek_plan(url)
    except OlderSchema:
        return {}
    if store is None or not configs:
        return {}
    try:
        return epochs_started(store, configs[0].task, [c.run_id for c in configs])
    finally:
        store.close()


def _samples(run: Any) -> float | None:
    """The training samples of a finished run's epoch (its recorded samples seen over its epochs; None for a run
    recorded before flctl counted them)."""
    seen = run.metrics.get("train.samples_seen") if isinstance(run.metrics, dict) else None
    return seen / run.epochs_done if _number(seen) and seen and run.epochs_done else None


def _timed(runs: Sequence[Any]) -> list[Any]:
    """The runs whose duration and epochs are numbers; the others (a damaged row: text where seconds belong) are left
    out, with one warning naming one of them."""
    timed = [r for r in runs if _number(r.duration_s) and isinstance(r.epochs_done, int)]
    if len(timed) < len(runs):
        bad = next(r for r in runs if not (_number(r.duration_s) and isinstance(r.epochs_done, int)))
        warn(f"{len(runs) - len(timed)} finished run(s) in the database hold a duration or epoch count that is not "
             f"a number (run {bad.id}: duration_s={bad.duration_s!r}); the estimate leaves them out")
    return timed


def _data_key(cfg: RunConfig) -> str:
    """What decides how many samples a cell trains on: its subset and task options."""
    return json.dumps([cfg.subset, cfg.opts], sort_keys=True, default=str)


def sizes(runs: Sequence[Any], full: float | None = None) -> Callable[[RunConfig], float | None]:
    """The training samples of a cell, from finished runs: those of a run on the same data (subset, options); else,
    for a subset, the subset or the full data's size where that is smaller; else the full data's size (a run with
    subset 0 tells it, else ``full``: the committed benchmark's); None where nothing tells it."""
    by_key: dict[str, float] = {}
    for r in runs:
        if (n := _samples(r)) is not None:
            by_key[_data_key(r.cfg)] = n
    full = max((n for r in runs if r.cfg.subset == 0 and (n := _samples(r)) is not None), default=full)

    def size(cfg: RunConfig) -> float | None:
        if (n := by_key.get(_data_key(cfg))) is not None:
            return n
        if cfg.subset:
            return float(cfg.subset) if full is None else min(float(cfg.subset), full)
        return full
    return size


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


def estimate_cost(runs: Sequence[Any], configs: Sequence[RunConfig], cells_per_device: int,
                  started: Mapping[str, int] | None = None) -> CostEstimate | None:
    """The cost of the cells of ``configs`` not completed yet, fitted to ``runs`` (store records) that completed on the
    same task and device; None without such history. A cell that resumes is priced from the epochs it has left
    (``started``: run id -> epochs done, ``resumed_epochs``; else those of ``runs``). A run's seconds are its duration (every attempt, data loading
    included); its work is its epochs x its samples per epoch, over the median run's samples (``sizes``), so runs of a
    subset, a smoke run and a full run are priced by one fit. Over runs of several amounts of work, seconds =
    start-up + work x per-epoch is fitted robustly (the median of pairwise slopes, then the median intercept): a few
    2-epoch runs no longer make a 3,000-epoch cell look 1,000 x its start-up. Over one amount the start-up cannot be
    told apart: the median seconds per epoch, which errs long for longer cells."""
    import itertools
    import statistics

    task, device = configs[0].task, configs[0].device
    done = {r.id for r in runs if r.status == Status.COMPLETED}
    history = [r for r in _timed([r for r in runs if r.task == task and r.device == device
                                  and r.status == Status.COMPLETED]) if r.duration_s and r.epochs_done]
    if not history:
        return None
    size = sizes(history, full_size(task, device))
    reference = statistics.median(n for r in history if (n := _samples(r)) is not None) \
        if any(_samples(r) is not None for r in history) else None

    def scale(cfg: RunConfig) -> float:
        n = size(cfg) if reference else None
        return n / reference if n and reference else 1.0

    def work(run: Any) -> float:
        n = _samples(run)
        return run.epochs_done * (n / reference if n and reference else 1.0)

    points = [(work(r), r.duration_s) for r in history]
    sample = sorted(points)[::max(1, len(points) // 200)]          # pairwise slopes: quadratic in the sample
    slopes = [(d2 - d1) / (w2 - w1) for (w1, d1), (w2, d2) in itertools.combinations(sample, 2) if w2 - w1 > 1e-9]
    if slopes:
        per_epoch = max(0.0, statistics.median(slopes))
        per_cell = max(0.0, statistics.median(d - per_epoch * w for w, d in points))
    else:
        per_epoch, per_cell = statistics.median(d / w for w, d in points), 0.0
    # how far the fit's own runs fall from it: the factor 9 of 10 lie within (at least 1.25: a few runs agree by luck)
    ratios = sorted(max(p, d) / min(p, d) for w, d in points if (p := per_cell + per_epoch * w) > 0 and d > 0)
    spread = max(1.25, ratios[min(len(ratios) - 1, int(0.9 * len(ratios)))]) if ratios else 2.0
    to_do = [c for c in configs if c.run_id not in done]
    left = _left(to_do, resumed_epochs(runs) if started is None else started)
    return CostEstimate(per_cell, per_epoch, len(points), sum(left.values()), len(to_do),
                        _at_once(cells_per_device, to_do), scale=scale, spread=spread,
                        work=sum(left[c.run_id] * scale(c) for c in to_do), s_per_start=start_up(task, device))


def resumed_epochs(runs: Iterable[Any]) -> dict[str, int]:
    """The epochs done of the runs among ``runs`` that resume from a checkpoint when trained again (interrupted,
    failed, stale or queued again after a lost worker; not completed ones, nor diverged ones, which train afresh)."""
    return {r.id: r.epochs_done for r in runs if r.status not in (Status.COMPLETED, Status.DIVERGED)
            and isinstance(r.epochs_done, int) and r.epochs_done > 0}


def _left(configs: Sequence[RunConfig], started: Mapping[str, int]) -> dict[str, int]:
    """Each cell's epochs still to train: all of them, less those a resumed cell has done."""
    return {c.run_id: max(0, c.epochs - min(started.get(c.run_id, 0), c.epochs)) for c in configs}


def _at_once(cells_per_device: int, to_do: Sequence[Any]) -> int:
    """Cells training at once: never more than there are cells to do (a 25-cell sweep is not 26 cells at once)."""
    return max(1, min(cells_per_device, len(to_do)))


# The figures an estimate reads from a committed benchmark: those it needs, and those older files do not tell.
_NEEDED, _OPTIONAL = ("s_per_cell", "s_per_epoch"), ("s_per_start", "s_per_cell_full_data", "n_train")


def _damage(figures: Any) -> str | None:
    """What is wrong with a task's committed figures (None: they can be read)."""
    if not isinstance(figures, dict):
        return f"its figures are {type(figures).__name__}, not a table"
    for key in (*_NEEDED, *(k for k in _OPTIONAL if figures.get(k) is not None)):
        if not _number(figures.get(key)):
            return f"{key} = {figures.get(key)!r} is not a number >= 0"
    return None


def _figures(task: str, kind: str, folder: Path | None) -> tuple[dict[str, Any], Path] | None:
    """The newest committed figures of ``task`` for that kind of device (``task-costs-<date>-<cpu|cuda>.json``) that
    can be read; a damaged file is passed over for an older one, with one warning."""
    for path in sorted((folder or REFERENCE).glob(f"task-costs-*-{kind}.json"), reverse=True):
        try:
            tasks = json.loads(path.read_text())["tasks"]
            figures = tasks.get(task)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            warn(f"benchmarks/results/{path.name} cannot be read ({type(exc).__name__}: {exc}); estimates do not use it")
            continue
        if figures and (why := _damage(figures)) is not None:
            warn(f"benchmarks/results/{path.name}: {task}: {why}; estimates do not use it")
            continue
        if figures:
            return figures, path
    return None


def reference_cost(configs: Sequence[RunConfig], cells_per_device: int, folder: Path | None = None,
                   started: Mapping[str, int] | None = None) -> CostEstimate | None:
    """The cost of ``configs`` (one task, one device) from the newest committed figures for that kind of device,
    measured on another machine (so expected within 2x here); None where none has the task. ``started``: as
    ``estimate_cost``'s."""
    found = _figures(configs[0].task, configs[0].device.split(":")[0], folder)
    if found is None:
        return None
    figures, path = found
    full = figures.get("n_train")      # the samples an epoch trained on there (older files: not told)

    def scale(cfg: RunConfig) -> float:
        return min(cfg.subset, full) / full if full and cfg.subset else 1.0
    left = _left(configs, started or {})
    return CostEstimate(float(figures["s_per_cell"]), float(figures["s_per_epoch"]), 0,
                        sum(left.values()), len(configs), _at_once(cells_per_device, configs),
                        source=f"benchmarks/results/{path.name}", scale=scale, spread=2.0,
                        work=sum(left[c.run_id] * scale(c) for c in configs), s_per_start=float(figures.get("s_per_start", 0)),
                        s_per_cell_scaled=float(figures.get("s_per_cell_full_data", 0)),
                        size=sum(scale(c) for c in configs))


def start_up(task: str, device: str, folder: Path | None = None) -> float:
    """The seconds before a sweep's first cell trains, as the committed benchmark measured them for the task (its
    processes' interpreter, imports and database: what no run's own duration holds); 0 where none tells it."""
    found = _figures(task, device.split(":")[0], folder)
    return float(found[0].get("s_per_start", 0.0)) if found is not None else 0.0


def full_size(task: str, device: str, folder: Path | None = None) -> float | None:
    """The samples of an epoch on the task's full data, as the committed benchmark measured it (None: not told)."""
    found = _figures(task, device.split(":")[0], folder)
    return float(found[0]["n_train"]) if found is not None and found[0].get("n_train") else None
