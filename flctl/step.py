"""The training step: one alternating GDA step of one cell (dual step first, then the primal step with λ_{t+1}).

The step is graph-safe, so that on CUDA it can be captured once and replayed (``CapturedStep``) or compiled
(``compile_objective``) with the numbers of the eager step:

- a cell's batches of an epoch sit in static device buffers (``EpochBatches``), filled once per epoch; the step
  takes its ids (and augmentation parameters, drawn at the same time from the cell's own generator) by a
  device-side step counter. The last, partial batch is a shape of its own with its own buffers: every multiplier
  is visited every epoch, and nothing is padded (padding would move BatchNorm statistics);
- hyper-parameters are 0-dim device tensors (flctl.methods; the CUDA learning rate, flctl.cell.build_optimizer);
- state (multipliers, nuPI's ξ, epoch losses, BatchNorm statistics, optimizer state) changes in place only;
- nothing in an epoch's steps reads a device value on the host.

``flctl.grouped.step.grouped_step`` is the step of several cells of one architecture as one grouped model.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from flctl.data import Dataset
from flctl.errors import is_fatal_device_error
from flctl.losses import model_output, per_sample_loss
from flctl.tasks import Augment, Task

if TYPE_CHECKING:
    from flctl.cell import Cell
    from flctl.config import RunConfig

# Steps each batch shape runs eagerly before its capture: they are real training steps, and they let lazily
# created state (optimizer moments, cuBLAS workspaces, the autograd graph's buffers) exist before capture.
WARMUP_STEPS = 3


def step_engine(cfg: RunConfig, task: Task, device: torch.device) -> str:
    """The engine a cell's steps run on. ``auto`` is captured on CUDA (the host then launches a step as one graph
    replay instead of ~340 ops; the same kernels, so the same numbers), except where a replay cannot equal the eager
    step: a pruned run's epochs change their batches, and DPO's transformer step is not graph-safe. Else eager."""
    if cfg.engine != "auto":
        return cfg.engine
    capturable = cfg.prune_after == 0 and task.kind != "preference"
    return "captured" if device.type == "cuda" and capturable else "eager"


def step_objective(task: Task, model: torch.nn.Module, method, x: Tensor, y: Tensor, ids: Tensor,
                   precision: str = "auto") -> tuple[Tensor, Tensor]:
    """Forward, per-sample losses g [B], the dual step on λ[ids], and the primal objective (a scalar) to
    back-propagate: the graph-safe part of a step that ``torch.compile(fullgraph=True)`` takes whole."""
    losses = per_sample_loss(task, model_output(model, x, precision), y)   # [B]
    method.dual_step_(losses, ids)                  # λ[ids] moves; no-op for ERM/CSERM
    return method.primal_loss(losses, ids), losses.detach()                 # mean g, CSERM, or Σ λ g


def train_step(task: Task, model: torch.nn.Module, method, optimizer: torch.optim.Optimizer,
               x: Tensor, y: Tensor, ids: Tensor, micro_batch: int = 0, precision: str = "auto",
               objective: Callable[..., tuple[Tensor, Tensor]] = step_objective) -> Tensor:
    """One alternating GDA step: dual step first, then the primal step with lambda_{t+1}. Returns g [B].

    With ``micro_batch`` the batch is processed in chunks whose gradients accumulate before the one optimizer
    step. Every chunk is evaluated at the same parameters and each multiplier depends only on its own sample's
    loss, so the dual steps and the accumulated gradient are those of the whole batch. ``objective``:
    ``step_objective`` or its compiled form.
    """
    optimizer.zero_grad(set_to_none=True)
    size = len(ids)
    chunk = micro_batch if 0 < micro_batch < size else size
    losses_out = []
    for start in range(0, size, chunk):
        part = slice(start, start + chunk)
        loss, losses = objective(task, model, method, x[part], y[part], ids[part], precision)
        if chunk < size and method.reduction == "mean":
            loss = loss * (len(losses) / size)          # this chunk's share of the batch mean
        loss.backward()
        losses_out.append(losses)
    optimizer.step()
    return losses_out[0] if len(losses_out) == 1 else torch.cat(losses_out)


class EpochBatches:
    """One cell's batches of an epoch in static device buffers: ids [S, B] of the full batches and [R] of the last
    partial one (R = N mod B), with their augmentation parameters, and the device-side counter of the next full
    batch. ``fill`` runs once per epoch, eagerly; ``take`` is what the step reads (graph-safe).

    Every buffer is allocated once and refilled in place: a captured step (``CapturedStep``) reads them by address,
    and a buffer made anew would leave its graph reading freed memory. Only a new epoch length (pruning) reallocates
    them; ``CapturedStep.check`` sees that and captures again."""

    def __init__(self, batch_size: int, device: torch.device) -> None:
        self.batch_size, self.device = batch_size, device
        self.full = torch.empty(0, batch_size, dtype=torch.long, device=device)
        self.last = torch.empty(0, dtype=torch.long, device=device)
        self.full_params: dict[str, Tensor] = {}
        self.last_params: dict[str, Tensor] = {}
        self.counter = torch.zeros(1, dtype=torch.long, device=device)

    @property
    def shapes(self) -> list[bool]:
        """The epoch's steps in order, as ``last`` flags: S full batches, then the partial one if any."""
        return [False] * len(self.full) + [True] * bool(len(self.last))

    def buffers(self) -> list[Tensor]:
        """Every tensor ``take`` reads."""
        return [self.full, self.last, self.counter, *self.full_params.values(), *self.last_params.values()]

    def fill(self, order: Tensor, augment: Augment | None, generator: torch.Generator | None) -> None:
        """Copy the epoch's order into the buffers (reallocated only when its length changes: pruning) and draw the
        augmentation parameters batch after batch, as an augmentation drawing inside each step would."""
        b = self.batch_size
        steps, rest = divmod(len(order), b)
        if self.full.shape[0] != steps or len(self.last) != rest:
            self.full = torch.empty(steps, b, dtype=torch.long, device=self.device)
            self.last = torch.empty(rest, dtype=torch.long, device=self.device)
            self.full_params, self.last_params = {}, {}
        # From pinned memory, asynchronously: a pageable host-to-device copy waits for the device.
        host = order.pin_memory() if self.device.type == "cuda" and not order.is_cuda else order
        self.full.copy_(host[:steps * b].view(steps, b), non_blocking=True)
        self.last.copy_(host[steps * b:], non_blocking=True)
        if augment is not None:
            assert generator is not None
            # Drawn in the step order (the same numbers as drawing inside each step), then copied into the buffers:
            # the draws are new tensors, the buffers stay where the captured step reads them.
            drawn = [augment.draw(b, generator, self.device) for _ in range(steps)]
            _refill(self.full_params, {k: torch.stack([d[k] for d in drawn]) for k in drawn[0]} if drawn else {})
            _refill(self.last_params, augment.draw(rest, generator, self.device) if rest else {})
        self.counter.zero_()

    def take(self, last: bool) -> tuple[Tensor, dict[str, Tensor]]:
        """The next batch's ids and augmentation parameters; a full batch moves the counter on."""
        if last:
            return self.last, self.last_params
        ids = self.full.index_select(0, self.counter).view(-1)
        params = {k: v.index_select(0, self.counter).squeeze(0) for k, v in self.full_params.items()}
        self.counter.add_(1)
        return ids, params


def _refill(buffers: dict[str, Tensor], values: dict[str, Tensor]) -> None:
    """``values`` into ``buffers`` in place; a buffer is made only the first time (or after a reallocation)."""
    for k, v in values.items():
        if k in buffers:
            buffers[k].copy_(v)
        else:
            buffers[k] = v


def step_inputs(cell: Cell, data: Dataset, batches: EpochBatches) -> list[Tensor]:
    """Every tensor a step of ``cell`` reads but does not make: the training split, the epoch's buffers, the model's
    parameters and buffers, the optimizer's state and tensor hyper-parameters, the method's multipliers, gains and
    controller state, the epoch losses and the pruner's state. A CUDA graph reads them by address, so they must
    stay where they were when it was captured (tests/test_gpu_faults.py holds this list complete)."""
    found = [data.train.x, data.train.y, cell.epoch_losses, *batches.buffers(), *cell.model.parameters(),
             *cell.model.buffers()]
    for group in cell.optimizer.param_groups:
        found += [v for v in group.values() if isinstance(v, Tensor)]
    for state in cell.optimizer.state.values():
        found += [v for v in state.values() if isinstance(v, Tensor)]
    found += _tensors_of(cell.method) + ([] if cell.pruner is None else _tensors_of(cell.pruner))
    return found


def public_tensors(obj: object, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
    """The tensors among an object's public attributes and theirs (a method's controller), by name. A ``_name`` is
    scratch a step makes for itself (FL's multipliers of the batch), not state it reads."""
    for name, value in vars(obj).items():
        if name.startswith("_"):
            continue
        if isinstance(value, Tensor):
            yield prefix + name, value
        elif hasattr(value, "__dict__") and not isinstance(value, type):
            yield from public_tensors(value, f"{prefix}{name}.")


def _tensors_of(obj: object) -> list[Tensor]:
    return [t for _, t in public_tensors(obj)]


def layouts(tensors: Sequence[Tensor]) -> list[tuple]:
    """What a CUDA graph baked in of each tensor it reads: its address (with its offset), shape and strides."""
    return [(t.data_ptr(), tuple(t.shape), t.stride()) for t in tensors]


def cell_step(cell: Cell, task: Task, data: Dataset, batches: EpochBatches, last: bool,
              objective: Callable[..., tuple[Tensor, Tensor]] = step_objective) -> None:
    """One step of ``cell`` on its next batch: gather, augment, ``train_step``, keep each sample's loss."""
    ids, params = batches.take(last)
    x, y = data.train.x.index_select(0, ids), data.train.y.index_select(0, ids)   # [B, ...], [B]
    if task.augment is not None:
        x = task.augment.apply(x, params)
    losses = train_step(task, cell.model, cell.method, cell.optimizer, x, y, ids, cell.cfg.micro_batch,
                        cell.cfg.precision, objective)
    cell.epoch_losses.index_copy_(0, ids, losses)
    if cell.pruner is not None:        # pruning runs train eagerly and alone (their epochs change length)
        cell.pruner.visited(ids, cell.method.satisfied(losses, ids))


class CapturedStep:
    """A step replayed as a CUDA graph: ``WARMUP_STEPS`` eager calls (real steps) on the worker's stream, then one
    capture, replayed from then on. One per cell and batch shape; each has its own memory pool (the shapes'
    graphs are not replayed in the order they were captured, so they cannot share one).

    A graph reads its inputs by the addresses they had at capture. ``inputs()`` lists them (``step_inputs``); the
    capture records where they live, and ``check()``, run on the host at each epoch's start, drops the graph when
    any has moved, so the next call captures it again instead of replaying reads of freed memory."""

    def __init__(self, step: Callable[[], None], stream: torch.cuda.Stream,
                 inputs: Callable[[], list[Tensor]], fallback: bool = False) -> None:
        self.step, self.stream, self.inputs = step, stream, inputs
        self.calls = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.captured_at: list[tuple] = []        # layouts(inputs()) when the graph was captured
        self.recaptures = 0
        # engine auto: a capture that fails (an op the step gained that a graph cannot hold) leaves the run eager,
        # with a warning, instead of failing it; --engine captured asked for graphs, and fails.
        self.fallback, self.eager = fallback, False

    def check(self) -> None:
        """Drop the graph if an input it reads has moved since its capture (a host-side comparison of addresses)."""
        if self.graph is not None and layouts(self.inputs()) != self.captured_at:
            self.graph, self.captured_at = None, []
            self.recaptures += 1

    def __call__(self) -> None:
        if self.graph is not None:
            self.graph.replay()
            return
        if self.calls < WARMUP_STEPS or self.eager:
            self.calls += 1
            self.step()
            return
        # The step begins with zero_grad(set_to_none=True), so the captured backward allocates the gradients in
        # the graph's own pool, and every replay writes them there.
        self.captured_at = layouts(self.inputs())
        self.graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(self.graph, stream=self.stream):
                self.step()
        except Exception as exc:
            self.graph, self.captured_at = None, []
            if not self.fallback or is_fatal_device_error(exc):
                raise
            # Capturing runs no kernel: the step has not run yet, and runs now, eagerly.
            why = (str(exc).strip().splitlines() or [""])[0][:160]
            print(f"flctl: warning: the step cannot be captured as a CUDA graph ({type(exc).__name__}: {why}); "
                  "it runs eager", file=sys.stderr, flush=True)
            self.eager = True
            self.step()
            return
        self.graph.replay()                 # capturing runs nothing: this is the step's real run


def compile_objective() -> Callable[..., tuple[Tensor, Tensor]]:
    """``step_objective`` compiled whole (fullgraph: a graph break would be an error, not a slow path). Its kernels
    fuse and round differently from eager ones: the engine is part of a run's identity."""
    # Every cell of a process compiles its own specialization (its model, method, batch shapes): with cells trained
    # together these pass dynamo's default limit of 8, beyond which it would fall back to eager without a word.
    config = torch._dynamo.config
    limit = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, limit, max(getattr(config, limit), 64))
    return torch.compile(step_objective, fullgraph=True)
