"""What cells cost on one device: fitted to the database's finished runs of the same task and device (``fit``), or,
where it has none, taken from the per-task figures a benchmark committed for that kind of device (``reference``:
benchmarks/results/task-costs-*.json, written by benchmarks/bench_task_costs.py); the model both fill and how a cost
is printed (``model``); the runs a plan is priced by, read as a plan reads the database (here)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from flctl.config import RunConfig
from flctl.cost.fit import estimate_cost, first_of_process, resumed_epochs, sizes
from flctl.cost.model import CostEstimate, format_cost, format_seconds, warn
from flctl.cost.reference import REFERENCE, full_size, on_a_gpu, reference_cost, start_up

if TYPE_CHECKING:
    from flctl.db import RunRecord

__all__ = ["REFERENCE", "CostEstimate", "estimate_cost", "first_of_process", "format_cost", "format_seconds",
           "full_size", "on_a_gpu", "reference_cost", "resumed_epochs", "sizes", "start_up", "started_epochs", "stored_runs"]


def stored_runs(url: str, tasks: Sequence[str], status: str | None = None) -> list[RunRecord]:
    """The runs of ``tasks`` recorded at ``url`` (those in ``status``; None: all), read as a plan reads them
    (flctl.results.peek_plan: none where the real command would make or upgrade the database first, the latter with
    a warning; StoreError where it would refuse it): their finished ones price a plan (estimate_cost) and say what a
    programme has (flctl.paper.plan)."""
    from flctl.errors import OlderSchema
    from flctl.results import peek_plan

    try:
        store = peek_plan(url)
    except OlderSchema:
        warn("the database is from an older flctl: a plan reads none of its runs until it is upgraded (`flctl "
             "migrate`; so do flctl run and flctl sweep)")
        return []
    if store is None:
        return []
    try:
        return [r for t in sorted(set(tasks)) for r in store.list_runs(task=t, status=status)]
    finally:
        store.close()


def started_epochs(url: str, configs: Sequence[RunConfig]) -> dict[str, int]:
    """The epochs done of those of ``configs`` (one task) that a launch resumes (flctl.db.counts.epochs_started),
    read as a plan reads the database (``stored_runs``): none where it is not made yet or is from an older flctl."""
    from flctl.db.counts import epochs_started
    from flctl.errors import OlderSchema
    from flctl.results import peek_plan

    try:
        store = peek_plan(url)
    except OlderSchema:
        return {}
    if store is None or not configs:
        return {}
    try:
        return epochs_started(store, configs[0].task, [c.run_id for c in configs])
    finally:
        store.close()
