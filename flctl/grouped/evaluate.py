"""The evaluations of grouped cells: each cell's per-sample losses on a split through one grouped forward per chunk
of samples (``evaluate_together``), not one forward per cell."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from flctl.data import Split
from flctl.grouped.model import Grouped
from flctl.losses import split_records
from flctl.tasks import Task


@torch.no_grad()
def evaluate_together(task: Task, group: Grouped, split: Split, precision: str) -> list[dict[str, np.ndarray]]:
    """``flctl.losses.evaluate`` of ``split`` for each of the group's cells (in ``group.cells``' order), through one
    grouped forward per chunk of samples instead of one forward per cell; equal to each cell's own up to the grouped
    kernels' rounding. In eval mode (BatchNorm's running statistics, each cell's rows), then back to training."""
    group.module.eval()
    chunk = max(1, task.eval_chunk // group.k)        # the chunk's memory is the cells' together
    outs: list[list[Tensor]] = [[] for _ in range(group.k)]
    try:
        for start in range(0, len(split), chunk):
            x = split.x[start:start + chunk]
            for row, out in zip(outs, group.forward(x.expand(group.k, *x.shape), precision)):   # [K, b, ...]
                row.append(out)
    finally:
        group.module.train()
    return [split_records(task, split, row) for row in outs]
