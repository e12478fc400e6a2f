"""A method added in one place (its description and its class, below) is accepted everywhere a method is named:
`flctl run`, `flctl sweep --dry-run`, `flctl methods`, `flctl report --table main` and the CDF figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flctl import method_info, methods
from flctl.cli import app
from flctl.db import Store
from flctl.method_info import MethodInfo, describe
from flctl.methods import FL, register
from flctl.report.data import select_runs
from flctl.report.plots import figure

runner = CliRunner()


@pytest.fixture
def fl_double():
    """FL whose dual step is twice as long: the one place this test adds a method."""
    describe(MethodInfo("fl2", "FL×2", 5, frozenset({"eps", "dual_lr"}), "λ ← [λ + 2η(g−ε)]₊ ; min Σ λ·g",
                        cmap="Purples", linestyle=":"))

    @register
    class FLDouble(FL):
        name = "fl2"

        def _ascent(self, lam, violation):
            return lam.add_(violation, alpha=2 * self.dual_lr)

    yield FLDouble
    methods.METHODS.pop("fl2")
    method_info.METHOD_INFO.pop("fl2")


def flctl(*args: str):
    res = runner.invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return res


def test_a_method_described_once_runs_sweeps_and_reports(fl_double, results: Path) -> None:
    assert "fl2" in {m["name"] for m in json.loads(flctl("methods", "--json").stdout)}
    for method in ("fl", "fl2"):
        flctl("run", "two-moons", "-m", method, "--eps", "0.1", "--epochs", "3", "--dual-lr", "0.5")
    runs = json.loads(flctl("runs", "--json").stdout)
    by_method = {r["method"]: r for r in runs}
    assert by_method["fl2"]["config"]["alpha"] is None        # it reads eps and dual_lr only, as described
    # twice the dual step: the largest multiplier after 3 epochs differs from FL's
    assert by_method["fl2"]["metrics"]["train.max_multiplier"] != by_method["fl"]["metrics"]["train.max_multiplier"]

    plan = flctl("sweep", "two-moons", "-m", "fl2,fl", "--eps", "0.1,0.2", "--dry-run", "--results-dir",
                 str(results.parent / "plan"))
    assert "4 runs; nothing was written" in plan.output and plan.output.count("fl2") == 2, plan.output

    table = flctl("report", "--table", "main", "--format", "csv").stdout
    rows = [line.split(",")[0] for line in table.splitlines()]
    assert rows.index("FL") < rows.index("FL×2")              # in its described order, under its label

    fig = figure("cdf", select_runs(Store.open(f"sqlite:///{results / 'flctl.db'}")), results / "records")
    labels = [text.get_text() for legend in fig.legends for text in legend.get_texts()]
    assert any(label.startswith("FL×2") for label in labels), labels
    assert any(label.startswith("FL ") for label in labels), labels
