"""`flctl paper`'s flow, for the command and for ``flctl.api.paper``: plan the programme with its cost, launch each
spec's missing cells as `flctl sweep --spec` would, wait where the sweeps run here (or when asked), and write the
bundle. What a person sees of it (the plan's table, each launch, the live ledger) is the caller's: ``Hooks``."""

from __future__ import annotations

import dataclasses
import importlib.metadata as md
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flctl.cost import stored_runs
from flctl.db import Store
from flctl.devices import resolve_device
from flctl.errors import ConfigError, PartlyDone
from flctl.launch.flow import Hooks, fill_sweep
from flctl.launch.plan import plan_sweep
from flctl.launch.settings import LaunchFlags, LaunchSettings
from flctl.paper.plan import Programme, launch_programme, plan_programme, tasks_of
from flctl.paper.programme import SCALES, select
from flctl.results import Results


@dataclasses.dataclass
class PaperRun:
    """What the flow did: the programme as it stands after it, the bundle's index (None: a dry run), the ledgers of
    the sweeps waited for, the specs not launched for want of their data, and the exit code of a signal that stopped
    this process's worker (None: not stopped)."""

    programme: Programme
    bundle: Path | None = None
    ledgers: list[dict] = dataclasses.field(default_factory=list)
    lacking: list[str] = dataclasses.field(default_factory=list)
    launched: int = 0
    stopped: int | None = None
    stopped_in: str | None = None           # the sweep whose worker here was stopped
    bundle_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class PaperPlan:
    """The programme planned, and what filling it needs (``plan_paper``): nothing of it is written yet."""

    programme: Programme
    items: list
    specs: Path
    url: str
    launch: LaunchFlags
    scale: str
    only: str | None
    device: str | None
    data_dir: str | None
    together: Callable[[Any, list], int]

    def again(self, items: list | None = None, check_data: bool = True) -> Programme:
        """The programme planned anew (after a launch: what is finished now), of ``items`` (default: its own)."""
        chosen = self.items if items is None else items
        return plan_programme(self.specs, chosen, scale=self.scale, device=self.device, data_dir=self.data_dir,
                              runs=stored_runs(self.url, tasks_of(self.specs, chosen)), together=self.together,
                              check_data=check_data)

    def bundle_folder(self, root: Path, out: Path | None = None) -> Path:
        """Where the bundle goes: ``out``, else RESULTS/paper (RESULTS/paper-<scale>); ConfigError where that folder
        holds what the bundle must not replace (flctl.paper.bundle.check_out)."""
        from flctl.paper.bundle import check_out

        return check_out(out if out is not None else
                         root / ("paper" if self.scale == "paper" else f"paper-{self.scale}"), root)


def plan_paper(*, url: str, specs: Path, launch: LaunchFlags = LaunchFlags(), only: str | None = None,
               scale: str = "paper", device: str | None = None, data_dir: str | None = None,
               check_data: bool = True) -> PaperPlan:
    """The paper's programme at ``scale`` (``only``: these tables and figures) planned against ``url``'s runs, with
    its cost. ``check_data`` False: without looking at the data (a dry run, a bundle of what is finished: as `flctl
    sweep --dry-run`, a cluster's programme can be planned on a laptop). ConfigError for bad input; writes nothing."""
    if scale not in SCALES:
        raise ConfigError(f"unknown scale {scale!r}; choose one of: {', '.join(SCALES)}")
    # A data folder no file system takes is refused, a dry run included; one that is not here is not looked for
    # (a dry run on a laptop plans a cluster's programme, whose folder is only there).
    if data_dir is not None:
        from flctl.text import path_problem

        if (why := path_problem("--data-dir", data_dir)) is not None:
            raise ConfigError(why)
    items = select(only)
    if scale == "smoke" and launch.workers is None:
        # A smoke cell trains in about a second; a worker's new interpreter spends ~5 s of CPU importing torch and
        # scikit-learn before it takes one, and the default W (cores // threads) starts W - 1 of them for each spec
        # in turn: 2 cores, 17 -> 12 core-s for the whole programme.
        launch = dataclasses.replace(launch, workers=1)
    settings = LaunchSettings.resolve({}, launch)
    if device is not None:
        device = resolve_device(device, here=settings.launcher.runs_here, planning=not check_data)
    def together(spec: Any, cells: list) -> int:
        """Cells at once on a device, as this spec's launch ([launch] under the command's flags) would set them."""
        return LaunchSettings.resolve(spec.launch, launch).cells_per_device(spec.task, len(cells), cells[0].device)

    programme = plan_programme(specs, items, scale=scale, device=device, data_dir=data_dir,
                               runs=stored_runs(url, tasks_of(specs, items)), together=together,
                               check_data=check_data)
    return PaperPlan(programme, items, specs, url, launch, scale, only, device, data_dir, together)


def fill_paper(plan: PaperPlan, folder: Results, *, out: Path | None = None, wait: bool = False,
               report_only: bool = False, hooks: Hooks = Hooks()) -> PaperRun:
    """Launch the planned programme's missing cells (local and debug launchers: spec after spec in this process; a
    scheduler's: all submitted, waited for with ``wait``), then write the bundle under ``out`` (default
    RESULTS/paper, or RESULTS/paper-<scale>); ``report_only``: the bundle of what is finished, launching nothing.
    ``folder``: the results folder as the doorway found it (flctl.results.find), made by the caller. ConfigError
    for bad input met before anything trained; PartlyDone for bad input met after."""
    result = PaperRun(plan.programme)
    plan.bundle_folder(folder.root, out)     # before anything trains: a bundle that could not be written
    try:
        return _fill(plan, result, folder, out, wait, report_only, hooks)
    except ConfigError as exc:
        if not result.launched:
            raise
        # bad input met after cells trained: not "nothing written" (exit 2); what trained stays recorded
        raise PartlyDone(f"{exc} (after {result.launched} spec(s) launched: what trained is recorded, and "
                         "`flctl paper` again resumes)") from None


def _fill(plan: PaperPlan, result: PaperRun, folder: Results, out: Path | None, wait: bool, report_only: bool,
          hooks: Hooks) -> PaperRun:
    """fill_paper's steps: launch, then write the bundle."""
    root = folder.root
    if not report_only:
        hooks.plan(plan.programme)
        store = Store.open(folder.url)       # the caller made the folder and its database: opened, not checked again
        try:
            _launch(result, store, folder.url, root, plan.launch, wait, hooks)
        finally:
            store.close()
        if result.stopped is not None:
            return result
    items, programme = plan.items, plan.again() if not report_only else plan.programme
    if plan.only is not None and not report_only:
        # --only chose what trains; the bundle keeps every table and figure finished so far (where --specs holds
        # their specs: a folder of some of them bundles what it has)
        try:
            every = select(None)
            programme, items = plan.again(every, check_data=False), every
        except ConfigError:         # a --specs folder of some of the specs: the items it has, as planned
            pass
    result.programme = programme
    out = plan.bundle_folder(root, out)
    t0 = time.perf_counter()
    result.bundle = write(programme, plan.specs, items, root, plan.url, out,
                          stored_runs(plan.url, tasks_of(plan.specs, items)), hooks)
    result.bundle_s = time.perf_counter() - t0
    return result


def _launch(result: PaperRun, store: Any, url: str, root: Path, flags: LaunchFlags, wait: bool, hooks: Hooks) -> None:
    """Each spec's missing cells, as `flctl sweep --spec` launches them; the ledgers of the sweeps waited for."""
    from flctl.sweep import sweep_id

    submitted: list[str] = []
    settled: dict[str, dict] = {}

    def launch(sp: Any, cells: list) -> None:
        if result.stopped is not None:
            return
        try:
            planned = plan_sweep(sp.spec, flags, results_root=root, allow_large=True)
        except ConfigError as exc:
            raise ConfigError(f"sweeps/{sp.name}.toml: {exc}") from None
        wanted = {c.run_id for c in cells}
        configs = [c for c in planned.configs if c.run_id in wanted]
        planned = dataclasses.replace(planned, configs=configs, sweep_id=sweep_id(planned.spec, configs))
        # this machine's launchers fill the specs one after another, in this process; a scheduler's get them all
        foreground = planned.settings.launcher.runs_here
        filled = fill_sweep(planned, store, url, root, wait=foreground, hooks=hooks)
        result.launched += 1
        if filled.stopped is not None:
            result.stopped, result.stopped_in = filled.stopped, filled.sweep_id
            return
        if filled.ledger is not None:
            settled[filled.sweep_id] = filled.ledger
        submitted.append(filled.sweep_id)

    launch_programme(result.programme, launch)
    programme = result.programme
    result.lacking = sorted(name for name, sp in programme.specs.items()
                            if sp.no_data and programme.cells_to_do(name))
    if wait and result.stopped is None:
        for sid in submitted:
            if sid not in settled:
                settled[sid] = hooks.wait(store, sid, root)
    result.ledgers = list(settled.values())


def write(programme: Programme, specs: Path, items: list, root: Path, url: str, out: Path, runs: list,
          hooks: Hooks = Hooks()) -> Path:
    """The bundle of ``programme`` under ``out`` (flctl.paper.bundle), with the provenance of this flctl and command;
    finished runs of the same tables at the other scales are counted on its pages, never averaged in."""
    from flctl.layout import Layout
    from flctl.paper.bundle import write_bundle
    from flctl.report.tables import mixed_code_notes
    from flctl.text import redact
    from flctl.versions import git_revision

    def version(name: str) -> str:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return "not installed"

    others: dict[str, int] = {}
    for scale in SCALES:
        if scale != programme.scale:
            other = plan_programme(specs, items, scale=scale, device=None, data_dir=None, runs=runs, check_data=False)
            for p in other.items:
                if p.finished:
                    others[p.item.ref] = others.get(p.item.ref, 0) + len(p.finished)
    provenance = {"flctl": version("flctl"), "commit": git_revision() or "unknown", "torch": version("torch"),
                  "command": " ".join(["flctl", *sys.argv[1:]]), "made": datetime.now(UTC).isoformat(
                      timespec="seconds"), "database": redact(url)}
    for plan in programme.items:
        for note in mixed_code_notes([programme.runs[i] for i in plan.finished]):
            hooks.warn(f"{plan.item.ref}: {note}")
    return Path(write_bundle(programme, Layout(root).records, out, provenance, others))
