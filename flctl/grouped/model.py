"""K cells of one architecture trained as one grouped model: one launch per op for all K, not K launches.

K copies of a network are one network whose channels are the K copies' channels side by side:

- a convolution with ``groups`` × K (each group sees its own cell's input channels only);
- BatchNorm over K·C channels (its statistics are per channel, so each cell's are its own);
- a linear layer as one batched matrix product ([K, B, in] @ [K, in, out]);
- per-channel and elementwise layers (ReLU, pooling, flatten, the input's normalization) as they are.

Cells share no number: each group of channels reads its own cell's inputs and parameters only, and the gradient of
the sum of the cells' objectives is, row by row, each cell's own gradient. The grouped kernels sum in another order
than the cells' own, so a cell's numbers equal those of the cell trained alone up to float rounding
(tests/test_grouped.py states and holds the tolerances).

Each cell keeps its modules and optimizer: each of its parameters and buffers becomes a view of its row of a grouped
tensor [K, ...], so its optimizer steps, checkpoint, evaluation and records read and change its own row in place. So
do its epoch losses and, where its method's class ``groups`` (flctl.methods.Method), its method's multipliers and
hyper-parameters: the cells of one such class take their dual step and objective as one (flctl.grouped.methods).
(The earlier way, ``torch.vmap`` over the cells' copies, dispatched 4.5× the ops of one cell for a ResNet: its
batching rules move dimensions around every layer.)
"""


from __future__ import annotations

import copy
import itertools
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor, nn

from flctl.data import Normalize
from flctl.grouped.methods import group_key, group_methods, say_cell_by_cell
from flctl.grouped.optim import grouped_optimizer
from flctl.grouped.policy import groups_on
from flctl.grouped.rows import side_by_side
from flctl.losses import model_output
from flctl.tasks import Task

if TYPE_CHECKING:
    from flctl.cell import Cell
    from flctl.methods import Method

# Layers whose work is per channel or per element, and containers whose forward only chains their children: a
# grouped copy runs them as they are.
AS_THEY_ARE: tuple[type[nn.Module], ...] = (nn.Sequential, nn.ReLU, nn.Identity, nn.MaxPool2d, nn.AvgPool2d,
                                            nn.AdaptiveAvgPool2d, nn.Flatten, Normalize)


def _resnet_types() -> tuple[type[nn.Module], ...]:
    """torchvision's ResNet and its blocks (a forward of convolutions, BatchNorm, ReLU, pooling, flatten, a linear
    head and residual sums), when torchvision is imported: a model made of them imported it."""
    resnet = sys.modules.get("torchvision.models.resnet")
    return () if resnet is None else (resnet.ResNet, resnet.BasicBlock, resnet.Bottleneck)


def groupable(model: nn.Module) -> bool:
    """Whether K copies of ``model`` can run as one grouped model: every module one whose grouped copy computes each
    copy's numbers (an unknown layer, dropout's random draws or a cumulative BatchNorm average cannot)."""
    known = AS_THEY_ARE + _resnet_types()
    for m in model.modules():
        if isinstance(m, (nn.Conv1d, nn.Conv2d)):
            ok = m.padding_mode == "zeros"
        elif isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
            ok = m.track_running_stats and m.momentum is not None
        elif isinstance(m, nn.Flatten):
            ok = m.start_dim == 1 and m.end_dim == -1
        else:
            ok = type(m) is nn.Linear or isinstance(m, known)
        if not ok:
            return False
    return True


class GroupedLinear(nn.Module):
    """K linear layers as one batched matrix product, each cell's samples through its own weight [out, in]. Input
    [K, in, B] -> [K, out, B] when every layer of the model is linear or elementwise (``by_cell``, an MLP: its
    activations stay [K, F, B] from input to output, one transpose in and one out); otherwise [B, K·in] ->
    [B, K·out], the cells' features side by side as a grouped convolution's channels are. (A grouped 1×1 convolution
    dispatches fewer ops than the second form, 6 against 16, but its CPU kernel took 5.6× as long on two-moons'
    layers.)"""

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)                        # [K, out, in]
        self.bias = None if bias is None else nn.Parameter(bias)  # [K, out]
        self.by_cell = False                                      # [K, in, B] (set by Grouped), else [B, K·in]

    def forward(self, x: Tensor) -> Tensor:
        k, out_features, in_features = self.weight.shape
        if self.by_cell:        # [K, in, B] -> [K, out, B]: W x, whose weight gradient comes out in W's own layout
            return torch.bmm(self.weight, x) if self.bias is None else torch.baddbmm(self.bias.unsqueeze(2),
                                                                                     self.weight, x)
        xk = x.view(-1, k, in_features).transpose(0, 1)                                  # [K, B, in]
        wt = self.weight.transpose(1, 2)                                                   # [K, in, out]
        y = torch.bmm(xk, wt) if self.bias is None else torch.baddbmm(self.bias.unsqueeze(1), xk, wt)
        return y.transpose(0, 1).reshape(-1, k * out_features)                            # [B, K·out]



def in_rows(cells: Sequence[Cell]) -> list[Cell]:
    """``cells`` in their grouped model's row order: by method, so that the cells of a class that groups are a block
    of rows (``methods``); in the order given within a class."""
    return sorted(cells, key=lambda c: group_key(c.method))


class Grouped:
    """The grouped model of ``cells`` (K cells' models of one architecture, ``groupable``), whose parameters and
    buffers the cells' own modules now view row by row (``in_rows``)."""

    def __init__(self, cells: Sequence[Cell]) -> None:
        self.given = list(cells)
        self.cells = cells = in_rows(cells)
        models = [c.model for c in cells]
        self.k = k = len(models)
        self.module = copy.deepcopy(models[0])        # the structure; every tensor of it is replaced below
        self.module.train()
        # (grouped leaf, the cells' tensors): where each step's gradients go
        self.params: list[tuple[Tensor, list[Tensor]]] = []
        for name, m in list(self.module.named_modules()):
            mods = [model.get_submodule(name) for model in models]
            if type(m) is nn.Linear:
                weights, biases = _own(mods, "weight"), _own(mods, "bias") if m.bias is not None else []
                linear = GroupedLinear(self._alias(weights).view(k, *weights[0].shape),       # [K, out, in]
                                       self._alias(biases).view(k, -1) if biases else None)
                self._remember(linear.weight, weights)
                if linear.bias is not None:
                    self._remember(linear.bias, biases)
                if name:
                    parent, _, attr = name.rpartition(".")
                    setattr(self.module.get_submodule(parent), attr, linear)
                else:
                    self.module = linear
                continue
            if isinstance(m, Normalize):        # constants, the same for every cell: side by side along channels
                for attr in ("mean", "std"):
                    m._buffers[attr] = torch.cat(_own(mods, attr), dim=1)
                continue
            if isinstance(m, (nn.Conv1d, nn.Conv2d)):
                m.in_channels, m.out_channels, m.groups = k * m.in_channels, k * m.out_channels, k * m.groups
            elif isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                m.num_features *= k
            for attr, p in list(m._parameters.items()):
                if p is not None:
                    tensors = _own(mods, attr)
                    grouped = m._parameters[attr] = nn.Parameter(self._alias(tensors), requires_grad=p.requires_grad)
                    self._remember(grouped, tensors)
            for attr, b in list(m._buffers.items()):
                if b is not None:
                    m._buffers[attr] = self._alias(_own(mods, attr))
        # An MLP keeps each cell's samples apart, [K, F, B], from input to output (GroupedLinear): no layout changes
        self.by_cell = all(isinstance(m, (GroupedLinear, nn.Sequential, nn.ReLU, nn.Identity))
                           for m in self.module.modules())
        for m in self.module.modules():
            if isinstance(m, GroupedLinear):
                m.by_cell = self.by_cell
        # the cells' optimizer steps as one where their optimizers allow (flctl.grouped.optim), else each its own
        self.optimizer = grouped_optimizer(cells, self.params)
        self.epoch_losses = side_by_side(cells, "epoch_losses")                           # [K, N]
        # (method, its rows): a block of cells whose methods step as one (group_methods), or one cell's own method
        self.methods: list[tuple[Method, slice | int | None]] = []
        for key, block in itertools.groupby(range(k), lambda i: group_key(cells[i].method)):
            rows = list(block)
            if key[0]:
                self.methods.append((group_methods([cells[i].method for i in rows]),
                                     None if len(rows) == k else slice(rows[0], rows[-1] + 1)))
            else:           # a class that does not say it groups: told once (a slow step should not go unexplained)
                for i in rows:
                    say_cell_by_cell(type(cells[i].method))
                    self.methods.append((cells[i].method, i))

    def _alias(self, tensors: list[Tensor]) -> Tensor:
        """One grouped tensor of the cells' ``tensors`` (their values now), and each cell's tensor made a view of its
        row: the rows side by side along the first dimension, [K·n, ...] ([K] for scalars), as a grouped convolution
        or BatchNorm reads them. Rows keep the cells' strides (channels_last)."""
        if tensors[0].dim() == 0:
            grouped = torch.stack([t.detach() for t in tensors])
        else:
            grouped = torch.cat([t.detach() for t in tensors])
            memory_format = torch.channels_last if tensors[0].dim() == 4 and tensors[0].is_contiguous(
                memory_format=torch.channels_last) and not tensors[0].is_contiguous() else torch.contiguous_format
            grouped = grouped.contiguous(memory_format=memory_format)
        rows = grouped.view(self.k, *tensors[0].shape)
        for t, row in zip(tensors, rows.unbind(0)):
            t.data = row
        return grouped

    def _remember(self, leaf: Tensor, tensors: list[Tensor]) -> None:
        self.params.append((leaf, tensors))

    def zero_grad(self) -> None:
        for leaf, _ in self.params:
            leaf.grad = None

    def hand_out_grads(self) -> None:
        """Each cell's parameters' gradients: views of their rows of the grouped gradients (no copy; one op each)."""
        for leaf, tensors in self.params:
            if leaf.grad is not None:
                rows = leaf.grad.unbind(0) if leaf.dim() > tensors[0].dim() else leaf.grad.chunk(self.k)  # [K, ...]
                for t, g in zip(tensors, rows):
                    t.grad = g

    def forward(self, x: Tensor, precision: str) -> Tensor:
        """The K cells' outputs [K, B, ...] for their inputs ``x`` [K, B, C, ...]: the cells' channels side by side
        (images keep channels_last memory when the model has it), one forward, split back by cell."""
        k, b = x.shape[:2]
        if self.by_cell:                          # an MLP: [K, F, B] from input to output, so no layer copies
            if x.dim() != 3:
                raise ValueError(f"a grouped MLP takes [K, B, features], not {tuple(x.shape)}")
            return model_output(self.module, x.transpose(1, 2), precision).transpose(1, 2)      # [K, B, out]
        if x.dim() == 5 and x.is_cuda:      # [K, B, C, H, W] -> [B, K·C, H, W] in channels_last memory: one copy
            c, h, w = x.shape[2:]
            grouped = x.permute(1, 3, 4, 0, 2).reshape(b, h, w, k * c).permute(0, 3, 1, 2)
        else:
            grouped = x.movedim(0, 1).reshape(b, k * x.shape[2], *x.shape[3:])
        out = model_output(self.module, grouped, precision)            # [B, K·out]
        return out.view(b, k, -1).transpose(0, 1)                      # [K, B, out]


def trains_grouped(task: Task, cells: Sequence[Cell]) -> bool:
    """Whether ``cells``, together in one process, train as one grouped model: when their configuration and task
    allow it (flctl.grouped.policy.groups_on) and their model is ``groupable``."""
    c = cells[0]
    return groups_on(task, c.cfg, c.device.type) and groupable(c.model)

def _own(modules: Sequence[nn.Module], attr: str) -> list[Tensor]:
    """Each module's tensor ``attr`` (a parameter or buffer every one of them has)."""
    return [cast(Tensor, getattr(m, attr)) for m in modules]
