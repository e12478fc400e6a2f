"""The per-task figures a benchmark committed for a kind of device (benchmarks/results/task-costs-*.json, written by
benchmarks/bench_task_costs.py): a plan's price where the database has no finished run of its task."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flctl.config import RunConfig
from flctl.cost.model import FROM_ANOTHER_MACHINE, CostEstimate, at_once, is_number, left_epochs, warn

# Where a checkout keeps its committed benchmark results (an installed wheel has none: its estimates then need runs).
REFERENCE = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


# The figures an estimate reads from a committed benchmark: those it needs, and those older files do not tell.
_NEEDED, _OPTIONAL = ("s_per_cell", "s_per_epoch"), ("s_per_start", "s_per_process", "s_per_cell_full_data", "n_train")
# A figure in seconds above this (a year) was measured by no machine: a damaged or foreign file.
_MOST_SECONDS = 3.2e7


def _damage(figures: Any) -> str | None:
    """What is wrong with a task's committed figures (None: they can be read)."""
    if not isinstance(figures, dict):
        return f"its figures are {type(figures).__name__}, not a table"
    for key in (*_NEEDED, *(k for k in _OPTIONAL if figures.get(k) is not None)):
        if not is_number(figures.get(key)):
            return f"{key} = {figures.get(key)!r} is not a number >= 0"
        if key.startswith("s_") and figures[key] > _MOST_SECONDS:
            return f"{key} = {figures[key]!r} s is more than a year"
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
    measured on another machine (its interval the widest, FROM_ANOTHER_MACHINE); None where none has the task. ``started``: as
    ``estimate_cost``'s."""
    found = _figures(configs[0].task, configs[0].device.split(":")[0], folder)
    if found is None:
        return None
    figures, path = found
    full = figures.get("n_train")      # the samples an epoch trained on there (older files: not told)

    def scale(cfg: RunConfig) -> float:
        return min(cfg.subset, full) / full if full and cfg.subset else 1.0
    left = left_epochs(configs, started or {})
    return CostEstimate(float(figures["s_per_cell"]), float(figures["s_per_epoch"]), 0,
                        sum(left.values()), len(configs), at_once(cells_per_device, configs),
                        source=f"benchmarks/results/{path.name}", scale=scale, spread=FROM_ANOTHER_MACHINE,
                        work=sum(left[c.run_id] * scale(c) for c in configs), s_per_start=float(figures.get("s_per_start", 0)),
                        s_per_process=float(figures.get("s_per_process", 0)) if configs else 0.0,
                        s_per_cell_scaled=float(figures.get("s_per_cell_full_data", 0)),
                        size=sum(scale(c) for c in configs))


def on_a_gpu(configs: Sequence[RunConfig], cells_per_device: int = 1,
             started: Mapping[str, int] | None = None) -> CostEstimate | None:
    """``reference_cost`` of the cells as they would train on a GPU: a task measured on a GPU only (cifar10's
    ResNet-18), priced for a CPU user who could move it there; None where no GPU benchmark has the task."""
    import dataclasses

    return reference_cost([dataclasses.replace(c, device="cuda") for c in configs], cells_per_device, started=started)


def start_up(task: str, device: str, folder: Path | None = None) -> float:
    """The seconds before a sweep's first cell trains, as the committed benchmark measured them for the task (its
    processes' interpreter, imports and database: what no run's own duration holds); 0 where none tells it."""
    return _figure(task, device, "s_per_start", folder) or 0.0


def first_cell_extra(task: str, device: str, folder: Path | None = None) -> float:
    """What a worker's first cell pays that its next ones do not, as the committed benchmark measured it for the task
    (``s_per_process``); 0 where none tells it."""
    return _figure(task, device, "s_per_process", folder) or 0.0


def grown_share(task: str, device: str, samples: float | None, folder: Path | None = None) -> float:
    """Of a cell's own start-up at ``samples`` training samples, the share that grows with them (its evaluations,
    the data moved to the model), as the committed benchmark measured the task (``s_per_cell_full_data`` at the full
    data's size beside the fixed ``s_per_cell``); 0 where it does not tell."""
    found = _figures(task, device.split(":")[0], folder)
    if found is None or not samples:
        return 0.0
    figures = found[0]
    full = figures.get("n_train")
    grown = float(figures.get("s_per_cell_full_data") or 0) * (min(samples, full) / full if full else 1.0)
    whole = grown + float(figures["s_per_cell"])
    return grown / whole if whole > 0 else 0.0


def full_size(task: str, device: str, folder: Path | None = None) -> float | None:
    """The samples of an epoch on the task's full data, as the committed benchmark measured it (None: not told)."""
    return _figure(task, device, "n_train", folder)


def _figure(task: str, device: str, key: str, folder: Path | None) -> float | None:
    found = _figures(task, device.split(":")[0], folder)
    return float(found[0][key]) if found is not None and found[0].get(key) else None
