"""The report figures and per-sample queries, each declared once, as the tables are in flctl.report.table_specs:
its name, what it shows, and the function that draws (or computes) it. `flctl report --plot/--samples` (choices,
help, completion), flctl.report.flow, flctl.api.report and `flctl paper`'s bundle read these entries.

Adding a figure: one ``register_plot(PlotSpec(...))`` call below, its drawing in a module of flctl/report/plots/
(docs/extending.md, "A figure of your own"). The drawing functions import their module when called: the command
line lists the names in its help without importing matplotlib, numpy or pyarrow.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flctl.errors import ConfigError
from flctl.registry import add, find

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from flctl.db import RunRecord


@dataclass(frozen=True)
class PlotSpec:
    """One figure `flctl report --plot NAME` draws into NAME.png and NAME.pdf."""

    name: str
    what: str                # what it shows, one line (docs, listings)
    # draw(runs, records_root, split, k) -> a matplotlib Figure; ConfigError where the runs cannot make it
    draw: Callable[[list[RunRecord], Path, str | None, int], Figure]
    # Without --sweep: the latest sweep (of --task) that varies this field, announced (one grid a figure)
    latest_sweep_varying: str | None = None


@dataclass(frozen=True)
class QuerySpec:
    """One per-sample query `flctl report --samples NAME` computes into a table (shown, and saved as Parquet)."""

    name: str
    what: str
    # run(runs, records_root, options) -> a pyarrow Table; options: split, min_seeds, eps, methods, top
    run: Callable[[list[RunRecord], Path, dict[str, Any]], Any]


PLOT_SPECS: dict[str, PlotSpec] = {}
QUERY_SPECS: dict[str, QuerySpec] = {}


def register_plot(spec: PlotSpec) -> PlotSpec:
    """Add ``spec`` to the figures `flctl report --plot` offers; the same name twice must be the same figure."""
    return add(PLOT_SPECS, spec.name, spec, "plot")


def register_query(spec: QuerySpec) -> QuerySpec:
    """Add ``spec`` to the queries `flctl report --samples` offers."""
    return add(QUERY_SPECS, spec.name, spec, "query")


def plot_spec(name: str) -> PlotSpec:
    """The figure named ``name``; ConfigError listing the figures when there is none."""
    return find(PLOT_SPECS, name, "plot")


def query_spec(name: str) -> QuerySpec:
    """The query named ``name``; ConfigError listing the queries when there is none."""
    return find(QUERY_SPECS, name, "query")


# ---- the paper's figures ----

def _distribution(kind: str) -> Callable[..., Figure]:
    def draw(runs: list[RunRecord], records_root: Path, split: str | None, k: int) -> Figure:
        from flctl.report.plots.distribution import _distribution

        return _distribution(runs, records_root, split, kind)
    return draw


def _heatmap(runs: list[RunRecord], records_root: Path, split: str | None, k: int) -> Figure:
    from flctl.report.plots.heatmap import _heatmap

    return _heatmap(runs)


def _multipliers(runs: list[RunRecord], records_root: Path, split: str | None, k: int) -> Figure:
    from flctl.report.plots.multipliers import _multipliers

    return _multipliers(runs, records_root)


def _top_multipliers(runs: list[RunRecord], records_root: Path, split: str | None, k: int) -> Figure:
    from flctl.report.plots.top import _top_multipliers

    return _top_multipliers(runs, records_root, k)


def _polyfit(runs: list[RunRecord], records_root: Path, split: str | None, k: int) -> Figure:
    from flctl.report.plots.polyfit import _polyfit

    return _polyfit(runs)


def _dynamics(runs: list[RunRecord], records_root: Path, split: str | None, k: int) -> Figure:
    from flctl.report.plots.dynamics import _dynamics

    return _dynamics(runs, records_root, split)


def _reliability(runs: list[RunRecord], records_root: Path, split: str | None, k: int) -> Figure:
    from flctl.report.plots.reliability import _reliability

    return _reliability(runs, records_root, split)


register_plot(PlotSpec("cdf", "the CDF of the final per-sample losses, a curve per configuration", _distribution("cdf")))
register_plot(PlotSpec("cvar", "CVaR of the final per-sample losses against its level", _distribution("cvar")))
register_plot(PlotSpec("heatmap", "a metric over one lr x dual-lr sweep", _heatmap, latest_sweep_varying="lr"))
register_plot(PlotSpec("multipliers", "two-moons: the multipliers over the input plane", _multipliers))
register_plot(PlotSpec("top-multipliers", "the k samples with the largest multipliers", _top_multipliers))
register_plot(PlotSpec("polyfit", "polynomial fits beside the data", _polyfit))
register_plot(PlotSpec("dynamics", "losses and multipliers over the epochs", _dynamics))
register_plot(PlotSpec("reliability", "reliability diagrams of classifiers", _reliability))


# ---- the per-sample queries ----

def _violators(runs: list[RunRecord], records_root: Path, options: dict[str, Any]) -> Any:
    from flctl.report import samples

    return samples.violators(runs, records_root, split=options.get("split") or "train",
                             min_seeds=options.get("min_seeds", 1), eps=options.get("eps"))


def _diff(runs: list[RunRecord], records_root: Path, options: dict[str, Any]) -> Any:
    from flctl.method_info import canonical
    from flctl.report import samples

    pair = tuple(canonical(m.strip()) for m in (options.get("methods") or "").split(",") if m.strip())
    if len(pair) != 2:
        raise ConfigError("--samples diff needs --methods A,B (two methods)")
    return samples.diff(runs, records_root, pair, split=options.get("split") or "test",    # type: ignore[arg-type]
                        top=options.get("top", 20))


register_query(QuerySpec("violators", "samples whose final loss exceeds ε in at least --min-seeds seeds", _violators))
register_query(QuerySpec("diff", "the samples whose loss differs most between two methods (--methods A,B)", _diff))
