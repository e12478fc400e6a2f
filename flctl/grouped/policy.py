"""Which cells train together and when they become one grouped model: the rules, torch-free, so that the CLI, the
launch and the cost estimate read them without importing torch.

Three decisions, each asked by everyone who needs it:

- how many cells a worker takes (``cells_together``): ``--batch-runs``, else ``auto_together``;
- which cells may share a process (``can_train_together``): the worker's claim and the trainer both ask;
- whether cells together become one grouped model (``groups_on``: engine, micro-batch, device kind and the task's
  ``batched``), else train one by one, interleaved, in one process. ``flctl.grouped.model.trains_grouped`` adds the
  model's own say (every layer one the grouped model knows).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from flctl.devices import ALONE_ENGINES
from flctl.tasks import Task, get_task

if TYPE_CHECKING:
    from flctl.config import RunConfig

# Most cells of a small-model task (Task.batched) one worker takes together when --batch-runs is not given, by
# device kind (``auto_together`` says what each was chosen from).
AUTO_TOGETHER = {"cuda": 8, "cpu": 16}

# ``groups_on`` and ``groupable`` in words, for the --batch-runs help (flctl.launch.settings.LaunchFlags).
WHEN_GROUPED = ("they become one grouped model on CUDA when the model is groupable (convolutions, BatchNorm, linear "
                "layers), on a CPU only for small-model tasks (two-moons, digits, diabetes); otherwise they train "
                "one by one, interleaved")


def cells_together(asked: int | None, task: str, cells: int, workers: int, device: str) -> int:
    """Cells each worker trains together: ``asked`` (--batch-runs), or the automatic choice for ``cells`` cells
    among ``workers`` workers (``auto_together``). The launch (flctl.launch.plan) and the cost estimate
    (LaunchSettings.cells_per_device) both ask here."""
    return asked or auto_together(task, cells, max(workers, 1), device)


def auto_together(task: str, cells: int, workers: int, device: str) -> int:
    """Cells a worker trains together when --batch-runs is not given: for a ``batched`` task (a small model), its
    share of the cells, split into groups of about equal size of at most AUTO_TOGETHER (so 50 cells a worker on a
    CPU are groups of 13, not 16, 16, 16 and 2); otherwise 1. On a CPU, grouped cells trained 1.98x faster than alone
    at K = 16 and 1.51x at 64 for two-moons, 1.05x and 0.89x for digits (benchmarks/bench_together.py, 2 cores,
    2026-11-27): 16 is where both still gain. On a GPU 8, as the first leases ran it; 64 to 256 wait for one's
    measure (benchmarks/bench_gpu.py moons). ResNet cells (cifar10, utkface) are grouped only when asked
    (--batch-runs K): 4 grouped trained no faster than 1 on an H100."""
    if not get_task(task).batched:
        return 1
    share = max(1, math.ceil(cells / workers))
    return math.ceil(share / math.ceil(share / AUTO_TOGETHER["cuda" if device.startswith("cuda") else "cpu"]))


def can_train_together(cfgs: Sequence[RunConfig]) -> bool:
    """Whether these cells may train in one process (flctl.train.train_together), the one rule the worker's claim and
    the trainer both ask: a cell alone always; several when their task trains a model (a solver task's cells are
    solved one by one) and they agree on every field but the per-cell ones (RunConfig.together_key: device, data,
    engine and the shared fields)."""
    if len(cfgs) < 2:
        return True
    return get_task(cfgs[0].task).build_model is not None and len({c.together_key() for c in cfgs}) == 1


def groups_on(task: Task, cfg: RunConfig, device_kind: str) -> bool:
    """Whether cells together with ``cfg``'s shared fields become one grouped model on a device of ``device_kind``
    (cuda, cpu), as far as their configuration and task say: on CUDA (one launch per op for all instead of one per
    cell); on the CPU for ``batched`` tasks only (small models, where it measured faster: a CPU's arithmetic is not
    bound by launches). Never for engines that keep each cell alone (compiled per cell, or a CUDA stream each) nor
    micro-batches."""
    return cfg.engine not in ALONE_ENGINES and cfg.micro_batch == 0 and (device_kind == "cuda" or task.batched)
