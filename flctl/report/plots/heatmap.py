"""Final train loss over the primal x dual learning-rate grid (paper Figs. 6, 8)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from flctl.errors import ConfigError
from flctl.report.groups_of_runs import figure_number
from flctl.report.plots.common import _cmap, _figure, _ink, _one_task, _with_seeds, group_runs, tick_labels, wrap
from flctl.status import REPORTABLE, Status

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from flctl.db import RunRecord


@dataclass
class _Cell:
    values: list[float]
    diverged: int = 0


def _heatmap(runs: list[RunRecord]) -> Figure:
    from matplotlib.colors import LogNorm
    from matplotlib.patches import Rectangle

    runs = [r for r in runs if r.status in REPORTABLE]   # queued/running/failed: no value yet
    if not runs:
        raise ConfigError("the heatmap plot needs completed or diverged runs; see `flctl runs`")
    task = _one_task(runs, "heatmap")
    lrs = sorted({float(r.config["lr"]) for r in runs})
    duals = sorted({float(r.config["dual_lr"]) for r in runs if r.config.get("dual_lr") is not None})
    if len(lrs) < 2 and len(duals) < 2:
        raise ConfigError("the heatmap plot needs runs that vary lr and dual_lr, e.g. `flctl sweep TASK -m erm,fl "
                          f"--lr 1e-3,1e-2 --dual-lr 1e-3,1e-2`; these runs all use lr={tick_labels(lrs[:1])[0]}")
    panels = []
    for g in group_runs(runs, ignore=("lr", "dual_lr")):
        duals_here = sorted({float(r.config["dual_lr"]) for r in g.runs if r.config.get("dual_lr") is not None})
        rows: list[float | None] = list(duals_here) or [None]   # ERM and CSERM have no dual lr: a single row
        cells = {(i, j): _Cell([]) for i in range(len(rows)) for j in range(len(lrs))}
        for r in g.runs:
            dual = r.config.get("dual_lr")
            cell = cells[(rows.index(None if dual is None else float(dual)), lrs.index(float(r.config["lr"])))]
            loss = r.metrics.get("train.avg_loss")
            if r.status == Status.DIVERGED or (loss is not None and not math.isfinite(loss)):
                cell.diverged += 1
            elif loss is not None:
                cell.values.append(float(loss))
        panels.append((g, rows, cells))

    means = [np.mean(c.values) for _, _, cells in panels for c in cells.values() if c.values]
    positive = [m for m in means if m > 0]
    # One log colour scale shared by all panels, so equal colours mean equal losses across methods.
    lo, hi = (float(min(positive)), float(max(positive))) if positive else (1e-3, 1.0)
    vmin, vmax = (lo / 1.5, hi * 1.5) if math.isclose(lo, hi) else (lo, hi)
    norm = LogNorm(vmin, vmax)
    cmap = _cmap("viridis")

    inches = 0.8   # per cell: room for a 3-digit value or "diverged ×n"
    rows_max = max(len(rows) for _, rows, _ in panels)
    # Up to three panels side by side; more (ERM, CSERM, FL, RFL) wrap onto two rows.
    cols = len(panels) if len(panels) <= 3 else math.ceil(len(panels) / 2)
    nrows = math.ceil(len(panels) / cols)
    fig = _figure(cols * (inches * len(lrs) + 1.2) + 1.3, nrows * (inches * rows_max + 1.5) + 0.6)
    axes = fig.subplots(nrows, cols, squeeze=False).ravel()
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    axes = axes[:len(panels)]
    image = None
    for ax, (g, rows, cells) in zip(axes, panels):
        grid = np.full((len(rows), len(lrs)), np.nan)
        for (i, j), c in cells.items():
            if c.values:
                grid[i, j] = max(float(np.mean(c.values)), vmin)
        image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, norm=norm, origin="lower", aspect="equal")
        for (i, j), c in cells.items():
            if c.values:
                rgba = cmap(norm(grid[i, j]))
                text = figure_number(float(np.mean(c.values))) + (f"\n+{c.diverged} div." if c.diverged else "")
                ax.text(j, i, text, ha="center", va="center", fontsize=7, color=_ink(rgba))
            elif c.diverged:   # grey: every seed of this configuration diverged
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, color="0.7", lw=0))
                ax.text(j, i, f"diverged\n×{c.diverged}", ha="center", va="center", fontsize=7, color="0.15")
        # One format per axis (tick_labels): 1e-3, 4.6e-3, 2.2e-2, 1e-1, not 4.6e-3 beside 0.0215.
        ax.set_xticks(range(len(lrs)), tick_labels(lrs))
        ax.set_yticks(range(len(rows)), tick_labels(rows) if rows[0] is not None else [""])
        ax.set_xlabel("primal lr")
        ax.set_ylabel("dual lr" if rows[0] is not None else "(no dual lr)")
        ax.set_title(wrap(_with_seeds(g.label, max(len(c.values) + c.diverged for c in cells.values())),
                          inches * len(lrs) + 0.6, 10))
        ax.grid(False)
        ax.spines[:].set_visible(False)
    assert image is not None                 # at least one panel
    bar = fig.colorbar(image, ax=list(axes), label="final train avg loss (log scale)", shrink=0.9)
    # Plain numbers on the log colour bar; under a decade only minor ticks exist, and matplotlib would label
    # them "6×10⁻¹". Over several decades the minor ticks stay unlabelled (they would crowd the bar).
    bar.ax.yaxis.set_major_formatter(lambda v, _: figure_number(v))
    if vmax / vmin < 10:
        bar.ax.yaxis.set_minor_formatter(lambda v, _: figure_number(v))
    # a grid of two or three lrs is narrower than the title: wrapped, not cut at both edges
    fig.suptitle(wrap(f"{task}: final average train loss, mean over seeds (grey: diverged)",
                      fig.get_figwidth() - 0.2, 11))    # figure.titlesize "large": 1.2 x 9 pt
    return fig
