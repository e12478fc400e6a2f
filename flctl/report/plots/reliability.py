"""Reliability diagrams: accuracy against confidence in equal-width bins, one panel per method (seeds pooled), with
the expected calibration error of each (flctl.metrics.ece). Classification runs only."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from flctl.errors import ConfigError
from flctl.metrics import ECE_BINS, calibration_bins, ece
from flctl.report.data import final_records
from flctl.report.plots.common import _completed, _figure, _one_task, _with_seeds, group_runs, wrap

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from flctl.db import RunRecord


def _reliability(runs: list[RunRecord], records_root: Path, split: str | None) -> Figure:
    task = _one_task(runs, "reliability")
    done, note = _completed(runs, "reliability")
    split = split or "test"
    table = final_records(records_root, done, ["run_id", "confidence", "correct"], split=split)
    if table.num_rows == 0 or table["confidence"].null_count == table.num_rows:
        raise ConfigError(f"reliability diagrams need a classifier's confidences; the {task} runs have none "
                          "(regression or preference task)")
    run_ids = np.asarray(table["run_id"].to_pylist())
    confidence = table["confidence"].to_numpy(zero_copy_only=False)
    correct = table["correct"].to_numpy(zero_copy_only=False).astype(np.float64)

    groups = group_runs(done)
    # Up to four panels a row, so that a sweep of 16 configurations is a 4 x 4 grid, not a 50-inch strip.
    cols = min(len(groups), 4)
    rows = math.ceil(len(groups) / cols)
    fig = _figure(3.2 * cols + 0.4, 2.9 * rows + 0.7)
    grid = fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False)
    for ax in grid.ravel()[len(groups):]:
        ax.set_visible(False)
    axes = grid.ravel()[:len(groups)]
    edges = np.linspace(0.0, 1.0, ECE_BINS + 1)
    centers, width = (edges[:-1] + edges[1:]) / 2, 1.0 / ECE_BINS
    # The confidence axis from the lowest bin any run reaches: a max softmax probability is at least 1/K (0.5 for
    # a binary task, whose panels were half empty), so the bins below it hold nothing
    seen = confidence[~np.isnan(confidence)] if confidence.size else confidence
    low = float(edges[min(int(np.floor(seen.min() * ECE_BINS)), ECE_BINS - 1)]) if seen.size else 0.0
    for ax, group in zip(axes, groups):
        mine = np.isin(run_ids, [r.id for r in group.runs])
        conf, ok = confidence[mine], correct[mine]
        n_b, n_correct, _ = calibration_bins(conf, ok)            # the bins ece() uses
        filled = n_b > 0
        accuracy = n_correct[filled] / n_b[filled]
        ax.bar(centers[filled], accuracy, width=width, color=group.color, edgecolor="0.2", linewidth=0.5,
               label=_with_seeds(group.label, len(group.runs)))
        # Perfect calibration, drawn over the bars (zorder) so that it shows where a bar overshoots it.
        ax.plot([low, 1], [low, 1], ls="--", color="0.15", lw=1, zorder=3)
        ax.set_xlim(low, 1)
        ax.set_ylim(0, 1)
        ax.set_title(f"{wrap(_with_seeds(group.label, len(group.runs)), 3.0, 10)}\nECE {ece(conf, ok):.3f}")
    for i, ax in enumerate(axes):
        if i + cols >= len(groups):   # the lowest panel of its column
            ax.set_xlabel("confidence (max softmax probability)")
            ax.xaxis.set_tick_params(labelbottom=True)
        if i % cols == 0:
            ax.set_ylabel(f"{split} accuracy")
    fig.suptitle(f"{task}: reliability ({split}, {ECE_BINS} bins){note}")
    return fig
