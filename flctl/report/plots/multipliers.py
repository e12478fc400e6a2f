"""Decision regions with each training sample's multiplier (paper Fig. 3, two-moons)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from flctl.errors import ConfigError
from flctl.method_info import method_info
from flctl.report.data import final_records
from flctl.report.plots.common import _figure, group_runs, legend_below, load_extras, wrap
from flctl.status import Status

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from flctl.db import RunRecord


# The extras keys the figure draws a run from (docs/design.md): the grid's axes and the 2-D training inputs, with the
# class-1 probability on the grid (PROBABILITY: runs before 2026-11-29 saved it) or the classifier it comes from, a
# ReLU MLP's layers (mlp_weight_<i> [out, in], mlp_bias_<i>), evaluated on the grid for the runs drawn only.
GRID_KEYS = ("grid_x", "grid_y", "train_x", "train_y")
PROBABILITY = "grid_prob1"


def _multipliers(runs: list[RunRecord], records_root: Path) -> Figure:
    candidates = [r for r in runs if method_info(r.method).has_multipliers and r.status == Status.COMPLETED]
    with_grid = [(r, e) for r in candidates if (e := load_extras(r, GRID_KEYS)) is not None
                 and (PROBABILITY in e or any(k.startswith("mlp_") for k in e))]
    if not with_grid:
        raise ConfigError("the multipliers plot needs completed two-moons fl/rfl runs with extras (decision grid), "
                          "e.g. `flctl sweep two-moons -m fl,rfl`; select them with --task two-moons")
    extras = {r.id: e for r, e in with_grid}
    chosen = _one_seed_per_group([r for r, _ in with_grid], limit=4)
    table = final_records(records_root, chosen, ["run_id", "sample_id", "multiplier"],
                          split="train")

    cols = 1 if len(chosen) == 1 else 2   # two-moons panels are wide: 1, 2 or a 2x2 grid
    rows = math.ceil(len(chosen) / cols)
    fig = _figure(4.6 * cols + 0.9, 3.2 * rows + 0.9)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    contours = None
    labels = {r.id: g.label for g in group_runs(candidates) for r in g.runs}
    for ax, run in zip(axes, chosen):
        e = extras[run.id]
        lam = _aligned_multipliers(table, run.id, len(e["train_x"]))
        prob = class1_probability(e, f"run {run.id}'s extras ({run.artifacts.get('extras')})")
        contours = ax.contourf(e["grid_x"], e["grid_y"], prob, levels=np.linspace(0, 1, 11), cmap="RdBu_r",
                               alpha=0.35)
        ax.contour(e["grid_x"], e["grid_y"], prob, levels=[0.5], colors="k", linewidths=1.2)
        _multiplier_scatter(ax, e["train_x"], e["train_y"], lam)
        ax.set_title(wrap(f"{labels[run.id]}, seed {run.seed} (max λ = {np.nanmax(lam):.2g})", 4.4, 10))
        ax.set_xlabel("$x_1$")
        ax.set_ylabel("$x_2$")
        ax.grid(False)
        ax.set_aspect("equal")
    for ax in axes[len(chosen):]:
        ax.set_visible(False)
    assert contours is not None
    fig.colorbar(contours, ax=list(axes), label="predicted P(class 1)", shrink=0.8)
    handles = _multiplier_legend()
    legend_below(fig, handles, [h.get_label() for h in handles])
    fig.suptitle(wrap(f"{chosen[0].task}: final multipliers (marker area ∝ λ / max λ of the panel) over the "
                      "predicted probabilities", fig.get_figwidth() - 0.2, 10))
    return fig


def class1_probability(extras: dict[str, np.ndarray], source: str) -> np.ndarray:
    """P(class 1) on the grid, [len(grid_y), len(grid_x)]: the saved one, else the run's MLP evaluated at each grid
    point as flctl.models.mlp computes it (its linear layers in order, a ReLU between each two, then the softmax), in
    numpy: reports run where torch is not installed. ``source`` names the extras in an error."""
    if PROBABILITY in extras:
        return extras[PROBABILITY]
    layers = _layers(extras, source)
    xx, yy = np.meshgrid(extras["grid_x"], extras["grid_y"])
    h = np.stack([xx.ravel(), yy.ravel()], axis=1).astype(layers[0][0].dtype)
    for i, (weight, bias) in enumerate(layers):
        if weight.ndim != 2 or weight.shape[1] != h.shape[1] or bias.shape != weight.shape[:1]:
            raise ConfigError(f"{source}: MLP layer {i} ({weight.shape}, bias {bias.shape}) does not take "
                              f"{h.shape[1]} inputs; not a classifier of 2-D points")
        h = h @ weight.T + bias
        if i < len(layers) - 1:
            np.maximum(h, 0, out=h)
    if h.shape[1] != 2:     # a hidden layer's activations taken for logits: its last layer is missing
        raise ConfigError(f"{source}: the MLP's last layer has {h.shape[1]} output(s); two classes need two (is a "
                          "layer missing?)")
    p = np.exp(h - h.max(axis=1, keepdims=True))
    return (p[:, 1] / p.sum(axis=1)).reshape(xx.shape)


def _layers(extras: dict[str, np.ndarray], source: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """The MLP's linear layers in order, each a weight and a bias, numbered 0 to n-1 without a gap: drawn with one
    missing (a middle layer, or one bias) the figure would be another network's decision region, without a word.
    ConfigError naming the first layer that is missing or half there."""
    numbers: dict[str, set[int]] = {"weight": set(), "bias": set()}
    for key in extras:
        kind, _, number = key.removeprefix("mlp_").rpartition("_")
        if key.startswith("mlp_") and kind in numbers:
            if not number.isdigit():
                raise ConfigError(f"{source}: {key!r} is not an MLP layer's name (mlp_{kind}_<number>)")
            numbers[kind].add(int(number))
    count = max((n + 1 for found in numbers.values() for n in found), default=0)
    if not count:
        raise ConfigError(f"{source}: neither the grid's probabilities ({PROBABILITY}) nor an MLP's layers")
    for i in range(count):
        if missing := [kind for kind, found in numbers.items() if i not in found]:
            raise ConfigError(f"{source}: MLP layer {i} of {count} has no {' and no '.join(missing)}; the decision "
                              "region cannot be computed without it")
    return [(extras[f"mlp_weight_{i}"], extras[f"mlp_bias_{i}"]) for i in range(count)]


def _one_seed_per_group(runs: list[RunRecord], limit: int) -> list[RunRecord]:
    """Round-robin over the groups (lowest seed first): one run of each method/config before a second seed."""
    groups = [list(g.runs) for g in group_runs(runs)]
    picked: list[RunRecord] = []
    while len(picked) < limit and any(groups):
        for g in groups:
            if g and len(picked) < limit:
                picked.append(g.pop(0))
    return picked


def _aligned_multipliers(table, run_id: str, n: int) -> np.ndarray:
    """The run's final multipliers indexed by sample id (train ids are positions in the training split)."""
    import pyarrow.compute as pc

    rows = table.filter(pc.equal(table["run_id"], run_id))
    ids = rows["sample_id"].to_numpy()
    lam = rows["multiplier"].to_numpy(zero_copy_only=False).astype(np.float64)
    if len(ids) != n or ids.max(initial=-1) >= n:
        raise ConfigError(f"run {run_id}: {len(ids)} train records for {n} training points in its extras; "
                          "were the records overwritten by another run? re-run it with --rerun")
    out = np.full(n, np.nan)
    out[ids] = lam
    if np.isnan(out).all():
        raise ConfigError(f"run {run_id} recorded no multipliers; the multipliers plot needs fl or rfl runs")
    return out


def _marker_area(lam: np.ndarray, top: float) -> np.ndarray:
    # Area ∝ λ; a small floor keeps zero-multiplier points visible as dots (as in the paper's Fig. 3).
    return 2.0 + 90.0 * np.nan_to_num(lam) / (top if top > 0 else 1.0)


def _multiplier_scatter(ax: Axes, x: np.ndarray, y: np.ndarray, lam: np.ndarray) -> None:
    # Large markers (boundary points) first, so the small ones drawn after them are not hidden.
    order = np.argsort(-np.nan_to_num(lam))
    colors = np.where(y[order] == 1, "tab:red", "tab:blue")
    ax.scatter(x[order, 0], x[order, 1], s=_marker_area(lam[order], np.nanmax(lam)), c=colors, edgecolors="k",
               linewidths=0.3, alpha=0.85)


def _multiplier_legend() -> list:
    from matplotlib.lines import Line2D

    def dot(color: str, area: float, label: str) -> Line2D:
        return Line2D([], [], ls="", marker="o", ms=math.sqrt(area), mfc=color, mec="k", mew=0.3, label=label)

    return [dot("tab:blue", 20, "class 0"), dot("tab:red", 20, "class 1"),
            dot("0.6", float(_marker_area(np.array([1.0]), 1.0)[0]), "λ = max λ"),
            dot("0.6", float(_marker_area(np.array([0.5]), 1.0)[0]), "λ = max λ / 2"),
            Line2D([], [], color="k", lw=1.2, label="decision boundary (P = 0.5)")]
