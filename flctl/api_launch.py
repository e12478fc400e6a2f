"""flctl.api's sweep and paper (re-exported there: ``api.sweep``, ``api.paper``): a grid of runs or the paper's
programme, planned and filled under the commands' rules (flctl.launch.plan.plan_sweep and fill_sweep, flctl.paper.flow),
with their launch flags read from a dict."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flctl import results
from flctl.api_args import DEVICE, LAUNCH, check_arg, checked
from flctl.errors import ConfigError


@checked(task="give one task's name, a str (see `flctl tasks`); several tasks are several sweeps",
         spec="give a sweep spec's TOML file, a str or Path (e.g. spec='sweeps/two-moons.toml')",
         options="give the task options as a dict, e.g. options={'degree': 10}", name="give the sweep's name, a str",
         device=DEVICE, data_dir="give the datasets' folder, a str or Path",
         objective="give a metric, a str such as 'test.max_loss'",
         tune="give the number of trials of the search, an int such as tune=20",
         parallel="give the number of trials launched at once, an int such as parallel=2", launch=LAUNCH)
def sweep(task: str | None = None, *, spec: str | Path | None = None, seeds: int | None = None,
          options: dict[str, Any] | None = None, name: str | None = None, device: str | None = None,
          data_dir: str | Path | None = None, results_dir: str | Path | None = None, db: str | None = None,
          wait: bool = True, tune: int | None = None, objective: str | None = None, direction: str = "min",
          parallel: int = 1, launch: dict[str, Any] | None = None, dry_run: bool = False, **axes: Any) -> Any:
    """Plan a grid of runs and fill what is not done, as ``flctl sweep`` does: the same checks, run ids, database
    rows, launchers (flctl.launch.backends) and workers. ``axes``: run fields, each a value, a list of values or a
    range written as on the command line (``lr="1e-4..1e-2:5"``); or ``spec``, a TOML spec file. ``launch``: the
    launch flags by name (``executor``, ``workers``, ``batch_runs``, ...; flctl.launch.settings.LaunchFlags). With ``wait``
    (the default) it returns once no cell is left to train: ``{"sweep": id, "cells": N, "total": counts by status,
    "errors": ...}`` (flctl.status.ledger); without, once its workers are started. With ``tune``: a TPE search of
    that many trials (``{"sweep": id, "study": the Optuna study}``). With ``dry_run``: the plan, written nowhere
    (flctl.launch.plan.SweepPlan: its ``sweep_id``, ``configs``, ``settings``), as ``flctl sweep --dry-run``. Bad input
    raises ConfigError before anything is written; a wait its workers leave unfinished raises
    flctl.launch.wait.SweepStopped."""
    import dataclasses

    from flctl.launch.flow import fill_sweep
    from flctl.launch.plan import plan_sweep
    from flctl.sweep import load_spec, spec_from_values

    if (spec is None) == (task is None):
        raise ConfigError("give either a task with axes or spec=, not both or neither")
    # launch keys that are not flctl's flags are the launcher's own options: the spec's [launch] table takes them
    extra = {k: v for k, v in (launch or {}).items() if k not in _flag_names()}
    flags = _launch_flags({k: v for k, v in (launch or {}).items() if k in _flag_names()})
    folder = None if data_dir is None else str(data_dir)
    if spec is not None:
        if axes or seeds is not None:
            raise ConfigError("give either spec= or axes, not both")
        chosen = load_spec(Path(spec))
        chosen = chosen if device is None else dataclasses.replace(chosen, device=device)
    else:
        assert task is not None
        chosen = spec_from_values(task, axes, seeds=seeds, options=options or {}, name=name,
                                  device="cpu" if device is None else device, data_dir=folder)
    if extra:
        chosen = dataclasses.replace(chosen, launch={**chosen.launch, **extra})
    found = results.find(results_dir, db, results.API)     # found and checked once, in the CLI's order
    root, url = found.root, found.url
    planned = plan_sweep(chosen, flags, results_root=root, objective=objective, direction=direction, tune=tune,
                         parallel=parallel, dry_run=dry_run)
    if dry_run:
        found.make(dry=True)        # what the real sweep would refuse, a dry run refuses too (as `flctl sweep`)
        return planned
    store = found.open_to_write()
    try:
        filled = fill_sweep(planned, store, url, root, wait=wait, direction=direction)
    finally:
        store.close()
    if filled.study is not None:
        return {"sweep": filled.sweep_id, "study": filled.study}
    if filled.stopped is not None:             # a signal stopped this process's worker: its cell went back
        from flctl.launch.wait import SweepStopped, stopped_line

        raise SweepStopped(stopped_line(root, filled.sweep_id), filled.stopped)
    return {"sweep": filled.sweep_id, **(filled.ledger or {})}


@checked(only="give the tables and figures as one str, e.g. only='table:1,figure:6' (or 'table')",
         specs="give the folder of the paper's specs, a str or Path", device=DEVICE,
         data_dir="give the datasets' folder, a str or Path",
         out="give the bundle's folder, a str or Path (default RESULTS/paper)", launch=LAUNCH)
def paper(*, only: str | None = None, scale: str = "paper", specs: str | Path | None = None,
          device: str | None = None, data_dir: str | Path | None = None, results_dir: str | Path | None = None,
          db: str | None = None, out: str | Path | None = None, report_only: bool = False, dry_run: bool = False,
          wait: bool = False, launch: dict[str, Any] | None = None) -> Any:
    """The paper's programme, as ``flctl paper`` runs it (flctl.paper.flow): planned with its cost, its missing cells
    launched (``only``: these tables and figures, e.g. "table:1"; ``scale`` "smoke": tiny and fast), then the bundle
    written (``out``, default RESULTS/paper or RESULTS/paper-smoke). Returns a flctl.paper.flow.PaperRun (its
    ``bundle``: the index.html written; ``programme``: what each table and figure has and lacks); with ``dry_run``,
    the PaperPlan (its ``programme``, with the cost), writing nothing. ConfigError for bad input, before anything is
    written."""
    from flctl.paper.flow import fill_paper, plan_paper
    from flctl.sweep import SHIPPED_SPECS

    if dry_run and report_only:
        raise ConfigError("give dry_run or report_only, not both")
    flags = _launch_flags(launch)
    found = results.find(results_dir, db, results.API)     # found and checked once, in the CLI's order
    root, url = found.root, found.url
    plan = plan_paper(url=url, specs=Path(specs) if specs is not None else SHIPPED_SPECS, launch=flags, only=only,
                      scale=scale, device=device, data_dir=None if data_dir is None else str(data_dir),
                      check_data=not (dry_run or report_only))
    bundle = Path(out) if out is not None else None
    plan.bundle_folder(root, bundle)                 # as `flctl paper`: a bundle that cannot be written, before
    if dry_run:                                      # any folder is made, a dry run included
        found.make(dry=True)                        # what the real command would refuse, as `flctl paper --dry-run`
        return plan
    if not report_only:
        found.open_to_write().close()               # the folder and database, as `flctl paper` makes them
    else:
        found.make()                                # reading the database only needs a folder for the bundle
    return fill_paper(plan, found, out=bundle, wait=wait, report_only=report_only)


def _flag_names() -> set[str]:
    from flctl.launch.settings import LaunchFlags

    return set(LaunchFlags.__dataclass_fields__)


def _launch_flags(launch: dict[str, Any] | None) -> Any:
    """flctl.launch.settings.LaunchFlags from a dict of them by name (ConfigError naming an unknown one)."""
    from flctl.launch.settings import LaunchFlags

    check_arg("launch", launch, Mapping, LAUNCH)
    if unknown := sorted(set(launch or {}) - set(LaunchFlags.__dataclass_fields__)):
        raise ConfigError(f"launch: unknown key(s) {', '.join(unknown)}; valid: "
                          f"{', '.join(sorted(LaunchFlags.__dataclass_fields__))}")
    return LaunchFlags(**(launch or {}))
