"""Average and max loss, violation rate and max multiplier per eval epoch: how methods, or the gd and nupi dual
optimizers, approach the feasible set (overshoot shows as a violation rate and losses that fall below what ε asks)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from flctl.errors import ConfigError
from flctl.report.data import all_epochs
from flctl.report.plots.common import (
    Group,
    _completed,
    _figure,
    _figure_legend,
    _one_task,
    _spans_decades,
    _with_seeds,
    group_runs,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from flctl.db import RunRecord


def _dynamics(runs: list[RunRecord], records_root: Path, split: str | None) -> Figure:
    import pyarrow.compute as pc
    from matplotlib.ticker import MaxNLocator

    task = _one_task(runs, "dynamics")
    done, note = _completed(runs, "dynamics")
    split = split or "train"
    table = all_epochs(records_root, done,
                       ["run_id", "split", "epoch", "sample_id", "loss", "multiplier"])
    stats = (table.filter(pc.equal(table["split"], split))
             .group_by(["run_id", "epoch"])
             .aggregate([("loss", "mean"), ("loss", "max"), ("multiplier", "max")]))
    if stats.num_rows == 0:
        raise ConfigError(f"no {split} records for the selected runs; pass --split train or test")
    # Multipliers live on the train split only: take them from there whatever split the losses come from.
    lam = (table.filter(pc.equal(table["split"], "train")).group_by(["run_id", "epoch"])
           .aggregate([("multiplier", "max")]))
    series = {c: _by_run_epoch(stats, c) for c in ("loss_mean", "loss_max")}
    series["multiplier_max"] = _by_run_epoch(lam, "multiplier_max")
    series["violation_rate"] = _violation_rates(table.filter(pc.equal(table["split"], split)), done)

    fig = _figure(15.0, 3.6)
    axes = fig.subplots(1, 4)
    # (column, panel title, y label): the title says what is plotted, the y label only its unit, short enough
    # that it never runs into the panel beside it.
    panels = (("loss_mean", f"Average {split} loss", "loss"), ("loss_max", f"Max {split} loss", "loss"),
              ("violation_rate", f"{split.capitalize()} violation rate (loss > ε)", "share of samples"),
              ("multiplier_max", "Max multiplier λ", "λ"))
    groups = group_runs(done)
    epochs = sorted({e for d in series["loss_mean"].values() for e in d})
    for ax, (column, title, ylabel) in zip(axes, panels):
        drawn = [_mean_over_seeds(ax, g, series[column]) for g in groups]
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))   # epochs are whole numbers
        if len(epochs) == 1:   # a single eval epoch would get a ±0.1 axis of fractional epochs
            ax.set_xlim(epochs[0] - 1, epochs[0] + 1)
        ax.set_xlabel("epoch")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        if not any(drawn):
            ax.text(0.5, 0.5, "no multipliers\n(ERM/CSERM runs only)" if column == "multiplier_max" else "no ε\n(ERM only)",
                    ha="center", va="center", transform=ax.transAxes, color="0.4")
        elif _spans_decades(np.array([v for d in series[column].values() for v in d.values()])):
            ax.set_yscale("log")
    _figure_legend(fig, axes[0], "mean over seeds" if any(len(g.runs) > 1 for g in groups) else None)
    fig.suptitle(f"{task}: training dynamics at eval epochs{note}")
    return fig


def _violation_rates(table, runs: list[RunRecord]) -> dict[str, dict[int, float]]:
    """Share of samples with loss above ε per run and eval epoch (runs with an ε)."""
    out: dict[str, dict[int, float]] = {}
    run_ids = np.asarray(table["run_id"].to_pylist())
    epochs, losses = (table[c].to_numpy() for c in ("epoch", "loss"))
    for r in runs:
        eps = r.config.get("eps")
        if eps is None:
            continue
        mine = run_ids == r.id
        violated = losses[mine] > eps
        out[r.id] = {int(e): float(violated[epochs[mine] == e].mean()) for e in np.unique(epochs[mine])}
    return out


def _by_run_epoch(stats, column: str) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for run_id, epoch, value in zip(stats["run_id"].to_pylist(), stats["epoch"].to_pylist(),
                                    stats[column].to_pylist()):
        if value is not None and math.isfinite(value):
            out.setdefault(run_id, {})[int(epoch)] = float(value)
    return out


def _mean_over_seeds(ax: Axes, group: Group, values: dict[str, dict[int, float]]) -> bool:
    """Plot the seeds' mean at each eval epoch (seeds missing an epoch are left out there); False if empty."""
    per_run = [values[r.id] for r in group.runs if values.get(r.id)]
    if not per_run:
        return False
    epochs = sorted({e for d in per_run for e in d})
    mean = [np.mean([d[e] for d in per_run if e in d]) for e in epochs]
    ax.plot(epochs, mean, marker="o", ms=3, lw=1.5, ls=group.linestyle, color=group.color,
            label=_with_seeds(group.label, len(per_run)))
    return True
