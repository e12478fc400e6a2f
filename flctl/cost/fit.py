"""What cells cost, fitted to the database's finished runs of the same task and device (``estimate_cost``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from flctl.config import RunConfig
from flctl.cost.model import NARROWEST, WIDEST, CostEstimate, at_once, is_number, left_epochs, warn
from flctl.cost.reference import first_cell_extra, full_size, grown_share, start_up
from flctl.status import Status


def _samples(run: Any) -> float | None:
    """The training samples of a finished run's epoch (its recorded samples seen over its epochs; None for a run
    recorded before flctl counted them)."""
    seen = run.metrics.get("train.samples_seen") if isinstance(run.metrics, dict) else None
    return seen / run.epochs_done if is_number(seen) and seen and run.epochs_done else None


def _timed(runs: Sequence[Any]) -> list[Any]:
    """The runs whose duration and epochs are numbers; the others (a damaged row: text where seconds belong, a
    negative epoch count) are left out, with one warning naming one of them and what is wrong with it."""
    def wrong(r: Any) -> str | None:
        if not is_number(r.duration_s):
            return f"duration_s={r.duration_s!r}"
        if not (isinstance(r.epochs_done, int) and not isinstance(r.epochs_done, bool) and r.epochs_done >= 0):
            return f"epochs_done={r.epochs_done!r}"
        return None
    timed = [r for r in runs if wrong(r) is None]
    if len(timed) < len(runs):
        bad = next(r for r in runs if wrong(r) is not None)
        warn(f"{len(runs) - len(timed)} finished run(s) in the database hold a duration or epoch count that is not "
             f"a number >= 0 (run {bad.id}: {wrong(bad)}); the estimate leaves them out")
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


def estimate_cost(runs: Sequence[Any], configs: Sequence[RunConfig], cells_per_device: int,
                  started: Mapping[str, int] | None = None) -> CostEstimate | None:
    """The cost of the cells of ``configs`` not completed yet, fitted to ``runs`` (store records) that completed on the
    same task and device; None without such history. A cell that resumes is priced from the epochs it has left
    (``started``: run id -> epochs done, ``resumed_epochs``; else those of ``runs``). A run's seconds are its duration
    (every attempt, data loading included); its work is its epochs x its samples per epoch, over the median run's
    samples (``sizes``), so runs of a subset, a smoke run and a full run are priced by one fit (``_fit``). A worker's
    first cells pay what its later ones do not (``first_of_process``): where the history has both, the fit is to the
    later ones, and the first ones' median extra is paid once (``s_per_process``)."""
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

    first = first_of_process(history)
    points = [(work(r), r.duration_s) for r in history]
    later = [(work(r), r.duration_s) for r in history if r.id not in first]
    # a worker's later cells tell a cell's own cost; its first cell's extra over them is paid once per process. Where
    # the history has too few later cells (runs of `flctl run`, each its own process), nothing tells them apart.
    split = len(later) >= 2 and len(later) < len(points)
    per_cell, per_epoch = _fit(later if split else points)
    if split:
        per_process = max(0.0, statistics.median(d - per_cell - per_epoch * w for r in history if r.id in first
                                                 for w, d in [(work(r), r.duration_s)]))
    else:       # each run its process's first: the committed benchmark tells how much of a cell's start-up that is
        per_process = min(per_cell, first_cell_extra(task, device))
        per_cell -= per_process
    # of a cell's start-up, what grows with its samples (its evaluations) is priced at its size: the share the
    # committed benchmark measured, at the history's size (a smoke cell of 256 samples after runs of 5,000)
    per_cell_scaled = per_cell * grown_share(task, device, reference)
    per_cell -= per_cell_scaled

    def predicted(r: Any, w: float) -> float:
        n = _samples(r)
        return (per_cell + per_cell_scaled * (n / reference if n and reference else 1.0) + per_epoch * w
                + (per_process if r.id in first or not split else 0.0))
    # how far the fit's own runs fall from it: the factor 9 of 10 lie within, kept between NARROWEST and WIDEST
    ratios = sorted(max(p, d) / min(p, d) for r, (w, d) in zip(history, points) if (p := predicted(r, w)) > 0 and d > 0)
    spread = min(WIDEST, max(NARROWEST, ratios[min(len(ratios) - 1, int(0.9 * len(ratios)))])) if ratios else WIDEST
    to_do = [c for c in configs if c.run_id not in done]
    left = left_epochs(to_do, resumed_epochs(runs) if started is None else started)
    return CostEstimate(per_cell, per_epoch, len(points), sum(left.values()), len(to_do),
                        at_once(cells_per_device, to_do), scale=scale, spread=spread,
                        work=sum(left[c.run_id] * scale(c) for c in to_do), s_per_start=start_up(task, device),
                        s_per_process=per_process if to_do else 0.0, s_per_cell_scaled=per_cell_scaled,
                        size=sum(scale(c) for c in to_do))


def _fit(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(seconds per cell, seconds per unit of work) through (work, seconds) points: over several amounts of work the
    median of pairwise slopes, then the median intercept (robust: a few 2-epoch runs do not make a 3,000-epoch cell
    look 1,000 x its start-up); over one amount, the median seconds per unit and no per-cell part."""
    import itertools
    import statistics

    sample = sorted(points)[::max(1, len(points) // 200)]          # pairwise slopes: quadratic in the sample
    slopes = [(d2 - d1) / (w2 - w1) for (w1, d1), (w2, d2) in itertools.combinations(sample, 2) if w2 - w1 > 1e-9]
    if not slopes:
        return 0.0, statistics.median(d / w for w, d in points)
    per_epoch = max(0.0, statistics.median(slopes))
    return max(0.0, statistics.median(d - per_epoch * w for w, d in points)), per_epoch


def first_of_process(runs: Sequence[Any]) -> set[str]:
    """The runs that began before any other run of ``runs`` in their process (host, pid) had finished: what a
    worker trained first (the cells of its first claim), which pays what the next ones do not. A run whose process
    or times are not recorded counts as first (nothing says otherwise)."""
    from datetime import UTC, datetime

    def when(text: Any) -> datetime | None:
        """The time, in UTC (the database's clock; a row written by another tool may carry its offset)."""
        try:
            moment = datetime.fromisoformat(text) if isinstance(text, str) else None
        except ValueError:
            return None
        return None if moment is None else moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)

    by_process: dict[tuple[Any, Any], list[Any]] = {}
    for r in runs:
        by_process.setdefault((r.host, r.pid), []).append(r)
    first: set[str] = set()
    for (host, pid), group in by_process.items():
        ends = [e for r in group if (e := when(r.finished_at)) is not None]
        earliest = min(ends) if ends and host is not None and pid is not None else None
        first.update(r.id for r in group
                     if earliest is None or (start := when(r.started_at)) is None or start < earliest)
    return first


def resumed_epochs(runs: Iterable[Any]) -> dict[str, int]:
    """The epochs done of the runs among ``runs`` that resume from a checkpoint when trained again (interrupted,
    failed, stale or queued again after a lost worker; not completed ones, nor diverged ones, which train afresh)."""
    return {r.id: r.epochs_done for r in runs if r.status not in (Status.COMPLETED, Status.DIVERGED)
            and isinstance(r.epochs_done, int) and r.epochs_done > 0}
