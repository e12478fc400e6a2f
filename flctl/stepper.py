"""How cells together step (``Stepper``): each cell's epoch buffers and step engine (eager, captured or compiled,
flctl.step), or one grouped step for all (flctl.grouped); the RNG streams each cell's work runs under; their one
CUDA stream (``worker_stream``). flctl.train's loop calls it: begin each cell's epoch, step every batch shape.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch

from flctl.cell import Cell
from flctl.data import Dataset, epoch_order
from flctl.devices import CAPTURED_ENGINES, COMPILED_ENGINES
from flctl.grouped.evaluate import evaluate_together
from flctl.grouped.model import Grouped, in_rows, trains_grouped
from flctl.grouped.step import GroupBatches, group_inputs, grouped_step
from flctl.step import (
    CapturedStep,
    EpochBatches,
    cell_step,
    compile_objective,
    step_engine,
    step_inputs,
    step_objective,
)
from flctl.tasks import Task


def worker_stream(device: torch.device) -> torch.cuda.Stream | None:
    """The one CUDA stream the cells' work runs on (None off CUDA); not the default stream: graphs are captured on a
    side stream, and warm-up, capture and replay on one stream share its lazily made workspaces."""
    return torch.cuda.Stream(device) if device.type == "cuda" else None


def cell_stream(device: torch.device) -> torch.cuda.Stream:
    """A CUDA stream of a cell's own (engine captured-streams), beside its group's."""
    return torch.cuda.Stream(device)


class Stepper:
    """How cells together step: each cell's epoch buffers and step functions (eager, captured or compiled), or
    one grouped step for all (flctl.grouped); the RNG streams each cell's work runs under, and their one CUDA
    stream."""

    def __init__(self, cells: list[Cell], task: Task, data: Dataset) -> None:
        self.task, self.data, self.cells = task, data, cells
        device = cells[0].device
        self.shared = len(cells) > 1                  # cells take turns with the global RNG streams
        self.grouping = self.shared and trains_grouped(task, cells)
        self.batches = {c.cfg.run_id: EpochBatches(c.cfg.batch_size, device) for c in cells}
        self.orders: dict[str, torch.Tensor] = {}
        self.device, self.stream = device, worker_stream(device)
        self.steps: dict[tuple[str, bool], Callable[[], None]] = {}
        self.engine = {c.cfg.run_id: step_engine(c.cfg, task, device) for c in cells}
        # captured-streams: each cell's steps on a stream of its own, between the epoch's two joins (docs/design.md)
        self.cell_streams = {c.cfg.run_id: cell_stream(device) for c in cells
                             if self.engine[c.cfg.run_id] == "captured-streams"}
        for c in cells:
            objective = compile_objective() if self.engine[c.cfg.run_id] in COMPILED_ENGINES else step_objective
            batches = self.batches[c.cfg.run_id]
            for last in (False, True):
                self.steps[c.cfg.run_id, last] = self._engine(
                    c, partial(cell_step, c, task, data, batches, last, objective),
                    partial(step_inputs, c, data, batches))
        self.group: Grouped | None = None                  # the grouped model of the cells stepping now, and its steps
        self.group_steps: dict[bool, Callable[[], None]] = {}
        self.group_batches: GroupBatches | None = None
        self.active: list[Cell] = []                         # the cells of the last step

    def _engine(self, c: Cell, step: Callable[[], None], inputs: Callable[[], list[torch.Tensor]]):
        """``step`` as cell ``c``'s engine runs it: as it is, or captured once and replayed."""
        if self.engine[c.cfg.run_id] not in CAPTURED_ENGINES:
            return step
        assert self.stream is not None      # captured is CUDA only (validated; auto resolves to it on CUDA only)
        return CapturedStep(step, self.cell_streams.get(c.cfg.run_id, self.stream), inputs,
                            fallback=c.cfg.engine == "auto")

    def trained_with(self, c: Cell) -> dict[str, Any]:
        """How ``c`` trained (the runs table's trained_with): its engine, the cells together and the device; grouped,
        also the run ids of the cells trained as one model, in the grouped model's row order (``cells``), which
        `flctl reproduce` trains again together (a grouped kernel rounds by its group)."""
        name = torch.cuda.get_device_name(c.device) if c.device.type == "cuda" else "cpu"
        if not self.grouping:
            return {"engine": self.engine[c.cfg.run_id], "cells_together": len(self.cells), "device": name}
        return {"engine": "grouped", "cells_together": len(self.cells), "device": name,
                "cells": [g.cfg.run_id for g in in_rows(self.cells)]}

    @contextlib.contextmanager
    def on_stream(self) -> Iterator[None]:
        """Run the cells' shared work on its stream: after what the default stream queued (data, models, resumed state),
        and before anything the caller queues on the default stream afterwards."""
        if self.stream is None:
            yield
            return
        caller = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(caller)
        try:
            with torch.cuda.stream(self.stream):
                yield
        finally:
            caller.wait_stream(self.stream)

    @contextlib.contextmanager
    def own(self, c: Cell) -> Iterator[None]:
        """Run ``c``'s work with its RNG streams in the globals, when cells share the process and step in turn.
        Grouped cells draw nothing from the global streams after they are built: a groupable model has no random
        layer (flctl.grouped.model.groupable), and epoch orders and augmentations come from generators seeded by seed
        and epoch. So their streams stay put aside (a cell checkpoints those), saving two swaps per cell and epoch: with
        50 two-moons cells a worker, 14 % of its time."""
        swapping = self.shared and not self.grouping
        if swapping:
            c.swap_rng_in()
        try:
            yield
        finally:
            if swapping:
                c.swap_rng_out()

    def check_captures(self, active: list[Cell]) -> None:
        """Before an epoch's replays: a captured step whose inputs moved (flctl.step.CapturedStep) is captured anew."""
        for step in [*self.steps.values(), *self.group_steps.values()]:
            if isinstance(step, CapturedStep):
                step.check()
        if self.group_batches is not None and not self.group_batches.holds():   # a fill made new buffers: group anew
            self.group = None
        if self.group is not None and self.group.optimizer is not None:   # the epoch's learning rates, as scheduled
            self.group.optimizer.refresh()
        self._join_in(active)

    def begin_epoch(self, c: Cell) -> None:
        """The epoch's order (seeded by seed and epoch; pruned samples left out) and augmentation, into the cell's
        static buffers."""
        if not c.model.training:    # only after an eval epoch: walking the modules every epoch adds up
            c.model.train()
        order = epoch_order(len(self.data.train), c.cfg.seed, c.epoch)
        if c.pruner is not None:
            order = c.pruner.epoch_order(order.to(c.device), c.epoch)
        self.orders[c.cfg.run_id] = order
        generator = None
        if self.task.augment is not None:
            generator = torch.Generator(device=c.device).manual_seed(c.cfg.seed * 7919 + c.epoch)
        self.batches[c.cfg.run_id].fill(order, self.task.augment, generator)

    def evaluations(self, cells: list[Cell]) -> dict[str, tuple[dict, dict]]:
        """The train and test evaluations of ``cells`` (those due this epoch), through one grouped forward when they
        step as a group now (flctl.grouped.evaluate); {} otherwise (each cell evaluates alone)."""
        group = self.group
        if not cells or group is None or not self.grouping or group.given != self.active:
            return {}
        split = {name: evaluate_together(self.task, group, getattr(self.data, name), cells[0].cfg.precision)
                 for name in ("train", "test")}
        wanted = {c.cfg.run_id for c in cells}
        return {c.cfg.run_id: (split["train"][i], split["test"][i]) for i, c in enumerate(group.cells)
                if c.cfg.run_id in wanted}

    def shapes(self, active: list[Cell]) -> list[bool]:   # cells together share batch size and training set
        return self.batches[active[0].cfg.run_id].shapes

    def step(self, active: list[Cell], last: bool) -> None:
        self.active = active
        if self.grouping and len(active) > 1:
            self._group_step(active, last)
            return
        for c in active:
            with self.own(c), self._on_own_stream(c):
                self.steps[c.cfg.run_id, last]()
        self._join_out(active)

    def _join_in(self, active: list[Cell]) -> None:
        """The epoch's join in: each cell's own stream after what the shared stream set up for its epoch."""
        for c in active:
            if (own := self.cell_streams.get(c.cfg.run_id)) is not None:
                own.wait_stream(self.stream)  # type: ignore[arg-type]  # a cell stream is made on CUDA only

    def _join_out(self, active: list[Cell]) -> None:
        """After a round of steps: what the shared stream does next comes after each cell's step."""
        for c in active:
            if (own := self.cell_streams.get(c.cfg.run_id)) is not None:
                self.stream.wait_stream(own)  # type: ignore[union-attr]  # as is the shared stream then

    @contextlib.contextmanager
    def _on_own_stream(self, c: Cell) -> Iterator[None]:
        """Run ``c``'s step on its own stream (captured-streams), else where the cells' shared work runs."""
        own = self.cell_streams.get(c.cfg.run_id)
        if own is None:
            yield
            return
        with torch.cuda.stream(own):
            yield

    def _group_step(self, active: list[Cell], last: bool) -> None:
        """A grouped step of the active cells (flctl.grouped.step); their group is made anew when one leaves (it keeps
        its rows)."""
        if self.group is None or self.group.given != active:
            self.group = group = Grouped(active)
            self.group_batches = batches = GroupBatches([self.batches[c.cfg.run_id] for c in group.cells])
            self.group_steps = {shape: self._engine(
                active[0], partial(grouped_step, self.task, group, self.data, batches, shape),
                partial(group_inputs, group, self.data, batches)) for shape in (False, True)}
        self.group_steps[last]()
