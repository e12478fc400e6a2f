"""Polynomial fits of ERM and FL (paper Fig. 1)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from flctl.errors import ConfigError
from flctl.report.groups_of_runs import value_order
from flctl.report.plots.common import _figure, _figure_legend, group_runs, load_extras
from flctl.status import Status

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from flctl.db import RunRecord


CURVE_KEYS = ("curve_x", "curve_y", "truth_y", "train_x", "train_y")


def _polyfit(runs: list[RunRecord]) -> Figure:
    fits = [(r, e) for r in runs if r.task == "polyfit" and r.status == Status.COMPLETED
            and (e := load_extras(r, CURVE_KEYS)) is not None]
    if not fits:
        raise ConfigError("the polyfit plot needs completed polyfit runs with extras, e.g. "
                          "`flctl sweep polyfit -m erm,fl -o degree=10,20,30`; select them with --task polyfit")
    extras = {r.id: e for r, e in fits}
    degrees = sorted({(r.config.get("options") or {}).get("degree") for r, _ in fits}, key=value_order)

    fig = _figure(4.0 * len(degrees), 3.5)
    axes = fig.subplots(1, len(degrees), squeeze=False, sharey=True)[0]
    for ax, degree in zip(axes, degrees):
        panel = [r for r, _ in fits if (r.config.get("options") or {}).get("degree") == degree]
        first = extras[panel[0].id]
        ax.plot(first["curve_x"], first["truth_y"], "k--", lw=1.2, label="ground truth cos(πx)")
        for g in group_runs(panel):
            e = extras[g.runs[0].id]   # seeds do not change a convex solve: one curve per config
            ax.plot(e["curve_x"], e["curve_y"], color=g.color, ls=g.linestyle, lw=1.8, label=g.label)
        ax.scatter(first["train_x"], first["train_y"], s=16, c="k", zorder=3, label="training data")
        ax.set_ylim(*_sensible_ylim(first))
        ax.set_title(f"degree {degree}")
        ax.set_xlabel("x")
    axes[0].set_ylabel("y")
    _figure_legend(fig, axes[0], None)
    fig.suptitle("polyfit: ERM (least squares) vs FL (|residual| ≤ ε for every sample)")
    return fig


def _sensible_ylim(extras: dict[str, np.ndarray]) -> tuple[float, float]:
    # High-degree fits explode between and beyond the points; clip to the data's range plus a margin.
    ys = np.concatenate([extras["train_y"], extras["truth_y"]])
    lo, hi = float(ys.min()), float(ys.max())
    pad = 0.35 * (hi - lo)
    return lo - pad, hi + pad
