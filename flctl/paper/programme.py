"""The paper's programme: each table and figure of Ramirez et al., *Feasible Learning* (AISTATS 2025), the sweeps/
specs that serve it, which of their runs it shows, the numbers the paper published for it, and the scales it can be
run at. Torch-free: `flctl paper --dry-run` and the bundle (flctl.paper.bundle) read it without the training stack.

The published numbers live in one data file, ``flctl/paper/published.csv``, transcribed from the paper's LaTeX
source: a row per number, with its table, the row's keys (model, method, ε, α; empty where the paper's row names
none) and our metric name for its column (train.avg_loss is the paper's "Avg. CE", "MSE" or "Avg. Loss").
"""

from __future__ import annotations

import csv
import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flctl.errors import ConfigError

PUBLISHED = Path(__file__).parent / "published.csv"
C6 = ("train.avg_loss", "train.max_loss", "train.accuracy", "test.avg_loss", "test.max_loss", "test.accuracy")
C4 = ("train.avg_loss", "train.max_loss", "test.avg_loss", "test.max_loss")
CDF = (("cdf", "train"), ("cvar", "train"), ("cdf", "test"), ("cvar", "test"))
LLAMA, ZEPHYR = "meta-llama/Llama-3.1-8B-Instruct", "stabilityai/stablelm-zephyr-3b"
# The paper's ε = 0.51 is log(1/0.6) = 0.5108 printed with two decimals: a run's ε matches a printed one within
# half a unit of its last digit.
EPS_PRINTED = 0.005


def same_eps(ours: float | None, printed: float | None) -> bool:
    return (ours is None) == (printed is None) and (ours is None or abs(ours - printed) <= EPS_PRINTED)  # type: ignore[operator]


def same_alpha(ours: float | None, printed: float | None) -> bool:
    return (ours is None) == (printed is None) and (ours is None or math.isclose(ours, printed, rel_tol=1e-6))  # type: ignore[arg-type]


@dataclass(frozen=True)
class Item:
    """One table or figure of the paper. Its runs are those of ``specs`` that ``admits`` (plus those of ``also``
    that match one of its published rows); a table shows ``columns``, a figure draws ``panels``."""

    ref: str                                   # "table:1", "figure:6"
    title: str
    specs: tuple[str, ...]                     # sweeps/NAME.toml
    columns: tuple[str, ...] = ()              # a table's metric columns, in the paper's order
    panels: tuple[tuple[str, str | None], ...] = ()   # a figure's (flctl report --plot kind, split)
    eps: float | None = None                   # only runs at this ε (and runs without one: ERM)
    methods: tuple[str, ...] = ()              # only these methods (all when empty)
    alpha: float | None = None                 # RFL and CSERM runs only at this α
    model: str | None = None                   # only runs of this model (the task option)
    also: tuple[str, ...] = ()                 # specs whose runs count only where they match a published row
    digits: int = 3                            # decimals, as the paper prints them
    table: str = "main"                        # a table's `flctl report --table` layout: main, ablation or llm
    # A table of ours on other data, shown beside this published table's rows without judging the distance (the
    # paper's numbers are of another data set): Table 1 on Fashion-MNIST stands in for CIFAR-10's.
    stands_in: int | None = None
    # A table's caption in the paper, its first sentence (with the ε its grey comment names): the bundle's LaTeX
    # caption quotes it after our title.
    caption: str = ""

    @property
    def kind(self) -> str:
        return "table" if self.columns else "figure"

    @property
    def number(self) -> int:
        """The paper's table or figure whose published numbers sit beside ours."""
        return self.stands_in if self.stands_in is not None else int(self.ref.split(":")[1])

    @property
    def name(self) -> str:
        """File-name stem: table-1, figure-6."""
        return self.ref.replace(":", "-")

    def admits(self, method: str, eps: float | None, alpha: float | None, model: Any) -> bool:
        return ((not self.methods or method in self.methods)
                and (self.eps is None or eps is None or same_eps(eps, self.eps))
                and (self.alpha is None or alpha is None or same_alpha(alpha, self.alpha))
                and (self.model is None or model == self.model))

    def all_specs(self) -> tuple[str, ...]:
        return self.specs + self.also


ITEMS: tuple[Item, ...] = (
    Item("table:1", "Table 1: final performance on CIFAR-10", ("cifar10-main",),
         columns=("train.avg_loss", "train.accuracy", "test.avg_loss", "test.accuracy"), digits=2,
         caption="Final performance for CIFAR10."),
    Item("table:1-fashion-mnist", "Table 1 on Fashion-MNIST: real images every machine can install (a small CNN on "
         "a CPU), beside the paper's CIFAR-10 numbers", ("fashion-mnist-cpu",),
         columns=("train.avg_loss", "train.accuracy", "test.avg_loss", "test.accuracy"), digits=2, stands_in=1,
         caption="Final performance for CIFAR10 (the paper's Table 1, beside ours on Fashion-MNIST)."),
    Item("table:2", "Table 2: RFL's α on UTKFace age regression, ε = 0", ("utkface-alpha",), columns=C4, eps=0.0,
         digits=2, table="ablation", caption="Final performance for UTKFace age regression (ε = 0.0)."),
    Item("table:5", "Table 5: final performance on CIFAR-10 (extended)", ("cifar10-main",), columns=C6,
         caption="Final performance for CIFAR10 experiments."),
    Item("table:6", "Table 6: RFL's α on CIFAR-10, ε = 0", ("cifar10-alpha",), columns=C6, eps=0.0, table="ablation",
         caption="Final performance for CIFAR10 classification (ε = 0)."),
    Item("table:7", "Table 7: RFL's α on CIFAR-10, ε = 0.51", ("cifar10-alpha",), columns=C6, eps=0.51,
         table="ablation", caption="Final performance for CIFAR10 classification (ε = 0.51)."),
    Item("table:8", "Table 8: final performance on UTKFace", ("utkface-main",), columns=C4, also=("utkface-alpha",),
         caption="Final performance for UTKFace experiments."),
    Item("table:9", "Table 9: RFL's α on UTKFace, ε = 0", ("utkface-alpha",), columns=C4, eps=0.0, table="ablation",
         caption="Final performance for UTKFace regression (ε = 0)."),
    Item("table:10", "Table 10: RFL's α on UTKFace, ε = 0.02", ("utkface-alpha",), columns=C4, eps=0.02,
         table="ablation", caption="Final performance for UTKFace regression (ε = 0.02)."),
    Item("table:11", "Table 11: DPO losses of Llama-3.1-8B and Zephyr-3B", ("orca-dpo",), columns=C4, table="llm",
         caption="DPO losses at the end of training for the Llama and Zephyr models on the direct preference "
         "optimization task."),
    Item("figure:1", "Figure 1: polynomial fits of degree 10, 20 and 30, ERM against FL", ("polyfit",),
         panels=(("polyfit", None),)),
    Item("figure:2", "Figure 2: test DPO loss CDF and CVaR, Llama-3.1-8B", ("orca-dpo",),
         panels=(("cdf", "test"), ("cvar", "test")), model=LLAMA),
    Item("figure:3", "Figure 3: FL's multipliers on two-moons", ("two-moons",), panels=(("multipliers", None),),
         methods=("fl",)),
    Item("figure:4", "Figure 4: UTKFace training samples with the largest multipliers", ("utkface-main",),
         panels=(("top-multipliers", None),), methods=("fl",), eps=0.02),
    Item("figure:5", "Figure 5: CIFAR-10 loss CDF and CVaR (ε = 0.51, RFL α = 1)", ("cifar10-main",), panels=CDF,
         methods=("erm", "fl", "rfl"), eps=0.51, alpha=1.0),
    Item("figure:6", "Figure 6: CIFAR-10 final train loss over primal × dual learning rates", ("cifar10-lr",),
         panels=(("heatmap", None),)),
    Item("figure:7", "Figure 7: UTKFace loss CDF and CVaR (ε = 0.02, RFL α = 0.1)", ("utkface-main",), panels=CDF,
         methods=("erm", "fl", "rfl"), eps=0.02, alpha=0.1),
    Item("figure:8", "Figure 8: UTKFace final train loss over primal × dual learning rates", ("utkface-lr",),
         panels=(("heatmap", None),)),
    Item("figure:9", "Figure 9: DPO loss CDF and CVaR, Llama-3.1-8B", ("orca-dpo",), panels=CDF, model=LLAMA),
    Item("figure:10", "Figure 10: DPO loss CDF and CVaR, Zephyr-3B", ("orca-dpo",), panels=CDF, model=ZEPHYR),
)
REFS = tuple(i.ref for i in ITEMS)


def select(only: str | None) -> list[Item]:
    """The items ``--only`` names (``table:1,figure:6``; ``table`` or ``figure`` alone: all of that kind), every
    item without it; ConfigError naming the valid references."""
    if only is None:
        return list(ITEMS)
    wanted = [w.strip().lower().replace(" ", "") for w in only.split(",") if w.strip()]
    if not wanted:
        raise ConfigError("--only is empty; give e.g. table:1,figure:6")
    chosen: list[Item] = []
    for w in wanted:
        found = [i for i in ITEMS if i.ref == w or i.kind == w]
        if not found:
            raise ConfigError(f"--only {w!r}: not a table or figure of the paper's programme; choose from "
                              f"{', '.join(REFS)} (or table, figure)")
        chosen += [i for i in found if i not in chosen]
    return [i for i in ITEMS if i in chosen]


# ---------------------------------------------------------------- the published numbers

@dataclass(frozen=True)
class Published:
    """One row of a published table: its keys (None where the paper's row names none) and its numbers by column."""

    table: int
    model: str | None
    method: str
    eps: float | None
    alpha: float | None
    values: Mapping[str, tuple[float, float | None, str]]   # column -> (value, std or None, the value as printed)

    def matches(self, method: str, eps: float | None, alpha: float | None, model: Any) -> bool:
        """Whether a configuration of ours is this row; a key the paper's row leaves empty is not compared (its
        CSERM rows name no α, its DPO rows no ε)."""
        return (method == self.method and (self.model is None or model == self.model)
                and (self.eps is None or same_eps(eps, self.eps))
                and (self.alpha is None or same_alpha(alpha, self.alpha)))


def published(path: Path = PUBLISHED) -> dict[int, list[Published]]:
    """The paper's tables, by number, each a list of rows in the paper's order."""
    out: dict[int, dict[tuple[str | None, str, float | None, float | None],
                        dict[str, tuple[float, float | None, str]]]] = {}
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            key = (row["model"] or None, row["method"], float(row["eps"]) if row["eps"] else None,
                   float(row["alpha"]) if row["alpha"] else None)
            out.setdefault(int(row["table"]), {}).setdefault(key, {})[row["column"]] = (
                float(row["value"]), float(row["std"]) if row["std"] else None, row["value"])
    return {t: [Published(t, model, method, eps, alpha, values) for (model, method, eps, alpha), values in rows.items()]
            for t, rows in out.items()}


def tolerance(printed: str, paper_std: float | None, our_std: float | None) -> float:
    """How far our mean may lie from the paper's value before the bundle marks it: two standard deviations (the
    paper's or ours, the larger), and never less than the rounding of the printed value; where the paper gives no
    spread (one seed, or a summary table), 10 % of its value plus 0.01."""
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    rounding = 0.5 * 10 ** -decimals
    ours = 2 * our_std if our_std else 0.0
    if paper_std is None:
        return max(ours, 0.1 * abs(float(printed)) + 0.01)
    return max(2 * paper_std, ours, rounding)


# ---------------------------------------------------------------- scales

SCALES = ("paper", "smoke")
# The smoke scale: every cell of the programme, tiny (one seed, two epochs, 256 samples of each split, plus the
# task's own Task.smoke values such as a narrow network), so that plan, run and bundle can be tried in minutes.
SMOKE = {"seed": (0,), "epochs": (2,), "subset": (256,)}


def scaled(spec: Any, scale: str) -> Any:
    """The spec (flctl.sweep.SweepSpec) at a scale: as written for "paper"; for "smoke", SMOKE and the task's
    ``smoke`` values replace its axes and options (runs of their own identity: other epochs, other data)."""
    if scale == "paper":
        return spec
    if scale != "smoke":
        raise ConfigError(f"unknown scale {scale!r}; choose one of: {', '.join(SCALES)}")
    from flctl.tasks import get_task

    own = dict(get_task(spec.task).smoke)
    options = {**spec.options, **{k: (v,) for k, v in own.pop("options", {}).items()}}
    axes = {**spec.axes, **SMOKE, **{k: (v,) for k, v in own.items()}}
    axes.pop("seeds", None)
    # A sweep of its own name, launched on this machine unless the command line says otherwise (the spec's [launch]
    # table is for the paper's cluster).
    return dataclasses.replace(spec, axes=axes, options=options, ranges={}, launch={},
                               name=f"{spec.name}-smoke" if spec.name else None)


def spec_paths(folder: Path, names: Sequence[str]) -> dict[str, Path]:
    """sweeps/NAME.toml for each name; ConfigError naming the ones missing from ``folder``."""
    paths = {n: folder / f"{n}.toml" for n in names}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise ConfigError(f"the paper's specs are missing: {', '.join(missing)}; pass --specs with the folder that "
                          "holds flctl's sweeps/")
    return paths
