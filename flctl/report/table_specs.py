"""The report tables, each declared once: its name, title, what a row is, its key columns and their order, and its
default columns. `flctl report --table` (its choices, help and completion), flctl.report.tables.build (rows, keys,
title, order), flctl.report.groups and `flctl paper`'s bundle (it builds its tables by name) read these entries; no
other module tests a table's name (tests/test_report_tables.py holds that).

Adding a table: one ``register(TableSpec(...))`` call below (docs/extending.md, "A report table"). No numpy, pyarrow
or torch here: the command line lists the names in its help.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from flctl.registry import add, find

# The key columns a table of configurations may show, by the configuration's field they show, with their heading.
# "model" is the task option `model` (flctl.report.groups_of_runs.ConfigKey.model).
KEYS = {"model": "Model", "method": "Method", "eps": "ε", "alpha": "α"}
Key = Literal["model", "method", "eps", "alpha"]


@dataclass(frozen=True)
class TableSpec:
    """One table `flctl report --table NAME` builds (flctl.report.tables.build) and renders in every format.

    A table of configurations has one row per configuration (runs that differ only by seed, mean ± std over them,
    of one task): its ``keys`` in order, then a Config column naming the other fields that vary among the runs.
    Rows sort by the keys in their order, then by those other fields. A table of runs has one row per run."""

    name: str                             # as --table takes it and a paper item names it (flctl.paper.programme.Item.table)
    title: str                            # above the table; a ``by`` table's names the attribute: "{by}"
    # What a row is: "config", a configuration (see above); "run", one run (its id, every identity field, task
    # option and library version, then its own values): any runs, of any tasks, nothing averaged or "best".
    row: Literal["config", "run"] = "config"
    keys: tuple[Key, ...] = ("method", "eps", "alpha")     # of KEYS; a table of runs has none
    # The default columns (--columns replaces them): these metrics of train and test, in this order; None: every
    # summary metric some run recorded.
    metrics: tuple[str, ...] | None = ("avg_loss", "max_loss")
    classification: tuple[str, ...] = ()  # more default metrics where the runs are classification (train.accuracy)
    baseline_first: bool = False          # rows of the baseline (method order 0: ERM) before all others
    alpha_descending: bool = False        # α from largest to smallest (a method without α sorts as α = ∞)
    fl_alpha_infinite: bool = False       # FL is RFL with α = ∞: FL's α reads ∞ and sorts as the largest α
    task: str | None = None               # the task whose runs it shows when neither --task nor --sweep is given
    # A row per group of samples (the attribute `--by` names, from each run's extras) and configuration, the groups'
    # rows laid out as this spec says: flctl.report.groups builds it, and only it takes --by.
    by: bool = False

    def __post_init__(self) -> None:
        if not set(self.keys) <= set(KEYS) or len(set(self.keys)) != len(self.keys):
            raise ValueError(f"table {self.name!r}: keys must be distinct ones of {', '.join(KEYS)}, got {self.keys}")
        if (self.row == "run") == bool(self.keys):
            raise ValueError(f"table {self.name!r}: a table of configurations has key columns, a table of runs none")
        if self.by and (self.row == "run" or self.metrics is None):
            raise ValueError(f"table {self.name!r}: a table by groups of samples has rows of configurations and names "
                             "its metrics")


TABLE_SPECS: dict[str, TableSpec] = {}


def register(spec: TableSpec) -> TableSpec:
    """Add ``spec`` to the tables `flctl report --table` offers; the same spec twice is one table."""
    return add(TABLE_SPECS, spec.name, spec, "table")


def table_spec(name: str) -> TableSpec:
    """The table named ``name``; ConfigError listing the tables when there is none."""
    return find(TABLE_SPECS, name, "table")


def by_tables() -> tuple[str, ...]:
    """The tables that take --by (a row per group of samples)."""
    return tuple(name for name, spec in TABLE_SPECS.items() if spec.by)


# The paper's tables. MAIN is also the order and labels of figures' curves and per-sample queries' groups.
MAIN = register(TableSpec("main", "Final performance", classification=("accuracy",)))
register(TableSpec("ablation", "α ablation (FL is RFL with α = ∞)", keys=("eps", "method", "alpha"),
                   baseline_first=True, alpha_descending=True, fl_alpha_infinite=True))
register(TableSpec("llm", "Preference optimization", keys=("model", "method", "eps", "alpha"), task="orca-dpo"))
register(TableSpec("runs", "Runs", row="run", keys=(), metrics=None))
register(TableSpec("groups", "Loss by {by} group", by=True))
