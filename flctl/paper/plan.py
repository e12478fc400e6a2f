"""`flctl paper`'s plan: the paper's programme (flctl.paper.programme) resolved against sweeps/ and the run database.

For each table and figure: the cells that serve it at the chosen scale (the planned runs of its specs that it
shows), how many are finished, whether its task's data is here, and the device-hours still to spend (the sweep cost
estimate, flctl.sweep.estimate_cost). Launching and the bundle take everything from this one plan, so the plan
printed by ``--dry-run`` is exactly what a run would launch and what the bundle would show.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flctl.config import RunConfig
from flctl.cost import CostEstimate, estimate_cost, reference_cost
from flctl.errors import ConfigError
from flctl.paper.programme import Item, Published, published, scaled, spec_paths
from flctl.status import REPORTABLE
from flctl.sweep import SweepSpec, load_spec, plan, sweep_id


@dataclass
class SpecPlan:
    """One spec of sweeps/ at the scale: its planned cells and why they cannot train here (None: they can)."""

    name: str
    spec: SweepSpec
    configs: list[RunConfig]
    no_data: str | None = None


@dataclass
class ItemPlan:
    """One table or figure: its cells (run id -> config), how many finished, and what is left to spend."""

    item: Item
    cells: dict[str, RunConfig]
    finished: set[str]                       # completed or diverged
    cost: CostEstimate | None                # of the cells to do; None: no history or benchmark, or none to do
    no_data: str | None
    rows: list[Published] = field(default_factory=list)   # the published table's rows (tables only)

    @property
    def to_do(self) -> list[RunConfig]:
        return [c for i, c in self.cells.items() if i not in self.finished]

    def hours(self, configs: Sequence[RunConfig]) -> float | None:
        """Device-hours of ``configs`` at this item's measured cost (None: no history)."""
        if self.cost is None:
            return None
        return self.cost.hours(configs)


@dataclass
class Programme:
    scale: str
    device: str
    specs: dict[str, SpecPlan]
    items: list[ItemPlan]
    runs: dict[str, Any]                     # every stored run of the programme's tasks, by id (store RunRecords)

    def cells_to_do(self, spec: str) -> list[RunConfig]:
        """The cells of ``spec`` that the chosen items need and that are not finished."""
        wanted = {i for p in self.items for i, c in p.cells.items() if i not in p.finished}
        return [c for c in self.specs[spec].configs if c.run_id in wanted]

    def cells_of(self, spec: str) -> list[RunConfig]:
        wanted = {i for p in self.items for i in p.cells}
        return [c for c in self.specs[spec].configs if c.run_id in wanted]

    def sweep_of(self, spec: str) -> str | None:
        """The id of the sweep that launches (or launched) the chosen items' cells of ``spec``."""
        cells = self.cells_of(spec)
        return sweep_id(self.specs[spec].spec, cells) if cells else None


def plan_programme(folder: Path, items: Sequence[Item], *, scale: str, device: str | None, data_dir: str | None,
                   runs: Sequence[Any], together: Callable[[Any, list[RunConfig]], int] | None = None,
                   check_data: bool = True) -> Programme:
    """Plan ``items`` at ``scale`` from the specs in ``folder``; ``runs`` are the database's runs (RunRecords).
    ``device`` and ``data_dir`` replace the specs' where given; ``together(spec, cells)``: how many of the spec's
    ``cells`` train at once on a device, as its launch would set them (flctl.paper.flow; None: one). ConfigError for
    a missing or invalid spec."""
    from flctl.tasks import check_task_data, get_task

    names = sorted({n for i in items for n in i.all_specs()})
    specs: dict[str, SpecPlan] = {}
    for name, path in spec_paths(folder, names).items():
        spec = scaled(load_spec(path), scale)
        task = get_task(spec.task)
        spec = dataclasses.replace(spec, device=device or spec.device,
                                   data_dir=(data_dir if task.reads_data else None) or spec.data_dir)
        configs = plan(spec, check_data=False, allow_large=True)
        no_data = None
        if check_data:
            try:
                for options in {c.options: c for c in configs}.values():
                    check_task_data(task, options.opts, spec.data_dir)
            except ConfigError as exc:
                no_data = str(exc)
        specs[name] = SpecPlan(name, spec, configs, no_data)
    by_id = {r.id: r for r in runs}
    tables = published()
    plans = []
    for item in items:
        if scale != "paper":   # a smaller scale may train other models (smoke: tiny for orca-dpo's LLMs)
            item = dataclasses.replace(item, model=None)
        rows = tables.get(item.number, []) if item.kind == "table" else []
        cells: dict[str, RunConfig] = {}
        for name in item.all_specs():
            for c in specs[name].configs:
                model = c.opts.get("model")
                if item.admits(c.method, c.eps, c.alpha, model) and (
                        name in item.specs or any(p.matches(c.method, c.eps, c.alpha, model) for p in rows)):
                    cells.setdefault(c.run_id, c)
        finished = {i for i in cells if i in by_id and by_id[i].status in REPORTABLE}
        to_do = [c for i, c in cells.items() if i not in finished]
        per_device = together(specs[item.all_specs()[0]].spec, to_do) if together and to_do else 1
        cost = (estimate_cost(runs, to_do, per_device) or reference_cost(to_do, per_device)) if to_do else None
        no_data = next((specs[n].no_data for n in item.all_specs() if specs[n].no_data), None)
        plans.append(ItemPlan(item, cells, finished, cost, no_data, rows))
    first = next(iter(specs.values()), None)
    return Programme(scale, first.spec.device if first else (device or "cpu"), specs, plans, by_id)


def tasks_of(folder: Path, items: Sequence[Item]) -> list[str]:
    names = sorted({n for i in items for n in i.all_specs()})
    return sorted({load_spec(p).task for p in spec_paths(folder, names).values()})


def launch_programme(programme: Programme, launch: Callable[[SpecPlan, list[RunConfig]], None]) -> int:
    """Call ``launch(spec, cells)`` for each spec with cells to do and its data here, in the order of sweeps/ names;
    returns how many specs it launched."""
    launched = 0
    for name, sp in sorted(programme.specs.items()):
        cells = programme.cells_to_do(name)
        if cells and sp.no_data is None:
            launch(sp, programme.cells_of(name))
            launched += 1
    return launched
