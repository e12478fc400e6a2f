"""The paper's figures from finished runs: loss CDF/CVaR, lr heatmaps, two-moons multipliers, top multipliers,
polynomial fits, training dynamics and reliability diagrams.

``plot(name, runs, records_root, out)`` draws one figure and writes ``out.png`` and ``out.pdf`` atomically;
``figure(...)`` returns it unwritten. One module per figure; what they share is in ``common``. Per-sample data
comes only through ``flctl.report.data`` (final records, all epochs) and the runs' extras, under the keys
docs/design.md lists: no figure names a task. matplotlib is imported inside functions so that ``flctl --help``
stays fast; torch is never imported (reports run where no training stack is installed).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from flctl.errors import ConfigError
from flctl.fs import atomic_path
from flctl.metrics import SPLITS
from flctl.report.plot_specs import PLOT_SPECS, plot_spec
from flctl.report.plots.common import DPI, STYLE
from flctl.report.plots.distribution import _cvar_curve
from flctl.report.plots.top import _extras_images

PLOTS = tuple(PLOT_SPECS)
__all__ = ["PLOTS", "figure", "plot", "save", "_cvar_curve", "_extras_images"]

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from flctl.db import RunRecord


def plot(name: str, runs: list[RunRecord], records_root: Path, out: Path, *, split: str | None = None,
         k: int = 16) -> list[Path]:
    """Draw the named figure from ``runs`` and write ``out.png`` and ``out.pdf``; returns both paths.

    Raises ConfigError (one line) for an unknown name, a bad split or k, or runs the figure cannot use."""
    import matplotlib

    with matplotlib.rc_context(STYLE):
        return save(figure(name, runs, records_root, split=split, k=k), Path(out))


def figure(name: str, runs: list[RunRecord], records_root: Path, *, split: str | None = None, k: int = 16) -> Figure:
    """The named figure, not yet written (see ``plot``): drawn by its entry in flctl.report.plot_specs."""
    spec = plot_spec(name)
    if split not in (None, *SPLITS):
        raise ConfigError(f"split must be train or test, got {split!r}")
    if k < 1:
        raise ConfigError(f"k must be at least 1, got {k}")
    if not runs:
        raise ConfigError("no runs to plot; list them with `flctl runs`")

    import matplotlib
    matplotlib.use("Agg")   # files only: batch nodes have no display, and Agg needs none

    with matplotlib.rc_context(STYLE):
        return spec.draw(runs, Path(records_root), split, k)


def save(fig: Figure, out: Path) -> list[Path]:
    """Write ``out.png`` and ``out.pdf``: both go to hidden temp names first and are renamed into place only
    when both rendered, so a failure leaves no half-written or half-updated figure."""
    if out.suffix in (".png", ".pdf"):   # a full file name given where a stem is expected
        out = out.with_suffix("")
    finals = [out.parent / f"{out.name}.{ext}" for ext in ("png", "pdf")]
    with atomic_path(finals[0]) as png, atomic_path(finals[1]) as pdf:   # renamed only when both rendered
        fig.savefig(png, format="png", dpi=DPI)
        # The layout the PNG was drawn with, kept for the PDF: both files alike, and the PDF's draw does not
        # solve the constrained layout again (a figure's two files 15% faster; matplotlib's way to freeze one).
        fig.set_layout_engine("none")
        fig.savefig(pdf, format="pdf", dpi=DPI)
    return finals
