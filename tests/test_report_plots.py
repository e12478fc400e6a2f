"""Report figures: every plot renders a real PNG and PDF from runs made by real flctl commands; runs a figure
cannot use, unknown names and failures mid-write raise without leaving files behind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from matplotlib.figure import Figure
from typer.testing import CliRunner

from flctl.cli import app
from flctl.db import Store
from flctl.errors import ConfigError
from flctl.report.data import select_runs
from flctl.report.plots import PLOTS, figure, plot

# Slow (pyproject.toml's markers; `pytest -m "not slow"` is the fast loop): runs made by real flctl commands, then
# every plot drawn as PNG and PDF: 48 s of the suite's 904 s of test time (2 cores, xdist -n 2).
pytestmark = pytest.mark.slow

runner = CliRunner()
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

COMMANDS = [
    # Three methods over two seeds: curves with min–max bands, two-moons decision grids in the extras.
    ["sweep", "two-moons", "-m", "erm,fl,rfl", "--eps", "0.1", "--alpha", "0.1", "--seeds", "2", "--epochs", "6",
     "--eval-every", "3", "--executor", "debug"],
    # A primal × dual lr grid on plain SGD; lr = 1e3 overflows within the first epoch: grey heatmap cells.
    ["sweep", "diabetes", "-m", "erm,fl", "--optimizer", "sgd", "--lr", "1e-2,1e3", "--dual-lr", "1e-2,1e-1",
     "--epochs", "2", "--executor", "debug"],
    ["sweep", "polyfit", "-m", "erm,fl", "-o", "degree=10,20", "--executor", "debug"],
    ["run", "digits", "-m", "fl", "--epochs", "1"],
]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The runs of COMMANDS, made once for the module in their own results directory."""
    root = tmp_path_factory.mktemp("report-plots") / "results"
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("FLCTL_DB", raising=False)
        mp.setenv("FLCTL_RESULTS", str(root))
        for args in COMMANDS:
            result = runner.invoke(app, args)
            assert result.exit_code == 0, result.output
    return root


def runs_of(root: Path, task: str) -> list[dict]:
    store = Store.open(f"sqlite:///{root / 'flctl.db'}")
    try:
        return select_runs(store, task=task)
    finally:
        store.close()


def assert_figure_files(paths: list[Path], out: Path) -> None:
    assert paths == [out.parent / f"{out.name}.png", out.parent / f"{out.name}.pdf"]
    png, pdf = (p.read_bytes() for p in paths)
    assert png.startswith(PNG_SIGNATURE) and len(png) > 5_000
    assert pdf.startswith(b"%PDF") and len(pdf) > 1_000
    assert sorted(p.name for p in out.parent.iterdir()) == sorted(p.name for p in paths)   # no temp files left


CASES = [
    ("cdf", "two-moons", {}),
    ("cdf", "diabetes", {"split": "train"}),          # diverged runs are left out, not read
    ("cvar", "two-moons", {}),
    ("cvar", "polyfit", {"split": "test"}),
    ("heatmap", "diabetes", {}),
    ("multipliers", "two-moons", {}),
    ("top-multipliers", "digits", {"k": 6}),          # the digits' own images, from the run's extras
    ("top-multipliers", "two-moons", {}),             # no images in its extras: a table
    ("polyfit", "polyfit", {}),
    ("dynamics", "two-moons", {}),
    ("reliability", "two-moons", {}),
    ("reliability", "digits", {"split": "train"}),
]


def test_cases_cover_every_plot() -> None:
    assert {name for name, _, _ in CASES} == set(PLOTS)


@pytest.mark.parametrize(("name", "task", "kwargs"), CASES, ids=[f"{n}-{t}" for n, t, _ in CASES])
def test_plot_writes_png_and_pdf(made: Path, tmp_path: Path, name: str, task: str, kwargs: dict) -> None:
    out = tmp_path / "reports" / name
    paths = plot(name, runs_of(made, task), made / "records", out, **kwargs)
    assert_figure_files(paths, out)


# What each figure draws, read off the returned Figure: legend labels, lines per panel, axis scales, images, tables.
# What all entries share (here the seed count) is said once, in the legend's title: "2 seeds each".
THREE = ["ERM", "FL ε=0.1", "RFL ε=0.1 α=0.1"]
EXPECTED = {
    "cdf-two-moons": dict(labels=THREE, lines=[3, 3]),
    "cdf-diabetes": dict(labels=["ERM", "FL ε=0.25 dual_lr=0.01", "FL ε=0.25 dual_lr=0.1"],
                         lines=[3], xscale=["log"]),              # losses over more than two decades
    "cvar-two-moons": dict(labels=THREE, lines=[3, 3]),
    "cvar-polyfit": dict(lines=[4], yscale=["log"]),
    "heatmap-diabetes": dict(images=2, labels=[]),                # one panel per method, one colour bar
    "multipliers-two-moons": dict(labels=["class 0", "class 1", "λ = max λ", "λ = max λ / 2",
                                          "decision boundary (P = 0.5)"]),
    "top-multipliers-digits": dict(images=6, tables=0),
    "top-multipliers-two-moons": dict(images=0, tables=1),
    "polyfit-polyfit": dict(labels=["ground truth cos(πx)", "ERM", "FL ε=0.2", "training data"], lines=[3, 3]),
    "dynamics-two-moons": dict(labels=THREE, lines=[3, 3, 2, 2]),    # no ε (violation rate) nor λ for ERM
    "reliability-two-moons": dict(lines=[1, 1, 1]),                  # one panel per method, each with its diagonal
    "reliability-digits": dict(lines=[1], labels=[]),               # its one FL run
}


@pytest.mark.parametrize(("name", "task", "kwargs"), CASES, ids=[f"{n}-{t}" for n, t, _ in CASES])
def test_figure_draws_what_it_should(made: Path, name: str, task: str, kwargs: dict) -> None:
    fig = figure(name, runs_of(made, task), made / "records", **kwargs)
    axes = [ax for ax in fig.axes if ax.get_visible() and ax.get_label() != "<colorbar>"]
    want = EXPECTED[f"{name}-{task}"]
    if "labels" in want:
        assert [t.get_text() for legend in fig.legends for t in legend.get_texts()] == want["labels"]
    if "lines" in want:
        assert [len(ax.get_lines()) for ax in axes] == want["lines"]
    for axis in ("xscale", "yscale"):
        if axis in want:
            assert [getattr(ax, f"get_{axis}")() for ax in axes] == want[axis]
    if "images" in want:
        assert sum(len(ax.get_images()) for ax in axes) == want["images"]
    if "tables" in want:
        assert sum(len(ax.tables) for ax in axes) == want["tables"]


@pytest.mark.parametrize(("name", "task", "kwargs"), CASES, ids=[f"{n}-{t}" for n, t, _ in CASES])
def test_figure_reads_well(made: Path, name: str, task: str, kwargs: dict) -> None:
    """No matplotlib warning; no title or label cut off or run into another; the legend off every panel; no two
    curves alike (tests/test_report_plots_readable.py does the same with 20 configurations)."""
    from tests.test_report_plots_readable import assert_distinct_curves, assert_readable, drawn

    fig = drawn(name, runs_of(made, task), made / "records", **kwargs)
    assert_readable(fig)
    assert_distinct_curves(fig)


def test_heatmap_data_has_diverged_cells(made: Path) -> None:
    runs = runs_of(made, "diabetes")
    diverged = {(r.method, r.config["lr"]) for r in runs if r.status == "diverged"}
    assert diverged == {("erm", 1e3), ("fl", 1e3)}


def test_out_given_with_suffix_is_a_stem(made: Path, tmp_path: Path) -> None:
    paths = plot("polyfit", runs_of(made, "polyfit"), made / "records", tmp_path / "fig.png")
    assert_figure_files(paths, tmp_path / "fig")


@pytest.mark.parametrize(("name", "kwargs", "message"), [
    ("histogram", {}, "choose one of: cdf, cvar, heatmap"),
    ("cdf", {"split": "val"}, "split must be train or test"),
    ("top-multipliers", {"k": 0}, "k must be at least 1"),
])
def test_bad_arguments(made: Path, tmp_path: Path, name: str, kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        plot(name, runs_of(made, "two-moons"), made / "records", tmp_path / "fig", **kwargs)
    assert not tmp_path.joinpath("fig.png").exists()


@pytest.mark.parametrize(("name", "task", "message"), [
    ("multipliers", "diabetes", "two-moons fl/rfl runs with extras"),
    ("polyfit", "two-moons", "needs completed polyfit runs"),
    ("heatmap", "two-moons", "vary lr and dual_lr"),
    ("top-multipliers", "erm-only", "needs a completed fl or rfl run"),
    ("cdf", "all", "runs of one task"),
])
def test_runs_the_plot_cannot_use(made: Path, tmp_path: Path, name: str, task: str, message: str) -> None:
    if task == "all":
        runs = runs_of(made, "two-moons") + runs_of(made, "polyfit")
    elif task == "erm-only":
        runs = [r for r in runs_of(made, "two-moons") if r.method == "erm"]
    else:
        runs = runs_of(made, task)
    out_dir = tmp_path / "reports"
    with pytest.raises(ConfigError, match=message):
        plot(name, runs, made / "records", out_dir / name)
    assert not out_dir.exists() or not any(out_dir.iterdir())


def test_failure_while_writing_leaves_nothing(made: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_savefig = Figure.savefig

    def pdf_fails_halfway(self, fname, *args, **kwargs):
        if "pdf" in str(kwargs.get("format") or fname):
            Path(fname).write_bytes(b"%PDF-1.4 half")
            raise OSError("disk full")
        return real_savefig(self, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", pdf_fails_halfway)
    out = tmp_path / "reports" / "cdf"
    with pytest.raises(OSError, match="disk full"):
        plot("cdf", runs_of(made, "two-moons"), made / "records", out)
    assert list(out.parent.iterdir()) == []   # neither the finished PNG nor the half PDF is left


def test_plotting_never_imports_torch(made: Path, tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from flctl.report.plots import plot\n"
        "assert 'matplotlib' not in sys.modules, 'matplotlib imported at flctl import time'\n"
        "from flctl.report.data import select_runs\n"
        "from flctl.db import Store\n"
        f"root = Path({str(made)!r})\n"
        "store = Store.open(f'sqlite:///{root}/flctl.db')\n"
        f"plot('top-multipliers', select_runs(store, task='digits'), root / 'records', Path({str(tmp_path)!r}) / 't')\n"
        # two-moons' decision grid, computed from the MLP's layers as the figure draws
        f"plot('multipliers', select_runs(store, task='two-moons'), root / 'records', Path({str(tmp_path)!r}) / 'm')\n"
        "assert 'torch' not in sys.modules, 'plotting imported torch'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_multipliers_draws_new_runs_from_their_mlp_as_old_runs_from_their_saved_grid(made: Path, tmp_path: Path) -> None:
    # A cell keeps its MLP's layers and evaluates no grid; the figure evaluates them as it draws. The same runs as
    # flctl saved them before 2026-11-29 (the grid's probabilities, computed with torch, and no layers) draw the same
    # picture, read from what they saved.
    import dataclasses

    import torch

    from flctl.cell import load_trainable_state
    from flctl.tasks import get_task

    task = get_task("two-moons")
    runs, as_before = runs_of(made, "two-moons"), []
    for r in runs:
        if "extras" not in r.artifacts:
            as_before.append(r)
            continue
        kept = dict(np.load(r.artifacts["extras"]))
        assert "grid_prob1" not in kept and "mlp_weight_0" in kept
        data = task.load(r.cfg.opts, None)
        model = task.build_model(r.cfg.opts, data)
        load_trainable_state(model, torch.load(r.artifacts["model"], weights_only=True))
        xx, yy = np.meshgrid(kept["grid_x"], kept["grid_y"])
        with torch.no_grad():
            prob = torch.softmax(model(torch.from_numpy(np.stack([xx.ravel(), yy.ravel()], axis=1))), dim=-1)[:, 1]
        old = tmp_path / f"{r.id}.npz"
        np.savez(old, **{k: v for k, v in kept.items() if not k.startswith("mlp_")},
                 grid_prob1=prob.numpy().reshape(xx.shape))
        as_before.append(dataclasses.replace(r, artifacts={**r.artifacts, "extras": str(old)}))
    new_pixels, old_pixels = (rendered(figure("multipliers", rs, made / "records")) for rs in (runs, as_before))
    assert new_pixels.shape == old_pixels.shape
    differ = np.abs(new_pixels.astype(int) - old_pixels.astype(int)).max(axis=-1)
    assert differ.max() <= 2 and (differ > 0).mean() < 1e-3      # rounding at a contour's edge, a pixel here and there


@pytest.mark.notorch
def test_class1_probability_is_the_mlps_softmax_and_a_layer_that_does_not_fit_is_one_line() -> None:
    from flctl.report.plots.multipliers import class1_probability

    axes = {"grid_x": np.linspace(-2, 2, 5, dtype=np.float32), "grid_y": np.linspace(-1, 1, 3, dtype=np.float32)}
    x1 = np.broadcast_to(axes["grid_x"], (3, 5))
    # (x1, x2) -> ReLU(x1), ReLU(-x1) -> logits (0, ReLU(-x1) - ReLU(x1)) = (0, -x1): P(class 1) = sigmoid(-x1), which
    # a ReLU after the last layer would cut to 1/2 where x1 > 0.
    layers = {"mlp_weight_0": np.array([[1, 0], [-1, 0]], np.float32), "mlp_bias_0": np.zeros(2, np.float32),
              "mlp_weight_1": np.array([[0, 0], [-1, 1]], np.float32), "mlp_bias_1": np.zeros(2, np.float32)}
    np.testing.assert_allclose(class1_probability(axes | layers, "here"), 1 / (1 + np.exp(x1)), rtol=1e-6)
    saved = np.full((3, 5), 0.25)
    assert class1_probability(axes | layers | {"grid_prob1": saved}, "here") is saved     # a run that saved its grid
    for bad, says in ((layers | {"mlp_weight_1": np.ones((2, 3), np.float32)}, "does not take 2 inputs"),
                      (layers | {"mlp_weight_1": np.ones((1, 2), np.float32), "mlp_bias_1": np.zeros(1, np.float32)},
                       "has 1 output")):
        with pytest.raises(ConfigError, match=f"^run r's extras: .*{says}") as err:
            class1_probability(axes | bad, "run r's extras")
        assert "\n" not in str(err.value)


def rendered(fig: Figure) -> np.ndarray:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())


def test_heatmap_without_sweep_takes_the_latest_lr_sweep_or_asks_for_one(made: Path, tmp_path: Path) -> None:
    res = runner.invoke(app, ["report", "--plot", "heatmap", "--results-dir", str(made), "--out", str(tmp_path / "h")])
    assert res.exit_code == 0, res.output
    assert "the latest that varies lr" in res.stdout and (tmp_path / "h.png").is_file()
    res = runner.invoke(app, ["report", "--plot", "heatmap", "--task", "two-moons", "--results-dir", str(made)])
    assert res.exit_code == 2 and "of two-moons varies lr" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_reliability_bars_are_the_binned_accuracy_and_titles_the_ece(made: Path) -> None:
    from flctl.metrics import ece
    from flctl.report.data import final_records

    runs = [r for r in runs_of(made, "two-moons") if r.status == "completed" and r.method == "fl"]
    fig = figure("reliability", runs, made / "records", split="test")
    rec = final_records(made / "records", [r.id for r in runs], ["confidence", "correct"], split="test")
    conf, ok = rec["confidence"].to_numpy(), rec["correct"].to_numpy(zero_copy_only=False)
    ax = [a for a in fig.axes if "FL" in a.get_title()][0]
    assert ax.get_title().endswith(f"ECE {ece(conf, ok):.3f}")
    heights = [round(b.get_height(), 6) for b in ax.patches]
    lo = np.floor(conf.max() * 15 - 1e-9) / 15                               # the highest filled bin, (lo, lo + 1/15]
    assert heights[-1] == round(float(ok[conf > lo].mean()), 6)
    # a binary task's confidences are >= 0.5: its panels begin at the lowest bin reached, not at an empty 0-0.47
    assert conf.min() >= 0.5 and ax.get_xlim() == (pytest.approx(np.floor(conf.min() * 15) / 15), 1.0)


def test_reliability_refuses_a_regression_task(made: Path) -> None:
    with pytest.raises(ConfigError, match="reliability diagrams need a classifier's confidences; the diabetes"):
        figure("reliability", runs_of(made, "diabetes"), made / "records")


def test_dynamics_overlays_gd_and_nupi_as_separate_curves(tmp_path: Path) -> None:
    from flctl.db import Store

    root = tmp_path / "results"
    for extra in ([], ["--dual-optimizer", "nupi", "--kp", "5"]):
        res = runner.invoke(app, ["run", "two-moons", "-m", "fl", "--epochs", "4", "--eval-every", "1",
                                  "--results-dir", str(root), *extra])
        assert res.exit_code == 0, res.output
    runs = select_runs(Store.open(f"sqlite:///{root / 'flctl.db'}", readonly=True), task="two-moons")
    fig = figure("dynamics", runs, root / "records")
    labels = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert labels == ["dual_optimizer=gd kp=0", "dual_optimizer=nupi kp=5"]
    assert fig.legends[0].get_title().get_text() == "FL ε=0.1, 1 seed each"
    rates = [ax for ax in fig.axes if "violation rate" in ax.get_title()][0]
    assert len(rates.get_lines()) == 2 and all(len(line.get_xdata()) == 4 for line in rates.get_lines())


def test_a_panel_of_runs_of_several_sizes_says_the_range_of_samples(tmp_path: Path) -> None:
    """A CDF of a full run beside a --subset 256 one: its panel title says 256–1,000 samples, not the first curve's
    count alone (before: "1000 samples" above a 256-sample curve)."""
    from flctl import api

    root = tmp_path / "results"
    runs = [api.run("two-moons", "fl", epochs=1, subset=n, results_dir=root) for n in (0, 256)]
    fig = figure("cdf", runs, root / "records")
    assert [ax.get_title() for ax in fig.axes[:2]] == ["Train (256–1,000 samples)", "Test (256–1,000 samples)"]
    alone = figure("cdf", runs[:1], root / "records")
    assert alone.axes[0].get_title() == "Train (1,000 samples)"
