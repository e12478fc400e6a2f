"""The paper's figures from finished runs: loss CDF/CVaR, lr heatmaps, two-moons multipliers, top multipliers,
polynomial fits and training dynamics.

``plot(name, runs, records_root, out)`` draws one figure and writes ``out.png`` and ``out.pdf`` atomically.
Per-sample data comes only through ``flctl.report.data`` (final records, all epochs) and the runs' artifacts.
matplotlib (and scikit-learn, for digit images) is imported inside functions so that ``flctl --help`` stays
fast; torch is never imported (reports run where no training stack is installed).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from flctl.config import ConfigError
from flctl.fs import atomic_path
from flctl.method_info import method_info
from flctl.metrics import SPLITS
from flctl.report.data import all_epochs, final_losses, final_records

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PLOTS = ("cdf", "cvar", "heatmap", "multipliers", "top-multipliers", "polyfit", "dynamics")
IMAGE_TASKS = ("digits", "cifar10", "utkface")
DPI = 150
# Config keys that never split runs into curves: seeds are what the median and band summarize, eps and alpha
# are always in the label, and device/data_dir say where a run executed, not what it computed.
NOT_CURVE_KEYS = frozenset({"task", "method", "seed", "eps", "alpha", "device", "data_dir"})
STYLE: dict[Any, Any] = {"axes.spines.top": False, "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.3,
         "font.size": 9, "axes.titlesize": 10, "legend.fontsize": 8, "legend.framealpha": 0.9,
         "savefig.dpi": DPI}
BAND = "median over seeds; band: min–max"


# ---------------------------------------------------------------- public entry point

def plot(name: str, runs: list[dict], records_root: Path, out: Path, *, split: str | None = None,
         k: int = 16) -> list[Path]:
    """Draw the named figure from ``runs`` and write ``out.png`` and ``out.pdf``; returns both paths.

    Raises ConfigError (one line) for an unknown name, a bad split or k, or runs the figure cannot use."""
    import matplotlib

    with matplotlib.rc_context(STYLE):
        return save(figure(name, runs, records_root, split=split, k=k), Path(out))


def figure(name: str, runs: list[dict], records_root: Path, *, split: str | None = None, k: int = 16) -> Figure:
    """The named figure, not yet written (see ``plot``)."""
    if name not in PLOTS:
        raise ConfigError(f"unknown plot {name!r}; choose one of: {', '.join(PLOTS)}")
    if split not in (None, *SPLITS):
        raise ConfigError(f"split must be train or test, got {split!r}")
    if k < 1:
        raise ConfigError(f"k must be at least 1, got {k}")
    if not runs:
        raise ConfigError("no runs to plot; list them with `flctl runs`")

    import matplotlib
    matplotlib.use("Agg")   # files only: batch nodes have no display, and Agg needs none

    builders: dict[str, Callable[[], Figure]] = {
        "cdf": lambda: _distribution(runs, Path(records_root), split, "cdf"),
        "cvar": lambda: _distribution(runs, Path(records_root), split, "cvar"),
        "heatmap": lambda: _heatmap(runs),
        "multipliers": lambda: _multipliers(runs, Path(records_root)),
        "top-multipliers": lambda: _top_multipliers(runs, Path(records_root), k),
        "polyfit": lambda: _polyfit(runs),
        "dynamics": lambda: _dynamics(runs, Path(records_root), split),
    }
    with matplotlib.rc_context(STYLE):
        return builders[name]()


def save(fig: Figure, out: Path) -> list[Path]:
    """Write ``out.png`` and ``out.pdf``: both go to hidden temp names first and are renamed into place only
    when both rendered, so a failure leaves no half-written or half-updated figure."""
    if out.suffix in (".png", ".pdf"):   # a full file name given where a stem is expected
        out = out.with_suffix("")
    finals = [out.parent / f"{out.name}.{ext}" for ext in ("png", "pdf")]
    with atomic_path(finals[0]) as png, atomic_path(finals[1]) as pdf:   # renamed only when both rendered
        fig.savefig(png, format="png", dpi=DPI)
        fig.savefig(pdf, format="pdf", dpi=DPI)
    return finals


# ---------------------------------------------------------------- grouping runs into labelled curves

@dataclass(frozen=True)
class Group:
    """Runs that differ only by seed: one curve (median over seeds) or one heatmap panel."""
    label: str
    method: str
    runs: tuple[dict, ...]
    color: tuple[float, float, float, float]

    @property
    def linestyle(self) -> str:
        return method_info(self.method).linestyle


def group_runs(runs: Sequence[dict], ignore: Sequence[str] = ()) -> list[Group]:
    """Group runs by method, ε, α and every other config field (``options.X`` for task options) that takes
    several values among them, except those in ``ignore``; sorted ERM, FL, RFL, CSERM, then by value.

    Labels read like "RFL ε=0.1 α=0.01" plus the varying fields ("lr=1e-3"), so a sweep over a field that
    is not a seed is never silently averaged as if it were seeds."""
    flat = [_flat_config(r["config"]) for r in runs]
    values: dict[str, set[str]] = {}
    for cfg in flat:
        for name, v in cfg.items():
            if name not in NOT_CURVE_KEYS and name not in ignore and v is not None:
                values.setdefault(name, set()).add(fmt(v))
    varying = sorted(name for name, vs in values.items() if len(vs) > 1)

    buckets: dict[tuple, list[dict]] = {}
    for run, cfg in zip(runs, flat):
        key = (run["method"], cfg.get("eps"), cfg.get("alpha"), *(cfg.get(v) for v in varying))
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
        groups.append(Group(" ".join(parts), method, tuple(sorted(buckets[key], key=lambda r: r["seed"])),
                            _shade(method, siblings.index(key), len(siblings))))
    return groups


def _flat_config(config: dict) -> dict[str, Any]:
    flat = {k: v for k, v in config.items() if k != "options"}
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


def _one_task(runs: Sequence[dict], name: str) -> str:
    tasks = sorted({r["task"] for r in runs})
    if len(tasks) > 1:
        raise ConfigError(f"the {name} plot compares runs of one task, got {', '.join(tasks)}; "
                          "select one with --task or --sweep")
    return tasks[0]


def _completed(runs: Sequence[dict], name: str) -> tuple[list[dict], str]:
    """Completed runs (diverged ones have no final records) and a note on how many were left out."""
    done = [r for r in runs if r["status"] == "completed"]
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


def _load_extras(run: dict, needed: Sequence[str]) -> dict[str, np.ndarray] | None:
    path = (run.get("artifacts") or {}).get("extras")
    if not path or not Path(path).is_file():
        return None
    with np.load(path) as data:
        if not all(k in data for k in needed):
            return None
        return {k: data[k] for k in data.files}


# ---------------------------------------------------------------- cdf / cvar (paper Figs. 2, 5, 7, 9, 10)

def _final_losses(records_root: Path, runs: Sequence[dict], split: str | None) -> dict[tuple[str, str], np.ndarray]:
    """{(run_id, split): final per-sample losses}."""
    return final_losses(records_root, [r["id"] for r in runs], [split] if split else list(SPLITS))


def _cvar_curve(losses: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """CVaR(q) = mean loss of the samples at or above the q-quantile, for every q at once (suffix means)."""
    s = np.sort(losses)
    start = np.searchsorted(s, np.quantile(s, qs), side="left")
    suffix_sum = np.concatenate([np.cumsum(s[::-1])[::-1], [0.0]])
    return suffix_sum[start] / (len(s) - start)


def _distribution(runs: list[dict], records_root: Path, split: str | None, kind: str) -> Figure:
    task = _one_task(runs, kind)
    done, note = _completed(runs, kind)
    splits = [split] if split else list(SPLITS)
    losses = _final_losses(records_root, done, split)
    groups = group_runs(done)

    fig = _figure(max(6.0, 5.0 * len(splits)), 3.8)
    axes = fig.subplots(1, len(splits), squeeze=False)[0]
    for ax, sp in zip(axes, splits):
        per_group = [(g, [losses[(r["id"], sp)] for r in g.runs if len(losses.get((r["id"], sp), ())) > 0])
                     for g in groups]
        per_group = [(g, ls) for g, ls in per_group if ls]
        if not per_group:
            raise ConfigError(f"no {sp} records in the selected runs; pass --split to plot the other split")
        (_cdf_panel if kind == "cdf" else _cvar_panel)(ax, per_group)
        ax.set_title(f"{sp.capitalize()} ({len(per_group[0][1][0])} samples)")
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


# ---------------------------------------------------------------- heatmap (paper Figs. 6, 8)

@dataclass
class _Cell:
    values: list[float]
    diverged: int = 0


def _heatmap(runs: list[dict]) -> Figure:
    from matplotlib.colors import LogNorm
    from matplotlib.patches import Rectangle

    runs = [r for r in runs if r["status"] in ("completed", "diverged")]   # queued/running/failed: no value yet
    if not runs:
        raise ConfigError("the heatmap plot needs completed or diverged runs; see `flctl runs`")
    task = _one_task(runs, "heatmap")
    lrs = sorted({float(r["config"]["lr"]) for r in runs})
    duals = sorted({float(r["config"]["dual_lr"]) for r in runs if r["config"].get("dual_lr") is not None})
    if len(lrs) < 2 and len(duals) < 2:
        raise ConfigError("the heatmap plot needs runs that vary lr and dual_lr, e.g. `flctl sweep TASK -m erm,fl "
                          f"--lr 1e-3,1e-2 --dual-lr 1e-3,1e-2`; these runs all use lr={fmt(lrs[0])}")
    panels = []
    for g in group_runs(runs, ignore=("lr", "dual_lr")):
        duals_here = sorted({float(r["config"]["dual_lr"]) for r in g.runs if r["config"].get("dual_lr") is not None})
        rows: list[float | None] = list(duals_here) or [None]   # ERM and CSERM have no dual lr: a single row
        cells = {(i, j): _Cell([]) for i in range(len(rows)) for j in range(len(lrs))}
        for r in g.runs:
            dual = r["config"].get("dual_lr")
            cell = cells[(rows.index(None if dual is None else float(dual)), lrs.index(float(r["config"]["lr"])))]
            loss = (r.get("metrics") or {}).get("train.avg_loss")
            if r["status"] == "diverged" or (loss is not None and not math.isfinite(loss)):
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
                text = f"{np.mean(c.values):.3g}" + (f"\n+{c.diverged} div." if c.diverged else "")
                ax.text(j, i, text, ha="center", va="center", fontsize=7, color=_ink(rgba))
            elif c.diverged:   # grey: every seed of this configuration diverged
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, color="0.7", lw=0))
                ax.text(j, i, f"diverged\n×{c.diverged}", ha="center", va="center", fontsize=7, color="0.15")
        ax.set_xticks(range(len(lrs)), [fmt(v) for v in lrs])
        ax.set_yticks(range(len(rows)), [fmt(v) for v in rows] if rows[0] is not None else [""])
        ax.set_xlabel("primal lr")
        ax.set_ylabel("dual lr" if rows[0] is not None else "(no dual lr)")
        ax.set_title(_with_seeds(g.label, max(len(c.values) + c.diverged for c in cells.values())))
        ax.grid(False)
        ax.spines[:].set_visible(False)
    assert image is not None                 # at least one panel
    bar = fig.colorbar(image, ax=list(axes), label="final train avg loss (log scale)", shrink=0.9)
    # Plain numbers on the log colour bar; under a decade only minor ticks exist, and matplotlib would label
    # them "6×10⁻¹". Over several decades the minor ticks stay unlabelled (they would crowd the bar).
    bar.ax.yaxis.set_major_formatter(lambda v, _: f"{v:.2g}")
    if vmax / vmin < 10:
        bar.ax.yaxis.set_minor_formatter(lambda v, _: f"{v:.2g}")
    fig.suptitle(f"{task}: final average train loss, mean over seeds (grey: diverged)")
    return fig


def _cmap(name: str):
    import matplotlib

    return matplotlib.colormaps[name].with_extremes(bad="white")   # configurations not run stay blank


def _ink(rgba: Sequence[float]) -> str:
    """Black text on light cells, white on dark ones (perceived luminance)."""
    r, g, b = rgba[:3]
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"


# ---------------------------------------------------------------- two-moons multipliers (paper Fig. 3)

GRID_KEYS = ("grid_x", "grid_y", "grid_prob1", "train_x", "train_y")


def _multipliers(runs: list[dict], records_root: Path) -> Figure:
    candidates = [r for r in runs if method_info(r["method"]).has_multipliers and r["status"] == "completed"]
    with_grid = [(r, e) for r in candidates if (e := _load_extras(r, GRID_KEYS)) is not None]
    if not with_grid:
        raise ConfigError("the multipliers plot needs completed two-moons fl/rfl runs with extras (decision grid), "
                          "e.g. `flctl sweep two-moons -m fl,rfl`; select them with --task two-moons")
    extras = {r["id"]: e for r, e in with_grid}
    chosen = _one_seed_per_group([r for r, _ in with_grid], limit=4)
    table = final_records(records_root, [r["id"] for r in chosen], ["run_id", "sample_id", "multiplier"],
                          split="train")

    cols = 1 if len(chosen) == 1 else 2   # two-moons panels are wide: 1, 2 or a 2x2 grid
    rows = math.ceil(len(chosen) / cols)
    fig = _figure(4.6 * cols + 0.9, 3.2 * rows + 0.9)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    contours = None
    labels = {r["id"]: g.label for g in group_runs(candidates) for r in g.runs}
    for ax, run in zip(axes, chosen):
        e = extras[run["id"]]
        lam = _aligned_multipliers(table, run["id"], len(e["train_x"]))
        contours = ax.contourf(e["grid_x"], e["grid_y"], e["grid_prob1"], levels=np.linspace(0, 1, 11),
                               cmap="RdBu_r", alpha=0.35)
        ax.contour(e["grid_x"], e["grid_y"], e["grid_prob1"], levels=[0.5], colors="k", linewidths=1.2)
        _multiplier_scatter(ax, e["train_x"], e["train_y"], lam)
        ax.set_title(f"{labels[run['id']]}, seed {run['seed']} (max λ = {np.nanmax(lam):.2g})")
        ax.set_xlabel("$x_1$")
        ax.set_ylabel("$x_2$")
        ax.grid(False)
        ax.set_aspect("equal")
    for ax in axes[len(chosen):]:
        ax.set_visible(False)
    assert contours is not None
    fig.colorbar(contours, ax=list(axes), label="predicted P(class 1)", shrink=0.8)
    fig.legend(handles=_multiplier_legend(), loc="outside lower center", ncols=5, frameon=False)
    fig.suptitle(f"{chosen[0]['task']}: final multipliers (marker area ∝ λ / max λ of the panel) over the "
                 "predicted probabilities")
    return fig


def _one_seed_per_group(runs: list[dict], limit: int) -> list[dict]:
    """Round-robin over the groups (lowest seed first): one run of each method/config before a second seed."""
    groups = [list(g.runs) for g in group_runs(runs)]
    picked: list[dict] = []
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


# ---------------------------------------------------------------- top multipliers (paper Fig. 4)

def _top_multipliers(runs: list[dict], records_root: Path, k: int) -> Figure:
    run = next((r for r in runs if method_info(r["method"]).has_multipliers and r["status"] == "completed"), None)
    if run is None:
        raise ConfigError("the top-multipliers plot needs a completed fl or rfl run; select one with --task or "
                          "--sweep (e.g. `flctl run digits -m fl`)")
    table = final_records(records_root, [run["id"]], ["sample_id", "loss", "multiplier", "prediction", "target"],
                          split="train")
    lam = table["multiplier"].to_numpy(zero_copy_only=False).astype(np.float64)
    if np.isnan(lam).all():
        raise ConfigError(f"run {run['id']} recorded no multipliers")
    order = np.argsort(-np.nan_to_num(lam, nan=-np.inf), kind="stable")[:k]
    top = {c: table[c].to_numpy(zero_copy_only=False)[order] for c in table.column_names}
    label = group_runs([run])[0].label
    title = f"{run['task']}: top-{len(order)} final multipliers, {label} (run {run['id'][:8]}, train split)"
    images = _task_images(run, top) if run["task"] in IMAGE_TASKS else None
    if images is None:
        note = (f" — no image loader for {run['task']}: table" if run["task"] in IMAGE_TASKS else "")
        return _top_table(top, title + note)
    return _top_images(top, images, title)


def _task_images(run: dict, top: dict[str, np.ndarray]) -> np.ndarray | None:
    """The top samples' images, re-created without torch; None for tasks whose data we cannot read here."""
    if run["task"] == "utkface":
        return _utkface_images(run, top)
    if run["task"] != "digits":
        return None
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    # Same stratified, seeded split as tasks/digits.py, so sample id i is the i-th training image there.
    opts = run["config"].get("options") or {}
    digits = load_digits()
    x_tr, _, y_tr, _ = train_test_split(digits.images, digits.target, test_size=opts.get("test_size", 0.25),
                                        stratify=digits.target, random_state=opts.get("data_seed", 0))
    ids = top["sample_id"].astype(int)
    if ids.max() >= len(x_tr) or not np.array_equal(y_tr[ids], top["target"].astype(int)):
        raise ConfigError(f"run {run['id']}: its records do not match the digits split re-created from its "
                          "options (test_size, data_seed); was tasks/digits.py changed since it ran?")
    return x_tr[ids]


def _utkface_images(run: dict, top: dict[str, np.ndarray]) -> np.ndarray | None:
    """The faces, read by file name from the run's extras (tasks/utkface.py saves names by sample id)."""
    from PIL import Image

    extras = _load_extras(run, ("train_names", "folder"))
    if extras is None:
        return None
    folder = Path(str(extras["folder"]))
    names = extras["train_names"][top["sample_id"].astype(int)]
    try:
        return np.stack([np.asarray(Image.open(folder / str(n)).convert("RGB").resize((64, 64))) for n in names])
    except OSError as exc:
        raise ConfigError(f"cannot read the UTKFace images of run {run['id']} from {folder}: {exc}") from None


def _value(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:.2g}"


def _top_images(top: dict[str, np.ndarray], images: np.ndarray, title: str) -> Figure:
    n = len(images)
    cols = min(n, max(4, math.ceil(math.sqrt(n))))
    rows = math.ceil(n / cols)
    fig = _figure(1.75 * cols, 1.95 * rows + 0.5)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for i, ax in enumerate(axes):
        ax.axis("off")
        if i >= n:
            continue
        ax.imshow(images[i], cmap="gray_r", interpolation="nearest")
        wrong = int(top["prediction"][i]) != int(top["target"][i]) and float(top["target"][i]).is_integer()
        ax.set_title(f"#{int(top['sample_id'][i])}  y={_value(top['target'][i])}  ŷ={_value(top['prediction'][i])}\n"
                     f"loss={top['loss'][i]:.2g}  λ={top['multiplier'][i]:.2g}", fontsize=7,
                     color="tab:red" if wrong else "black")
    labels = all(float(t).is_integer() for t in top["target"])        # class labels, not regression targets
    fig.suptitle(title + ("\n(red title: misclassified)" if labels else ""), fontsize=9)
    return fig


def _top_table(top: dict[str, np.ndarray], title: str) -> Figure:
    n = len(top["sample_id"])
    fig = _figure(6.4, 0.7 + 0.22 * (n + 1))
    ax = fig.subplots()
    ax.axis("off")
    header = ["rank", "sample id", "target", "prediction", "loss", "multiplier λ"]
    body = [[str(i + 1), str(int(top["sample_id"][i]))] + [f"{top[c][i]:.4g}" for c in
                                                            ("target", "prediction", "loss", "multiplier")]
            for i in range(n)]
    from matplotlib.transforms import Bbox

    table = ax.table(cellText=body, colLabels=header, bbox=Bbox.from_bounds(0, 0, 1, 1), cellLoc="right",
                     colLoc="right")
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    for (row, _), cell in table.get_celld().items():
        cell.set_edgecolor("0.85")
        if row == 0:
            cell.set_text_props(weight="bold")
            cell.set_facecolor("0.93")
    ax.set_title(title, fontsize=9)
    return fig


# ---------------------------------------------------------------- polynomial fits (paper Fig. 1)

CURVE_KEYS = ("curve_x", "curve_y", "truth_y", "train_x", "train_y")


def _polyfit(runs: list[dict]) -> Figure:
    fits = [(r, e) for r in runs if r["task"] == "polyfit" and r["status"] == "completed"
            and (e := _load_extras(r, CURVE_KEYS)) is not None]
    if not fits:
        raise ConfigError("the polyfit plot needs completed polyfit runs with extras, e.g. "
                          "`flctl sweep polyfit -m erm,fl -o degree=10,20,30`; select them with --task polyfit")
    extras = {r["id"]: e for r, e in fits}
    degrees = sorted({(r["config"].get("options") or {}).get("degree") for r, _ in fits}, key=_sortable)

    fig = _figure(4.0 * len(degrees), 3.5)
    axes = fig.subplots(1, len(degrees), squeeze=False, sharey=True)[0]
    for ax, degree in zip(axes, degrees):
        panel = [r for r, _ in fits if (r["config"].get("options") or {}).get("degree") == degree]
        first = extras[panel[0]["id"]]
        ax.plot(first["curve_x"], first["truth_y"], "k--", lw=1.2, label="ground truth cos(πx)")
        for g in group_runs(panel, ignore=("options.degree",)):
            e = extras[g.runs[0]["id"]]   # seeds do not change a convex solve: one curve per config
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


# ---------------------------------------------------------------- training dynamics

def _dynamics(runs: list[dict], records_root: Path, split: str | None) -> Figure:
    import pyarrow.compute as pc
    from matplotlib.ticker import MaxNLocator

    task = _one_task(runs, "dynamics")
    done, note = _completed(runs, "dynamics")
    split = split or "train"
    table = all_epochs(records_root, [r["id"] for r in done], ["run_id", "split", "epoch", "loss", "multiplier"])
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

    fig = _figure(12.0, 3.6)
    axes = fig.subplots(1, 3)
    panels = (("loss_mean", f"average {split} loss"), ("loss_max", f"max {split} loss"),
              ("multiplier_max", "max multiplier λ"))
    groups = group_runs(done)
    epochs = sorted({e for d in series["loss_mean"].values() for e in d})
    for ax, (column, ylabel) in zip(axes, panels):
        drawn = [_mean_over_seeds(ax, g, series[column]) for g in groups]
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))   # epochs are whole numbers
        if len(epochs) == 1:   # a single eval epoch would get a ±0.1 axis of fractional epochs
            ax.set_xlim(epochs[0] - 1, epochs[0] + 1)
        ax.set_xlabel("epoch")
        ax.set_ylabel(ylabel)
        ax.set_title(ylabel[0].upper() + ylabel[1:])
        if not any(drawn):
            ax.text(0.5, 0.5, "no multipliers\n(ERM/CSERM runs only)", ha="center", va="center",
                    transform=ax.transAxes, color="0.4")
        elif _spans_decades(np.array([v for d in series[column].values() for v in d.values()])):
            ax.set_yscale("log")
    _figure_legend(fig, axes[0], "mean over seeds" if any(len(g.runs) > 1 for g in groups) else None)
    fig.suptitle(f"{task}: training dynamics at eval epochs{note}")
    return fig


def _by_run_epoch(stats, column: str) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for run_id, epoch, value in zip(stats["run_id"].to_pylist(), stats["epoch"].to_pylist(),
                                    stats[column].to_pylist()):
        if value is not None and math.isfinite(value):
            out.setdefault(run_id, {})[int(epoch)] = float(value)
    return out


def _mean_over_seeds(ax: Axes, group: Group, values: dict[str, dict[int, float]]) -> bool:
    """Plot the seeds' mean at each eval epoch (seeds missing an epoch are left out there); False if empty."""
    per_run = [values[r["id"]] for r in group.runs if values.get(r["id"])]
    if not per_run:
        return False
    epochs = sorted({e for d in per_run for e in d})
    mean = [np.mean([d[e] for d in per_run if e in d]) for e in epochs]
    ax.plot(epochs, mean, marker="o", ms=3, lw=1.5, ls=group.linestyle, color=group.color,
            label=_with_seeds(group.label, len(per_run)))
    return True
