"""What every logger is and is told: the class a logger subclasses (``Logger``), what it is told of a run as it starts
(``RunInfo``, made by ``run_info``) and of an evaluated epoch (``scalars``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar


@dataclass(frozen=True)
class RunInfo:
    """What a logger is told of a run as it starts: ``params`` (its configuration, flat: task options as
    ``options.KEY``) and ``tags`` (run and sweep ids, task, method, library versions). ``replay``: `flctl export`
    logs a finished run again; what an earlier log of it left is replaced, never added to."""

    run_id: str
    sweep_id: str | None
    task: str
    method: str
    params: dict[str, Any]
    tags: dict[str, str]
    replay: bool = False
    title: str = ""         # what a person reads in the tracker's list of runs (RunConfig.title and the run id)


class Logger:
    """One run's log in one tool. Subclass it, set ``name`` (and ``needs``, the module of its tool, and ``extra``,
    the pip extra that installs it), and fill in ``start``, ``log`` and ``finish``."""

    name: ClassVar[str]
    needs: ClassVar[str | None] = None        # the tool's module: checked before anything trains
    extra: ClassVar[str | None] = None        # `pip install 'flctl[EXTRA]'` installs it
    imports: ClassVar[tuple[str, ...]] = ()   # what its calls import: imported off the clock (call_tracker)

    def __init__(self, results_root: Path) -> None:
        self.results_root = Path(results_root)

    @classmethod
    def where(cls, results_root: Path) -> str:
        """Where its logs go, for the line that says so (a folder, a tracking server, a project)."""
        return cls.name

    @classmethod
    def prepare(cls, results_root: Path) -> None:
        """Once, in the launching process, before a sweep's workers start: what they would otherwise all make at
        once (an MLflow store and its experiment)."""

    def start(self, run: RunInfo) -> None:
        raise NotImplementedError

    def log(self, epoch: int, scalars: dict[str, float], multipliers: Any = None) -> None:
        """An epoch's numbers (flctl's metric names), and at an evaluated epoch the multipliers (numpy, one per
        training sample; None for a method without them) for a histogram."""
        raise NotImplementedError

    def finish(self, status: str) -> None:
        raise NotImplementedError


def run_info(cfg: Any, sweep_id: str | None = None, *, replay: bool = False) -> RunInfo:
    """What a logger is told of the run of ``cfg`` (a RunConfig)."""
    from flctl.versions import library_versions

    params = {k: v for k, v in cfg.to_dict().items() if k != "options"}
    params |= {f"options.{k}": v for k, v in sorted(cfg.opts.items())}
    tags = {"flctl.run_id": cfg.run_id, "flctl.task": cfg.task, "flctl.method": cfg.method,
            **({"flctl.sweep_id": sweep_id} if sweep_id else {}),
            **{f"version.{k}": str(v) for k, v in library_versions().items()}}
    return RunInfo(cfg.run_id, sweep_id, cfg.task, cfg.method, params, tags, replay,
                   title=f"{cfg.title} · {cfg.run_id}")


def scalars(told: Mapping[str, float | None], metrics: dict[str, float] | None, multipliers: Any) -> dict[str, float]:
    """An epoch's numbers as every logger gets them: the epoch's training-batch numbers (``told``: EPOCH_NUMBERS'
    names to values, as ``epoch.*``: flctl.metrics.epoch_numbers, the keys the record file keeps), an evaluation's
    summary metrics under flctl's names, and the multipliers' summary statistics (``multipliers.*``: mean, max, the
    share above zero, the 50th, 90th and 99th percentiles)."""
    import numpy as np

    from flctl.metrics import epoch_numbers

    out = epoch_numbers(told)
    out |= {k: float(v) for k, v in (metrics or {}).items() if v is not None}
    if multipliers is not None and len(multipliers):
        lam = np.asarray(multipliers, dtype=np.float64)
        p50, p90, p99 = np.percentile(lam, [50, 90, 99])
        out |= {"multipliers.mean": float(lam.mean()), "multipliers.max": float(lam.max()),
                "multipliers.active_share": float((lam > 0).mean()), "multipliers.p50": float(p50),
                "multipliers.p90": float(p90), "multipliers.p99": float(p99)}
    return out
