"""What every figure shares: style, grouping runs into labelled curves, small helpers."""

from __future__ import annotations

import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from flctl.errors import ConfigError
from flctl.method_info import method_info
from flctl.report.groups_of_runs import curve_labels, distinct_texts, group_by_config
from flctl.status import Status

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from flctl.db import RunRecord

DPI = 150
STYLE: dict[Any, Any] = {"axes.spines.top": False, "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.3,
         "font.size": 9, "axes.titlesize": 10, "legend.fontsize": 8, "legend.framealpha": 0.9,
         "savefig.dpi": DPI}
BAND = "median over seeds; band: min–max"



# ---------------------------------------------------------------- grouping runs into labelled curves

@dataclass(frozen=True)
class Group:
    """Runs that differ only by seed: one curve (median over seeds) or one heatmap panel, drawn in its own
    colour and line style (no two groups of one figure share both)."""
    label: str
    method: str
    runs: tuple[RunRecord, ...]
    color: tuple[float, float, float, float]
    linestyle: str = "-"


def group_runs(runs: Sequence[RunRecord], ignore: Sequence[str] = ()) -> list[Group]:
    """The runs as the tables group them (flctl.report.groups_of_runs: method, ε, α and every other config field
    that takes several values among them, except those in ``ignore``), in the tables' row order.

    Labels read like "RFL ε=0.1 α=0.01" plus the varying fields ("lr=1e-3"), so a sweep over a field that
    is not a seed is never silently averaged as if it were seeds."""
    groups = group_by_config(runs, ignore)
    keys = sorted(groups, key=lambda k: k.sort_key())
    labels = curve_labels(keys)
    styles = curve_styles([k.method for k in keys])
    return [Group(labels[k], k.method, tuple(sorted(groups[k], key=lambda r: r.seed)), color, linestyle)
            for k, (color, linestyle) in zip(keys, styles)]


# A qualitative palette: ten hues told apart at a glance (and by most colour-blind readers), then, past ten
# curves, the same hues again in the next line style, so up to 40 curves never share both colour and style.
PALETTE = "tab10"
LINESTYLES = ("-", "--", ":", "-.")


def curve_styles(methods: Sequence[str]) -> list[tuple[tuple[float, float, float, float], str]]:
    """A (colour, line style) per curve, in order; ``methods`` names each curve's method.

    One curve per method (the paper's comparisons): each method keeps its own colour and line style, so a
    method looks the same in every such figure. Several curves of one method (a sweep): the i-th curve gets
    hue i mod 10 of the qualitative palette and line style i // 10, so no two curves share both."""
    import matplotlib

    if len(set(methods)) == len(methods):
        return [(matplotlib.colormaps[method_info(m).cmap](0.75), method_info(m).linestyle) for m in methods]
    colors = matplotlib.colormaps[PALETTE].colors  # type: ignore[attr-defined]  # a ListedColormap
    return [((*colors[i % len(colors)], 1.0), LINESTYLES[(i // len(colors)) % len(LINESTYLES)])
            for i in range(len(methods))]


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
    done = [r for r in runs if r.status == Status.COMPLETED]
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
    """One legend for all panels, below them (see ``legend_below``), from the curves of ``ax``.

    What every entry says alike moves into the legend's title, once: the leading words ("FL ε=0.1" when only
    the lrs vary) and the seed count when all have the same ("(3 seeds)"), so 20 entries stay short."""
    handles, labels = ax.get_legend_handles_labels()
    common, labels = _common_words(labels)
    heading = "; ".join(part for part in (common, title) if part)
    legend_below(fig, handles, labels, heading or None)


def _common_words(labels: Sequence[str]) -> tuple[str, list[str]]:
    """The words all ``labels`` share at their start and a seed count they share at their end, and the labels
    without them; nothing is taken when a label would be left empty, or there is a single label."""
    if len(labels) < 2:
        return "", list(labels)
    words = [label.split(" ") for label in labels]
    # Each label's own seed count ("(2", "seeds)") is set aside first, so that it is never the only word left.
    tails = [w[-2:] if len(w) > 2 and w[-2].startswith("(") and w[-1].startswith("seed") else [] for w in words]
    body = [w[:len(w) - len(t)] for w, t in zip(words, tails)]
    lead = 0
    while all(len(w) > lead + 1 and w[lead] == body[0][lead] for w in body):
        lead += 1
    common = " ".join(body[0][:lead])
    shared = tails[0] if tails[0] and all(t == tails[0] for t in tails) else None
    if shared:   # "(2 seeds)" -> "2 seeds each"
        common = (common + ", " if common else "") + " ".join(shared).strip("()") + " each"
        return common, [" ".join(w[lead:]) for w in body]
    return common, [" ".join(w[lead:] + t) for w, t in zip(body, tails)]


def legend_below(fig: Figure, handles: Sequence, labels: Sequence[str], title: str | None = None):
    """A legend in a band of its own under all panels, that never hides a curve however many entries it has.

    It takes as many columns as fit the figure's width, and the figure grows by the legend's height, so the
    panels keep their size and constrained layout always has room (a legend taller than the figure would
    otherwise squash the panels, or be drawn over them with "constrained_layout not applied")."""
    if not labels:
        return None
    renderer = _renderer(fig)
    kwargs: dict[str, Any] = dict(loc="outside lower center", frameon=False)
    probe = fig.legend(list(handles), list(labels), ncols=1, **kwargs)
    # Widest entry (with its line sample and the gap to the next column): an untitled one-column legend's width.
    entry = probe.get_window_extent(renderer).width / fig.dpi
    probe.remove()
    ncols = max(1, min(len(labels), int((fig.get_figwidth() - 0.3) // max(entry, 0.5))))
    legend = fig.legend(list(handles), list(labels), ncols=ncols, title=title, title_fontsize=7, **kwargs)
    fig.set_figheight(fig.get_figheight() + legend.get_window_extent(renderer).height / fig.dpi + 0.1)
    return legend


def _renderer(fig: Figure):
    """A renderer to measure text with; a bare Figure gets an Agg canvas (what savefig uses for PNGs)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if not hasattr(fig.canvas, "get_renderer"):
        FigureCanvasAgg(fig)
    return fig.canvas.get_renderer()  # type: ignore[attr-defined]  # Agg and the interactive canvases have it


def wrap(text: str, width_in: float, fontsize: float) -> str:
    """``text`` broken at spaces into lines that fit ``width_in`` inches at ``fontsize`` points (titles
    that would otherwise run past the figure's edge, where savefig cuts them)."""
    import textwrap

    chars = max(12, int(width_in * 72 / (0.6 * fontsize)))   # DejaVu Sans averages about 0.6 em per character
    return "\n".join(textwrap.fill(line, chars, break_long_words=False, break_on_hyphens=False)
                     for line in text.split("\n"))


def tick_labels(values: Sequence[float | None]) -> list[str]:
    """One format for all the ticks of an axis (``distinct_texts``, compact): plain ``%.3g`` when every value
    reads so without an exponent (0.01 to 999), else compact scientific for all (1e-3, 3.2e-3, 1e-2), never a mix
    of 0.0316 and 3.2e-3; counts (batch sizes, epochs) with every digit; None (no value) blank."""
    texts = distinct_texts([v for v in values if v is not None], compact=True)
    return ["" if v is None else texts[v] for v in values]


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
    try:
        with np.load(path, allow_pickle=False) as data:     # never unpickle a file from the results folder
            if not all(k in data for k in needed):
                return None
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        from flctl.errors import ConfigError

        raise ConfigError(f"{path} is not a run's extras file ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else 'unreadable'}); move it aside") from None


def _cmap(name: str):
    import matplotlib

    return matplotlib.colormaps[name].with_extremes(bad="white")   # configurations not run stay blank


def _ink(rgba: Sequence[float]) -> str:
    """Black text on light cells, white on dark ones (perceived luminance)."""
    r, g, b = rgba[:3]
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"
