"""The step of grouped cells: their epoch buffers as one (``GroupBatches``), one step of every cell through the
grouped model (``grouped_step``), and what a captured grouped step reads (``group_inputs``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from flctl.data import Dataset
from flctl.grouped.model import Grouped
from flctl.grouped.rows import side_by_side
from flctl.losses import per_sample_loss
from flctl.step import public_tensors, step_inputs
from flctl.tasks import Task

if TYPE_CHECKING:
    from flctl.step import EpochBatches


class GroupBatches:
    """The K cells' epoch buffers (flctl.step.EpochBatches) as one: each cell's buffer becomes a view of its row of a
    group buffer, so each cell's ``fill`` (in place) writes the group's, and one ``take`` gathers all K cells' next
    batch ids and augmentation parameters (a few ops whatever K, where K takes cost K times as many). A ``fill`` that
    reallocates (a new epoch length) leaves the group behind: ``holds`` says so, and the stepper regroups."""

    def __init__(self, batches: Sequence[EpochBatches]) -> None:
        self.batches = list(batches)
        self.full = side_by_side(batches, "full", 1)                                      # [S, K, B]
        self.last = side_by_side(batches, "last", 0)                                      # [K, R]
        self.full_params = {n: side_by_side([b.full_params for b in batches], n, 1) for n in batches[0].full_params}
        self.last_params = {n: side_by_side([b.last_params for b in batches], n, 0) for n in batches[0].last_params}
        self.counter = batches[0].counter
        for b in batches:
            b.counter = self.counter          # each cell's fill zeroes it: one counter for the group
        self.views = [(b.full, b.last, b.counter, *b.full_params.values(), *b.last_params.values()) for b in batches]

    def holds(self) -> bool:
        """Whether every cell's buffers are still the views of the group's (no fill made new ones)."""
        return all(all(a is b for a, b in zip(views, (bt.full, bt.last, bt.counter, *bt.full_params.values(),
                                                       *bt.last_params.values())))
                   for views, bt in zip(self.views, self.batches))

    def take(self, last: bool) -> tuple[Tensor, dict[str, Tensor]]:
        """Every cell's next batch: ids [K, B] and augmentation parameters [K·B] each; a full batch moves the
        counter on."""
        if last:
            return self.last, {n: v.view(-1) for n, v in self.last_params.items()}
        ids = self.full.index_select(0, self.counter).squeeze(0)
        params = {n: v.index_select(0, self.counter).view(-1) for n, v in self.full_params.items()}
        self.counter.add_(1)
        return ids, params


def group_inputs(group: Grouped, data: Dataset, batches: GroupBatches) -> list[Tensor]:
    """Every tensor a grouped step reads (``flctl.step.step_inputs`` of each cell, and the grouped model's own)."""
    return [*(t for c, b in zip(group.cells, batches.batches) for t in step_inputs(c, data, b)),
            batches.full, batches.last, *batches.full_params.values(), *batches.last_params.values(),
            *group.module.parameters(), *group.module.buffers(), group.epoch_losses,
            *(t for method, _ in group.methods for _, t in public_tensors(method)),
            *(group.optimizer.tensors() if group.optimizer is not None else [])]


def grouped_step(task: Task, group: Grouped, data: Dataset, batches: GroupBatches, last: bool) -> None:
    """One step of each of the cells, as ``flctl.step.cell_step`` of each alone: their next batches gathered and
    augmented as one, one grouped forward and backward, then each cell's own dual step, objective and optimizer
    step. Graph-safe, as cell_step (flctl.step): a captured step replays it whole."""
    cells = group.cells
    ids, params = batches.take(last)                                        # [K, B], {name: [K·B]}
    k, b = ids.shape
    flat = ids.view(-1)
    x = data.train.x.index_select(0, flat)                                  # [K·B, ...]
    if task.augment is not None:
        x = task.augment.apply(x, params)
    out = group.forward(x.view(k, b, *x.shape[1:]), cells[0].cfg.precision)  # [K, B, out]
    losses = per_sample_loss(task, out.reshape(k * b, *out.shape[2:]), data.train.y.index_select(0, flat))
    g = losses.view(k, b)
    objectives = []
    for method, rows in group.methods:           # a block's methods as one ([K', B] -> [K']), or one cell's ([B])
        g_rows, ids_rows = (g, ids) if rows is None else (g[rows], ids[rows])
        method.dual_step_(g_rows, ids_rows)
        objectives.append(method.primal_loss(g_rows, ids_rows))
    group.zero_grad()
    # cells share no parameter: each row gets its own objective's gradient
    (objectives[0] if len(objectives) == 1 else torch.stack([o.sum() for o in objectives])).sum().backward()
    if group.optimizer is not None:          # every cell's optimizer step as one, on the grouped gradients
        group.optimizer.step()
    else:
        for c in cells:
            c.optimizer.zero_grad(set_to_none=True)
        group.hand_out_grads()
        for c in cells:
            c.optimizer.step()
    group.epoch_losses.scatter_(1, ids, g.detach())
