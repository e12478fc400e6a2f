"""Loss CDF and CVaR curves (paper Figs. 2, 5, 7, 9, 10)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from flctl.errors import ConfigError
from flctl.metrics import SPLITS
from flctl.report.data import final_losses
from flctl.report.plots.common import (
    BAND,
    Group,
    _band,
    _completed,
    _figure,
    _figure_legend,
    _one_task,
    _spans_decades,
    group_runs,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from flctl.db import RunRecord


def _final_losses(records_root: Path, runs: Sequence[RunRecord], split: str | None) -> dict[tuple[str, str], np.ndarray]:
    """{(run_id, split): final per-sample losses}."""
    return final_losses(records_root, runs, [split] if split else list(SPLITS))


def _cvar_curve(losses: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """CVaR(q) = mean loss of the samples at or above the q-quantile, for every q at once (suffix means)."""
    s = np.sort(losses)
    start = np.searchsorted(s, np.quantile(s, qs), side="left")
    suffix_sum = np.concatenate([np.cumsum(s[::-1])[::-1], [0.0]])
    return suffix_sum[start] / (len(s) - start)


def _distribution(runs: list[RunRecord], records_root: Path, split: str | None, kind: str) -> Figure:
    task = _one_task(runs, kind)
    done, note = _completed(runs, kind)
    splits = [split] if split else list(SPLITS)
    losses = _final_losses(records_root, done, split)
    groups = group_runs(done)

    fig = _figure(max(7.0, 5.0 * len(splits)), 3.8)
    axes = fig.subplots(1, len(splits), squeeze=False)[0]
    for ax, sp in zip(axes, splits):
        per_group = [(g, [losses[(r.id, sp)] for r in g.runs if len(losses.get((r.id, sp), ())) > 0])
                     for g in groups]
        per_group = [(g, ls) for g, ls in per_group if ls]
        if not per_group:
            raise ConfigError(f"no {sp} records in the selected runs; pass --split to plot the other split")
        (_cdf_panel if kind == "cdf" else _cvar_panel)(ax, per_group)
        # what every curve holds: one count, or the range where runs of several sizes are shown together
        counts = sorted({len(losses) for _, ls in per_group for losses in ls})
        ax.set_title(f"{sp.capitalize()} ({counts[0]:,}" + (f"–{counts[-1]:,}" if len(counts) > 1 else "") + " samples)")
    _figure_legend(fig, axes[0], BAND if any(len(g.runs) > 1 for g in groups) else None)
    what = "Empirical CDF" if kind == "cdf" else "CVaR"
    fig.suptitle(f"{task}: {what} of final per-sample losses{note}")
    return fig


def _cdf_panel(ax: Axes, per_group: list[tuple[Group, list[np.ndarray]]]) -> None:
    every = np.concatenate([losses for _, ls in per_group for losses in ls])
    log = _spans_decades(every)
    if log:   # losses near zero (interpolated training data) only show on a log axis
        positive = every[every > 0]
        grid = np.geomspace(max(positive.min(), positive.max() * 1e-12), positive.max(), 500)
    else:
        grid = np.linspace(every.min(), every.max(), 500)
    for g, ls in per_group:
        curves = np.stack([np.searchsorted(np.sort(losses), grid, side="right") / len(losses) for losses in ls])
        _band(ax, grid, curves, g)
    if log:
        ax.set_xscale("log")
    ax.set_xlabel("per-sample loss" + (" (log scale)" if log else ""))
    ax.set_ylabel("fraction of samples with loss ≤ x")
    ax.set_ylim(0, 1.02)


def _cvar_panel(ax: Axes, per_group: list[tuple[Group, list[np.ndarray]]]) -> None:
    qs = np.linspace(0.0, 1.0, 201)[:-1]     # q in [0, 1): CVaR(0) is the mean, CVaR(q -> 1) the max
    curves_of = [(g, np.stack([_cvar_curve(losses, qs) for losses in ls])) for g, ls in per_group]
    for g, curves in curves_of:
        _band(ax, qs, curves, g)
    if _spans_decades(np.concatenate([c.ravel() for _, c in curves_of])):
        ax.set_yscale("log")
    ax.set_xlabel("quantile q")
    ax.set_ylabel("CVaR: mean loss of samples ≥ q-quantile")
    ax.set_xlim(0, 1)
