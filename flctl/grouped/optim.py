"""The optimizer steps of K grouped cells (flctl.grouped.model) as one: a few multi-tensor ops over the group's
[K, ...] tensors, whatever K, where each cell's own optimizer would take one call (and, on the CPU, a dozen host
reads of its step counts) per cell. With 64 two-moons cells those per-cell calls were a third of a step.

Each row is one cell, with its own learning rate, weight decay and momentum ([K] tensors broadcast over its row), so
every row moves as the cell's own torch optimizer would move it (torch's rules, written out below in torch's order
of operations, so that on the CPU a row equals the cell's foreach step up to float rounding of the bias
corrections). The cells' optimizer states become views of the rows of the group's, as their parameters are
(``Grouped``): each cell still checkpoints, and resumes, its own.

AdamW (decoupled weight decay; torch's defaults as flctl.cell.ADAMW_FIXED pins them), for each row with step t:

    t ← t + 1
    θ ← θ · (1 − lr·wd)
    m ← m + (g − m)(1 − β1)                                    (lerp)
    v ← β2·v + (1 − β2)·g²
    θ ← θ + (−lr / (1 − β1ᵗ)) · m / (√v / √(1 − β2ᵗ) + ε)

SGD (dampening 0, no Nesterov, as flctl.cell.SGD_FIXED pins them):

    g ← g + wd·θ
    b ← μ·b + g          (b starts at 0, so the first step's b is g, as torch's clone of g)
    θ ← θ + (−lr)·b      (b is g itself where μ = 0: torch keeps no buffer then, nor does the group)

Learning rates are read from the cells' optimizers at each epoch's start (``refresh``), after their schedulers
moved them; cells whose schedule moves every step (warm-up) step alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from flctl.cell import ADAMW_FIXED, SGD_FIXED

if TYPE_CHECKING:
    from flctl.cell import Cell


def _row_shape(rows: Tensor) -> list[int]:
    """A [K] factor's shape to broadcast over ``rows`` [K, ...]."""
    return [rows.shape[0]] + [1] * (rows.dim() - 1)


def _fixed(cell: Cell) -> tuple | None:
    """What must be equal among cells whose optimizers step as one: their class and the settings kept as Python
    values; None where a cell's optimizer is not one this module steps."""
    opt = cell.optimizer
    if type(opt) not in (torch.optim.AdamW, torch.optim.SGD) or len(opt.param_groups) != 1 or cell.schedule_per_step:
        return None
    group = opt.param_groups[0]
    if type(opt) is torch.optim.AdamW:
        if any(group.get(k) != v for k, v in ADAMW_FIXED.items()) or group.get("maximize"):
            return None
        return ("adamw",)
    if any(group.get(k) != v for k, v in SGD_FIXED.items()) or group.get("maximize"):      # SGD
        return None
    return ("sgd", group["momentum"] != 0)


class GroupedOptimizer:
    """The optimizer steps of ``cells`` (a group's, in its row order) over the grouped parameters ``params``: each
    (grouped leaf [K·n, ...] or [K, ...], the cells' own parameters that are views of its rows)."""

    def __init__(self, cells: Sequence[Cell], params: Sequence[tuple[Tensor, list[Tensor]]]) -> None:
        self.cells = list(cells)
        self.k = k = len(cells)
        self.kind = _fixed(cells[0])
        self.leaves = [leaf for leaf, _ in params]
        for c in cells:       # their schedulers' "step() before optimizer.step()" check: the group steps for them
            c.optimizer._opt_called = True  # type: ignore[attr-defined]
        # each leaf seen row by row, [K, ...]: a leaf [K·n, ...] split along its first dimension (always a view)
        self.rows = [leaf if leaf.dim() > own[0].dim() else leaf.unflatten(0, (k, -1)) for leaf, own in params]
        device, dtype = self.leaves[0].device, self.leaves[0].dtype
        groups = [c.optimizer.param_groups[0] for c in cells]
        # per row, in float64 as torch works them out in Python floats: lr (refresh), weight decay, momentum
        self.lr = torch.zeros(k, dtype=torch.float64, device=device)
        self.wd = torch.tensor([g["weight_decay"] for g in groups], dtype=torch.float64).to(device)
        own_params = list(zip(*(own for _, own in params)))             # each cell's parameters, leaf by leaf
        names = {("adamw",): ["exp_avg", "exp_avg_sq"], ("sgd", True): ["momentum_buffer"]}.get(self.kind or (), [])
        self.state = {name: [self._alias(own, leaf, name) for leaf, own in params] for name in names}
        self.state_rows = {name: [t if t.dim() == r.dim() else t.unflatten(0, (k, -1)) for t, r in zip(ts, self.rows)]
                           for name, ts in self.state.items()}
        # [K] factors in the parameters' dtype, seen by each leaf as [K, 1, ...] (views: set once, filled in place)
        self.factors = {name: torch.zeros(k, dtype=dtype, device=device)
                        for name in (("decay", "step_size", "bc2_sqrt") if self.kind == ("adamw",) else
                                     ("wd", "momentum", "neg_lr"))}
        self.per_leaf = {name: [f.view(_row_shape(r)) for r in self.rows] for name, f in self.factors.items()}
        if self.kind == ("adamw",):
            # each cell's parameters' step counts [K, P] (each parameter keeps a 0-dim tensor of its own, as in torch),
            # and the cells' counts in float64 for the bias corrections
            fused = bool(groups[0].get("fused"))
            count_dtype = torch.float64 if torch.get_default_dtype() == torch.float64 and not fused else torch.float32
            # read in one go: a device tensor per parameter read alone would be a host sync each
            counts = [torch.as_tensor(c.optimizer.state[p].get("step", 0.0), dtype=count_dtype, device=device)
                      for c, ps in zip(cells, own_params) for p in ps]
            self.steps = torch.stack(counts).view(k, -1)
            for i, (c, ps) in enumerate(zip(cells, own_params)):
                for j, p in enumerate(ps):
                    c.optimizer.state[p]["step"] = self.steps[i, j]
            self.t = self.steps[:, 0].to(torch.float64, copy=True)      # (a copy even where steps are float64)
        else:
            self.factors["wd"].copy_(self.wd)
            self.factors["momentum"].copy_(torch.tensor([g["momentum"] for g in groups], dtype=torch.float64))
        self.refresh()

    def _alias(self, own: list[Tensor], leaf: Tensor, name: str) -> Tensor:
        """The group's state ``name`` for ``leaf``: the cells' (zeros where a cell has none yet), each cell's made a
        view of its row."""
        grouped = torch.zeros_like(leaf)
        rows = grouped.unbind(0) if leaf.dim() > own[0].dim() else grouped.chunk(self.k)
        for c, p, row in zip(self.cells, own, rows):
            state = c.optimizer.state[p]
            if state.get(name) is not None:
                row.copy_(state[name])
            state[name] = row
        return grouped

    @torch.no_grad()
    def refresh(self) -> None:
        """Read each cell's learning rate (a Python float, or a 0-dim tensor its scheduler fills in place): at each
        epoch's start, after the schedulers stepped."""
        lrs = [c.optimizer.param_groups[0]["lr"] for c in self.cells]
        self.lr.copy_(torch.stack(lrs) if isinstance(lrs[0], Tensor) else torch.tensor(lrs, dtype=torch.float64))
        if self.kind == ("adamw",):
            self.factors["decay"].copy_(1 - self.lr * self.wd)
        else:
            self.factors["neg_lr"].copy_(-self.lr)

    def tensors(self) -> list[Tensor]:
        """Every tensor a step reads (a captured step's inputs: flctl.grouped.step.group_inputs)."""
        found = [self.lr, self.wd, *(t for ts in self.state.values() for t in ts), *self.factors.values()]
        return found + ([self.steps, self.t] if self.kind == ("adamw",) else [])

    @torch.no_grad()
    def step(self) -> None:
        grads = [g if leaf.dim() == r.dim() else g.unflatten(0, (self.k, -1))
                 for leaf, r in zip(self.leaves, self.rows) if (g := leaf.grad) is not None]
        # A groupable model (flctl.grouped.model.groupable: linear, convolution, BatchNorm, in sequence or a ResNet)
        # uses every parameter in every step; one without a gradient would pair the others' gradients with the wrong
        # rows.
        if len(grads) != len(self.rows):
            raise RuntimeError(f"{len(self.rows) - len(grads)} grouped parameter(s) got no gradient this step")
        if self.kind == ("adamw",):
            self._adamw(grads)
        else:
            self._sgd(grads)

    def _adamw(self, grads: list[Tensor]) -> None:
        beta1, beta2 = ADAMW_FIXED["betas"]
        f, per = self.factors, self.per_leaf
        self.steps.add_(1)
        self.t.add_(1)
        # −lr / (1 − β1ᵗ) written as lr / (β1ᵗ − 1) (the same float), and √(1 − β2ᵗ)
        torch.div(self.lr, torch.pow(beta1, self.t).sub_(1), out=f["step_size"])
        torch.sqrt(torch.pow(beta2, self.t).neg_().add_(1), out=f["bc2_sqrt"])
        m, v = self.state_rows["exp_avg"], self.state_rows["exp_avg_sq"]
        torch._foreach_mul_(self.rows, per["decay"])
        torch._foreach_lerp_(m, grads, 1 - beta1)
        torch._foreach_mul_(v, beta2)
        torch._foreach_addcmul_(v, grads, grads, 1 - beta2)
        denom = torch._foreach_sqrt(v)
        torch._foreach_div_(denom, per["bc2_sqrt"])
        torch._foreach_add_(denom, ADAMW_FIXED["eps"])
        torch._foreach_addcdiv_(self.rows, torch._foreach_mul(m, per["step_size"]), denom)

    def _sgd(self, grads: list[Tensor]) -> None:
        per = self.per_leaf
        step: list[Tensor] = list(torch._foreach_add(grads, torch._foreach_mul(self.rows, per["wd"])))
        if self.kind == ("sgd", True):
            b = self.state_rows["momentum_buffer"]
            torch._foreach_mul_(b, per["momentum"])
            torch._foreach_add_(b, step)
            step = b
        torch._foreach_add_(self.rows, torch._foreach_mul(step, per["neg_lr"]))


def grouped_optimizer(cells: Sequence[Cell], params: Sequence[tuple[Tensor, list[Tensor]]]
                      ) -> GroupedOptimizer | None:
    """One optimizer step for the group's cells, or None where their optimizers must step each alone: not all
    AdamW, or not all SGD with momentum (or all without), with flctl's fixed settings, one parameter group, an
    epoch schedule; or a parameter of a cell outside the grouped ones."""
    kinds = {_fixed(c) for c in cells}
    if len(kinds) != 1 or None in kinds:
        return None
    grouped = {id(p) for _, own in params for p in own}
    if any(id(p) not in grouped for c in cells for p in c.optimizer.param_groups[0]["params"]):
        return None
    return GroupedOptimizer(cells, params)
