"""What every figure shares: style, grouping runs into labelled curves, small helpers."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from flctl.config import ConfigError, with_later_defaults
from flctl.method_info import method_info

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from flctl.store import RunRecord

DPI = 150
# Config keys that never split runs into curves: seeds are what the median and band summarize, eps and alpha
# are always in the label, and device/data_dir say where a run executed, not what it computed.
NOT_CURVE_KEYS = frozenset({"task", "method", "seed", "eps", "alpha", "device", "data_dir"})
STYLE: dict[Any, Any] = {"axes.spines.top": False, "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.3,
         "font.size": 9, "axes.titlesize": 10, "legend.fontsize": 8, "legend.framealpha": 0.9,
         "savefig.dpi": DPI}
BAND = "median over seeds; band: min–max"



# ---------------------------------------------------------------- grouping runs into labelled curves

@dataclass(frozen=True)
class Group:
    """Runs that differ only by seed: one curve (median over seeds) or one heatmap panel."""
    label: str
    method: str
    runs: tuple[RunRecord, ...]
    color: tuple[float, float, float, float]

    @property
    def linestyle(self) -> str:
        return method_info(self.method).linestyle


def group_runs(runs: Sequence[RunRecord], ignore: Sequence[str] = ()) -> list[Group]:
    """Group runs by method, ε, α and every other config field (``options.X`` for task options) that takes
    several values among them, except those in ``ignore``; sorted ERM, FL, RFL, CSERM, then by value.

    Labels read like "RFL ε=0.1 α=0.01" plus the varying fields ("lr=1e-3"), so a sweep over a field that
    is not a seed is never silently averaged as if it were seeds."""
    flat = [_flat_config(r.config) for r in runs]
    values: dict[str, set[str]] = {}
    for cfg in flat:
        for name, v in cfg.items():
            if name not in NOT_CURVE_KEYS and name not in ignore and v is not None:
                values.setdefault(name, set()).add(fmt(v))
    varying = sorted(name for name, vs in values.items() if len(vs) > 1)

    buckets: dict[tuple, list[RunRecord]] = {}
    for run, cfg in zip(runs, flat):
        key = (run.method, cfg.get("eps"), cfg.get("alpha"), *(cfg.get(v) for v in varying))
        buckets.setdefault(_hashable(key), []).append(run)

    def order(key: tuple) -> tuple:
        return (method_info(key[0]).order, key[0], *(_sortable(v) for v in key[1:]))

    keys = sorted(buckets, key=order)
    per_method = {m: [key for key in keys if key[0] == m] for m in {key[0] for key in keys}}
    groups = []
    for key in keys:
        method, eps, alpha, *rest = key
        parts = [method_info(method).label]
        parts += [f"ε={fmt(eps)}"] if eps is not None else []
        parts += [f"α={fmt(alpha)}"] if alpha is not None else []
        parts += [f"{name.removeprefix('options.')}={fmt(v)}" for name, v in zip(varying, rest) if v is not None]
        siblings = per_method[method]
        groups.append(Group(" ".join(parts), method, tuple(sorted(buckets[key], key=lambda r: r.seed)),
                            _shade(method, siblings.index(key), len(siblings))))
    return groups


def _flat_config(config: dict) -> dict[str, Any]:
    flat = {k: v for k, v in with_later_defaults(config).items() if k != "options"}
    flat.update({f"options.{k}": v for k, v in (config.get("options") or {}).items()})
    return flat


def _hashable(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


def _sortable(value: Any) -> tuple:
    # None first, then numbers by value (so lr=1e-3 sorts before lr=1e-2), then anything else as text.
    if value is None:
        return (0, 0.0, "")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (1, float(value), "")
    return (2, 0.0, str(value))


def _shade(method: str, index: int, count: int) -> tuple[float, float, float, float]:
    import matplotlib

    # One colour family per method so a method looks the same in every figure; shades tell its variants apart.
    cmap = matplotlib.colormaps[method_info(method).cmap]
    # Light ends of the sequential maps are invisible on white; one variant gets a strong mid-dark shade.
    return cmap(0.75 if count == 1 else 0.45 + 0.5 * index / (count - 1))


def fmt(value: Any) -> str:
    """Compact text for a config value: 0.1, 1e-3, 5e-4, 10; per-sample ε lists as 'per-sample'."""
    if isinstance(value, (list, tuple)):
        return "per-sample"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or value == 0 or not math.isfinite(value):
        return f"{value:g}"
    exp = math.floor(math.log10(abs(value)))
    if -2 <= exp <= 2:
        return f"{value:.3g}"
    mantissa = value / 10**exp
    return f"{'-' if mantissa < 0 else ''}1e{exp}" if math.isclose(abs(mantissa), 1.0) else f"{mantissa:.2g}e{exp}"


# ---------------------------------------------------------------- shared helpers

def _figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    # A bare Figure (no pyplot) is not registered globally, so many reports in one process do not leak.
    return Figure(figsize=(width, height), layout="constrained", dpi=DPI)


def _one_task(runs: Sequence[RunRecord], name: str) -> str:
    tasks = sorted({r.task for r in runs})
    if len(tasks) > 1:
        raise ConfigError(f"the {name} plot compares runs of one task, got {', '.join(tasks)}; "
                          "select one with --task or --sweep")
    return tasks[0]


def _completed(runs: Sequence[RunRecord], name: str) -> tuple[list[RunRecord], str]:
    """Completed runs (diverged ones have no final records) and a note on how many were left out."""
    done = [r for r in runs if r.status == "completed"]
    if not done:
        raise ConfigError(f"the {name} plot needs completed runs; all {len(runs)} selected runs diverged")
    left = len(runs) - len(done)
    # On a line of its own: a suptitle does not wrap, and a one-panel figure is narrow.
    return done, (f"\n({left} diverged run{'s' * (left > 1)} left out)" if left else "")


def _spans_decades(values: np.ndarray, decades: float = 2.0) -> bool:
    """Whether positive values spread over more than ``decades`` orders of magnitude (then use a log axis).

    The 5th percentile stands for the small end so that a single near-zero loss does not force a log axis."""
    positive = values[np.isfinite(values) & (values > 0)]
    return positive.size > 1 and positive.max() / np.quantile(positive, 0.05) > 10**decades


def _figure_legend(fig: Figure, ax: Axes, title: str | None) -> None:
    """One legend for all panels, below them, so that it never hides a curve."""
    handles, labels = ax.get_legend_handles_labels()
    # As many columns as fit the figure's width (about 0.065 in per character at 8 pt, plus the line sample).
    entry = 0.6 + 0.065 * max(len(label) for label in labels)
    ncols = max(1, min(len(labels), 4, int(fig.get_figwidth() // entry)))
    fig.legend(handles, labels, loc="outside lower center", ncols=ncols, title=title,
               title_fontsize=7, frameon=False)


def _with_seeds(label: str, n: int) -> str:
    return f"{label} ({n} seed{'s' * (n > 1)})"


def _band(ax: Axes, x: np.ndarray, curves: np.ndarray, group: Group) -> None:
    """Median over seeds as a line, min–max over seeds as a shaded band (no band for a single seed)."""
    ax.plot(x, np.median(curves, axis=0), color=group.color, ls=group.linestyle, lw=1.6,
            label=_with_seeds(group.label, len(curves)))
    if len(curves) > 1:
        ax.fill_between(x, curves.min(axis=0), curves.max(axis=0), color=group.color, alpha=0.2, lw=0)


def load_extras(run: RunRecord, needed: Sequence[str]) -> dict[str, np.ndarray] | None:
    path = (run.artifacts or {}).get("extras")
    if not path or not Path(path).is_file():
        return None
    with np.load(path) as data:
        if not all(k in data for k in needed):
            return None
        return {k: data[k] for k in data.files}


def _cmap(name: str):
    import matplotlib

    return matplotlib.colormaps[name].with_extremes(bad="white")   # configurations not run stay blank


def _ink(rgba: Sequence[float]) -> str:
    """Black text on light cells, white on dark ones (perceived luminance)."""
    r, g, b = rgba[:3]
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"
