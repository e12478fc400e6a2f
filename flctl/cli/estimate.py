"""The line a dry run prints of what its cells cost (`flctl sweep --dry-run`, `flctl run --dry-run`): the estimate
(flctl.cost), its interval, and how it was reached, each term said only where it counts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from flctl.cli.common import safe
from flctl.config import RunConfig

if TYPE_CHECKING:
    from flctl.cost import CostEstimate


def plan_cost(url: str, configs: Sequence[RunConfig], per_device: int) -> tuple[CostEstimate | None, dict[str, int]]:
    """The cost of ``configs`` (one task and device) with ``per_device`` cells training at once, and the epochs done
    of those that resume: fitted to the database's finished runs of the same task and device, read as a plan reads
    it (flctl.cost.stored_runs: StoreError where the real command would refuse the database), else the committed
    benchmark's; its resumed cells priced from the epochs they have left. A dry run's line and a wait's time left
    both read it."""
    from flctl.cost import estimate_cost, reference_cost, started_epochs, stored_runs
    from flctl.status import Status

    # the completed ones, all the estimate reads: not every queued cell of the task's sweeps (100,000: 13 s)
    runs = stored_runs(url, [configs[0].task], Status.COMPLETED)
    started = started_epochs(url, configs)
    cost = estimate_cost(runs, configs, per_device, started) or reference_cost(configs, per_device, started=started)
    return cost, started


def cost_line(url: str, configs: Sequence[RunConfig], per_device: int) -> str:
    """``plan_cost`` as the line a dry run prints (the device and task are user text, made safe)."""
    from flctl.cost import format_cost, on_a_gpu

    cost, started = plan_cost(url, configs, per_device)
    if cost is not None and not cost.cells:
        return "cost: nothing to do: every cell is completed"
    line = describe(cost, configs[0].task, configs[0].device, resumed=len(started))
    if cost is None and configs[0].device == "cpu" and (gpu := on_a_gpu(configs, started=started)) is not None:
        line += f"; on a GPU (--device cuda) about {format_cost(gpu.device_hours, 'cuda')}, from {gpu.source}"
    return line


def describe(cost: CostEstimate | None, task: str, device: str, resumed: int = 0) -> str:
    """``cost`` (flctl.cost.CostEstimate; None: nothing to price it from) as a dry run's line."""
    from flctl.cost import format_cost, format_seconds

    device, task = safe(device), safe(task)
    if cost is None:
        return (f"cost: unknown: no finished {task} runs on {device} in the database yet (the estimate is fitted to "
                f"their seconds per run), and no benchmark of {task} on {device} is committed")
    terms = []
    if cost.s_per_cell_here:
        terms.append(f"{cost.cells:,} cell(s) x {format_seconds(cost.s_per_cell_here, device)}")
    if cost.s_per_epoch_here and cost.epochs:
        left = f" left ({resumed:,} cell(s) resumed)" if resumed else ""
        terms.append(f"{cost.epochs:,} epochs{left} x {format_seconds(cost.s_per_epoch_here, device)}")
    work = " + ".join(terms) or "0 s"
    if cost.cells_per_device > 1:
        work = f"({work}) / {cost.cells_per_device} cells at once"
    start = f"{format_seconds(cost.s_per_start, device)} to start + " if cost.s_per_start else ""
    if cost.s_per_process:      # paid once: the workers' first cells train side by side
        start += f"{format_seconds(cost.s_per_process, device)} more for a worker's first cell + "
    if cost.source is not None:
        whence = f"from {cost.source}, another machine: no finished {task} runs on {device} in the database yet"
    elif not cost.s_per_cell and not cost.s_per_cell_scaled and not cost.s_per_process:
        # one amount of work in the history: a cell's start-up is inside the seconds per epoch
        whence = f"median of {cost.history} finished {task} runs on {device}, a cell's start-up in its epochs"
    else:
        whence = f"fitted to {cost.history} finished {task} runs on {device}"
    hours = cost.device_hours
    return (f"cost: about {format_cost(hours, device)} (expected within {format_cost(hours / cost.spread, device)} "
            f"to {format_cost(hours * cost.spread, device)}): {start}{work} ({whence})")
