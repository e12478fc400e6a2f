"""Figures stay readable with many configurations: 20 FL runs of a primal x dual lr grid, made by a real sweep.

The legend sits outside every panel, no two curves share both colour and line style, titles and labels do not
run into each other or past the figure's edge, matplotlib warns of nothing (e.g. "constrained_layout not
applied"), a heatmap axis has one tick format, and the reliability diagonal is drawn over the bars."""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text
from typer.testing import CliRunner

from flctl.cli import app
from flctl.db import Store
from flctl.report.data import select_runs
from flctl.report.plots import figure

# Slow (pyproject.toml's markers; `pytest -m "not slow"` is the fast loop): a 20-run sweep, then its figures: 14 s
# of the suite's 904 s of test time (2 cores, xdist -n 2).
pytestmark = pytest.mark.slow

runner = CliRunner()
GRID = ["sweep", "two-moons", "-m", "fl", "--lr", "1e-4..1e-2:5", "--dual-lr", "1e-3..1e-1:4", "--epochs", "2",
        "--eval-every", "1", "--executor", "debug"]


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory) -> tuple[list, Path]:
    """The 20 runs of GRID (one seed each: 20 curves) and their records folder."""
    root = tmp_path_factory.mktemp("readable") / "results"
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("FLCTL_DB", raising=False)
        mp.setenv("FLCTL_RESULTS", str(root))
        result = runner.invoke(app, GRID)
        assert result.exit_code == 0, result.output
    store = Store.open(f"sqlite:///{root / 'flctl.db'}", readonly=True)
    try:
        runs = select_runs(store, task="two-moons")
    finally:
        store.close()
    assert len(runs) == 20
    return runs, root / "records"


def drawn(name: str, runs: list, records: Path, **kwargs) -> Figure:
    """The figure, drawn (so that extents are final), with any matplotlib warning an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = figure(name, runs, records, **kwargs)
        FigureCanvasAgg(fig).draw()
    return fig


def panels(fig: Figure) -> list:
    return [ax for ax in fig.axes if ax.get_visible() and ax.get_label() != "<colorbar>"]


def texts(fig: Figure) -> list[Text]:
    """Every title and axis label with text: the figure's, and each visible panel's."""
    out = [fig._suptitle] if fig._suptitle is not None else []
    for ax in panels(fig):
        out += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label]
    return [t for t in out if t.get_visible() and t.get_text()]


def assert_readable(fig: Figure) -> None:
    renderer = fig.canvas.get_renderer()
    page = fig.bbox
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts(fig)]
    for text, box in boxes:   # nothing cut off at the figure's edge
        assert page.x0 - 1 <= box.x0 and box.x1 <= page.x1 + 1 and page.y0 - 1 <= box.y0 and box.y1 <= page.y1 + 1, text
    for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2):
        assert not box_a.overlaps(box_b), f"{a!r} runs into {b!r}"
    for legend in fig.legends:
        box = legend.get_window_extent(renderer)
        assert page.x0 - 1 <= box.x0 and box.x1 <= page.x1 + 1 and page.y0 - 1 <= box.y0, "legend past the edge"
        for ax in panels(fig):
            assert not box.overlaps(ax.get_tightbbox(renderer)), f"the legend covers panel {ax.get_title()!r}"
        for text, tbox in boxes:
            assert not box.overlaps(tbox), f"the legend covers {text!r}"


def assert_distinct_curves(fig: Figure) -> None:
    for ax in panels(fig):
        styles = [(line.get_color() if isinstance(line.get_color(), str) else tuple(line.get_color()),
                   line.get_linestyle()) for line in ax.get_lines() if not line.get_label().startswith("_")]
        assert len(set(styles)) == len(styles), f"two curves look alike in {ax.get_title()!r}"


@pytest.mark.parametrize(("name", "kwargs"), [("cdf", {}), ("cdf", {"split": "train"}), ("cvar", {}),
                                              ("dynamics", {})])
def test_twenty_curves_read_well(grid: tuple[list, Path], name: str, kwargs: dict) -> None:
    runs, records = grid
    fig = drawn(name, runs, records, **kwargs)
    assert len(fig.legends) == 1 and len(fig.legends[0].get_texts()) == 20
    assert max(len(ax.get_lines()) for ax in panels(fig)) == 20
    assert_distinct_curves(fig)
    assert_readable(fig)
    # What all 20 share is said once, in the legend's title; the entries name only what differs.
    assert fig.legends[0].get_title().get_text().startswith("FL ε=0.1, 1 seed each")
    assert all(t.get_text().startswith("dual_lr=") for t in fig.legends[0].get_texts())


def test_dynamics_titles_and_y_labels_do_not_repeat_or_collide(grid: tuple[list, Path]) -> None:
    runs, records = grid
    fig = drawn("dynamics", runs, records)
    for ax in panels(fig):
        assert ax.get_ylabel().lower() not in ax.get_title().lower() or len(ax.get_ylabel()) < 8
    assert_readable(fig)


def test_reliability_grid_and_diagonal_over_the_bars(grid: tuple[list, Path]) -> None:
    runs, records = grid
    fig = drawn("reliability", runs, records)
    axes = panels(fig)
    assert len(axes) == 20 and fig.get_figwidth() < 15            # 4 panels a row, not a 65-inch strip
    for ax in axes:
        (diagonal,) = ax.get_lines()
        assert ax.patches and diagonal.get_zorder() > max(p.get_zorder() for p in ax.patches)
    assert_readable(fig)


def test_heatmap_ticks_share_one_format(grid: tuple[list, Path]) -> None:
    runs, records = grid
    fig = drawn("heatmap", runs, records)
    (ax,) = panels(fig)
    for axis in (ax.xaxis, ax.yaxis):
        labels = [t.get_text() for t in axis.get_ticklabels()]
        assert len(labels) >= 4
        assert len({"e" in label for label in labels}) == 1, labels   # never 0.0215 beside 4.6e-3
    assert [t.get_text() for t in ax.xaxis.get_ticklabels()] == ["1e-4", "3.2e-4", "1e-3", "3.2e-3", "1e-2"]
    assert [t.get_text() for t in ax.yaxis.get_ticklabels()] == ["1e-3", "4.6e-3", "2.2e-2", "1e-1"]
    assert_readable(fig)


def test_top_multipliers_table_title_is_not_cut_off(grid: tuple[list, Path]) -> None:
    runs, records = grid
    fig = drawn("top-multipliers", runs, records)
    (ax,) = panels(fig)
    assert ax.tables                                              # two-moons saves no images: the table
    assert "no training images" in fig._suptitle.get_text()
    assert_readable(fig)
    title = fig._suptitle.get_window_extent(fig.canvas.get_renderer())
    assert not title.overlaps(ax.tables[0].get_window_extent(fig.canvas.get_renderer()))


@pytest.mark.notorch
def test_curve_styles_never_repeat() -> None:
    from flctl.report.plots.common import curve_styles

    for n in range(2, 41):
        styles = curve_styles(["fl"] * n)
        assert len({(tuple(c), ls) for c, ls in styles}) == n
    # Past ten curves the hues come again, in the next line style.
    assert curve_styles(["fl"] * 11)[10] == (curve_styles(["fl"] * 11)[0][0], "--")
    # One curve per method: each method keeps its own look.
    erm, fl = curve_styles(["erm", "fl"])
    assert erm != fl and curve_styles(["fl", "rfl"])[0] == fl


@pytest.mark.parametrize(("values", "want"), [
    ([1e-3, 0.00464, 0.02154, 0.1], ["1e-3", "4.6e-3", "2.2e-2", "1e-1"]),
    ([0.01, 0.0316, 0.1], ["0.01", "0.0316", "0.1"]),
    ([0.5, 1.0, 5.0], ["0.5", "1", "5"]),
    ([16, 1024], ["16", "1024"]),
    ([0.00996, 0.1], ["1e-2", "1e-1"]),
])
@pytest.mark.notorch
def test_tick_labels_one_format(values: list[float], want: list[str]) -> None:
    from flctl.report.plots.common import tick_labels

    assert tick_labels(values) == want


def test_a_narrow_heatmaps_title_wraps_inside_the_figure(grid: tuple[list, Path]) -> None:
    runs, records = grid
    narrow = [r for r in runs if r.config["lr"] < 5e-4]          # two primal lrs: a figure narrower than its title
    fig = drawn("heatmap", narrow, records)
    assert len(panels(fig)[0].get_xticklabels()) == 2
    assert "\n" in fig._suptitle.get_text()
    assert_readable(fig)
