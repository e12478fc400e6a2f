"""One cell's training state in one place: what ``Cell.build`` sets up from a RunConfig, what the loop moves on,
and its ``state_dict()`` / ``load_state_dict()``, which *are* the checkpoint format (``runs/<id>/checkpoint.pt``).

The checkpoint keys are those written since the first release (tests/data/checkpoint-2026-11-23.pt resumes):
epoch, history, model, optimizer, scheduler, method, torch_rng, cuda_rng, py_rng, np_rng, pruner, samples_seen,
epoch_losses.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flctl.config import RunConfig
from flctl.data import Dataset
from flctl.fs import make_below
from flctl.layout import RunFolder
from flctl.methods import Method, NuPI, get_method
from flctl.pruning import Pruner
from flctl.records.run_folder import host_copy, set_aside
from flctl.status import Status, blamed
from flctl.tasks import Task


@dataclass
class RunResult:
    run_id: str
    # Status.TRAINING while it trains, then COMPLETED | DIVERGED | STOPPED (asked to, checkpointed) | LOST (claim
    # taken over)
    status: Status
    epochs_done: int
    metrics: dict[str, float]                    # flattened final summary: "train.avg_loss", ...
    history: list[dict[str, Any]] = field(default_factory=list)
    diverged_at: dict[str, int] | None = None    # {"epoch": e, "step": global step} of the first non-finite loss
    lambda_capped: int = 0                       # multipliers held at LAMBDA_CAP at the end (infeasible FL)
    artifacts: dict[str, str] = field(default_factory=dict)
    resumed_from: int = 0                        # epoch the run resumed from (0 = fresh start)
    # how it was trained: {"engine": eager | captured | compiled | grouped, "cells_together": K, "device": its name}
    trained_with: dict[str, Any] = field(default_factory=dict)


# torch's defaults for the arguments no run field sets, given rather than inherited: a torch that changed one would
# change every run's numbers unseen (flctl.versions records the torch a run had).
SGD_FIXED: dict[str, Any] = dict(dampening=0.0, nesterov=False)
ADAMW_FIXED: dict[str, Any] = dict(betas=(0.9, 0.999), eps=1e-8, amsgrad=False)


def build_optimizer(cfg: RunConfig, params, device: torch.device | str = "cpu",
                    fused: bool | None = None) -> torch.optim.Optimizer:
    """The primal optimizer. On the CPU: foreach kernels (one multi-tensor kernel per update instead of a Python loop
    over parameters; bitwise equal, and 5 % faster on two-moons), learning rate a Python float. On CUDA (``fused``:
    the CUDA kind anywhere, as benchmarks/bench_step_cost.py counts a CUDA step's ops on a CPU): the fused kernels,
    one launch per update, with the learning rate as a 0-dim device tensor, which the scheduler fills in place, so a
    captured step reads each epoch's value and never syncs with the host (foreach would turn a tensor lr into a host
    scalar)."""
    if torch.device(device).type == "cuda" if fused is None else fused:
        lr: Any = torch.tensor(cfg.lr, dtype=torch.float32, device=device)
        if cfg.optimizer == "sgd":
            return torch.optim.SGD(params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, fused=True,
                                   **SGD_FIXED)
        return torch.optim.AdamW(params, lr=lr, weight_decay=cfg.weight_decay, fused=True, **ADAMW_FIXED)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                               foreach=True, **SGD_FIXED)
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=True, **ADAMW_FIXED)


def build_scheduler(cfg: RunConfig, optimizer: torch.optim.Optimizer, steps_per_epoch: int):
    """The learning-rate schedule and whether it moves every step (True) or every epoch (False).

    Without warmup, cosine anneals per epoch (torch's CosineAnnealingLR, as the paper's vision runs). With
    warmup (the paper's DPO runs, through transformers' Trainer), the factor moves per optimizer step: linear
    from 0 over ``warmup_steps``, then cosine (or constant) down to 0 at the last step.
    """
    if cfg.warmup_steps == 0:
        if cfg.scheduler == "cosine":
            return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=cfg.epochs), False
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0), False
    warmup, total = cfg.warmup_steps, cfg.epochs * steps_per_epoch

    def factor(step: int) -> float:
        if step < warmup:
            return step / warmup
        if cfg.scheduler == "constant":
            return 1.0
        progress = (step - warmup) / max(1, total - warmup)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor), True


@dataclass
class Cell:
    """One run's state while it trains: model (with its BatchNorm buffers), optimizer, schedule, method (with its
    multipliers and nuPI state), pruner, RNG streams, epoch losses and progress."""

    cfg: RunConfig
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any                               # a torch.optim.lr_scheduler.LRScheduler
    schedule_per_step: bool
    method: Method
    run_dir: Path
    result: RunResult
    epoch: int                                   # the next epoch to train (epochs done so far)
    epoch_losses: torch.Tensor                   # this epoch's training loss per sample id (pruned: last visit's)
    pruner: Pruner | None = None                 # --prune-after: the samples left out of the epoch order
    samples_seen: int = 0                        # per-sample losses back-propagated so far (all epochs)
    last_save: float = field(default_factory=time.monotonic)
    # The cell's torch RNG streams while another cell of its group draws from the global ones (see ``own_rng``);
    # None while the globals are this cell's.
    rng: dict[str, Any] | None = None

    @property
    def checkpoint(self) -> Path:
        return RunFolder(self.run_dir).checkpoint

    @property
    def training(self) -> bool:
        return self.result.status == Status.TRAINING and self.epoch < self.cfg.epochs

    @property
    def device(self) -> torch.device:
        return self.epoch_losses.device

    # ---- building ----

    @classmethod
    def build(cls, cfg: RunConfig, task: Task, data: Dataset, run_dir: Path, device: torch.device) -> Cell:
        """Model, primal optimizer + schedule and method (which holds the multipliers) of one run; resumed from its
        checkpoint when there is one. Seeds the global RNGs with the run's seed (its model's initialization). What
        it raises is the run's own error (``blamed``): its task's model may fail for its seed or options alone."""
        with blamed(cfg.run_id):
            return cls._build(cfg, task, data, run_dir, device)

    @classmethod
    def _build(cls, cfg: RunConfig, task: Task, data: Dataset, run_dir: Path, device: torch.device) -> Cell:
        make_below(run_dir, 2)       # runs/<id>, never the results folder above
        n_train = len(data.train)
        eps = 0.0 if cfg.eps is None else cfg.eps     # None: a method that reads no ε

        seed_everything(cfg.seed)
        assert task.build_model is not None      # tasks without a model are solved by the solver path
        model = task.build_model(cfg.opts, data).to(device)
        if device.type == "cuda" and data.train.x.dim() == 4:
            model = model.to(memory_format=torch.channels_last)   # faster convolutions with tensor cores
        if task.prepare is not None:
            task.prepare(model, data, cfg.opts, cfg.precision)   # e.g. DPO reference margins, model on the device
        optimizer = build_optimizer(cfg, [p for p in model.parameters() if p.requires_grad], device)
        steps_per_epoch = math.ceil(n_train / cfg.batch_size)
        scheduler, schedule_per_step = build_scheduler(cfg, optimizer, steps_per_epoch)
        nupi = {} if cfg.dual_optimizer == "gd" else {"nupi": NuPI(n_train, cfg.kp, cfg.ki, cfg.nu, device)}
        pruner = Pruner(n_train, cfg.prune_after, cfg.prune_patience, device) if cfg.prune_after > 0 else None
        method = get_method(cfg.method)(n_train, eps=eps, alpha=cfg.alpha, dual_lr=cfg.dual_lr, device=device,
                                        **nupi)
        cell = cls(cfg, model, optimizer, scheduler, schedule_per_step, method, run_dir,
                   RunResult(cfg.run_id, Status.TRAINING, 0, {}), 0, torch.empty(n_train, device=device), pruner=pruner)
        if cell.checkpoint.exists():
            try:
                # Loaded on the CPU: load_state_dict copies each tensor to where its parameter lives, and the RNG
                # setters need CPU byte tensors (mapping the whole checkpoint to CUDA broke every resume on a GPU).
                # weights_only: tensors and plain containers only, so a results folder on a shared file system is
                # no place to plant a pickle that runs code when a run resumes.
                cell.load_state_dict(torch.load(cell.checkpoint, map_location="cpu", weights_only=True))
            except Exception as exc:
                # Truncated (a copy cut short, a disk that filled), garbage or not this run's: every retry would
                # fail the same way. Keep it for a look, and build the cell afresh (a half-loaded one is unusable).
                set_aside(cell.checkpoint, exc)
                return cls._build(cfg, task, data, run_dir, device)
        return cell

    # ---- the checkpoint ----

    def state_dict(self) -> dict[str, Any]:
        """Everything the remaining epochs depend on, as host copies (``host_copy``: training goes on while a writer
        thread saves them, and that thread must never touch the device). Call it on the stream the cell trains on;
        its RNG streams are the globals, or those it has put aside (``swap_rng_out``) while others use the globals."""
        rng = self.rng if self.rng is not None else _get_rng(self.device)
        state = host_copy({
            "epoch": self.epoch,
            "model": trainable_state(self.model),
            "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
            "method": self.method.state_dict(), "torch_rng": rng["torch"],
            "pruner": None if self.pruner is None else self.pruner.state_dict(), "samples_seen": self.samples_seen,
            # a pruned sample's entry is its last visit's loss, which the epoch statistics still read
            "epoch_losses": self.epoch_losses if self.pruner is not None else None,
            "cuda_rng": rng["cuda"], "np_rng": _numpy_rng_state(rng["np"]),
        })
        # Plain numbers (flctl.records.run_folder.PLAIN), not walked: the history is appended to and never changed, so a copy
        # of the list; Python's RNG state is a tuple of 625 ints, which cost a walk a third of a small cell's
        # checkpoint.
        state["history"] = list(self.result.history)
        state["py_rng"] = rng["py"]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the state ``state_dict`` returned (or a checkpoint file of any flctl release) comes back, the RNG
        streams into the globals."""
        load_trainable_state(self.model, state["model"])
        # A tensor learning rate (CUDA) stays a tensor: the optimizer's own load would put the saved value in its
        # place, a CPU float or tensor the captured step does not read.
        lrs = [g["lr"] for g in self.optimizer.param_groups]
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        for group, lr in zip(self.optimizer.param_groups, lrs):
            if isinstance(lr, torch.Tensor):
                lr.fill_(float(group["lr"]))
                group["lr"] = lr
        self.method.load_state_dict(state["method"])
        torch.set_rng_state(state["torch_rng"])
        if self.device.type == "cuda" and state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        random.setstate(state["py_rng"])
        np.random.set_state(_numpy_rng_from(state["np_rng"]))
        if self.pruner is not None:
            self.pruner.load_state_dict(state["pruner"])
            self.epoch_losses.copy_(state["epoch_losses"])
        self.epoch = state["epoch"]
        self.samples_seen = state.get("samples_seen", self.epoch * len(self.epoch_losses))  # older: every sample
        self.result = RunResult(self.cfg.run_id, Status.TRAINING, self.epoch, {}, state["history"],
                                resumed_from=self.epoch)

    # ---- RNG streams of cells that share a process ----

    def swap_rng_in(self) -> None:
        """Make the global RNG streams this cell's (when it has them put aside)."""
        if self.rng is not None:
            _set_rng(self.rng, self.device)
            self.rng = None

    def swap_rng_out(self) -> None:
        """Put this cell's RNG streams aside, so another cell can draw from the globals."""
        self.rng = _get_rng(self.device)


def _get_rng(device: torch.device) -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "py": random.getstate(), "np": np.random.get_state(),
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def _set_rng(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["py"])
    np.random.set_state(state["np"])
    if state["cuda"] is not None:
        torch.cuda.set_rng_state(state["cuda"], device)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _trained_names(model: torch.nn.Module) -> set[str]:
    """State keys training changes: trainable parameters and (persistent) buffers such as BatchNorm statistics.
    Frozen parameters are left out, and with them any extra state a quantized layer keeps beside its weight."""
    return {n for n, p in model.named_parameters() if p.requires_grad} | {n for n, _ in model.named_buffers()}


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What checkpoints and model.pt hold: everything for a fully trained model, the LoRA adapter for an LLM
    (whose frozen base is rebuilt from its source)."""
    keep = _trained_names(model)
    return {k: v for k, v in model.state_dict().items() if k in keep}


def load_trainable_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = sorted(set(missing) & _trained_names(model))
    if unexpected or missing:
        raise RuntimeError(f"checkpoint does not match the model: missing {missing[:3]}, unexpected {unexpected[:3]}")


def _numpy_rng_state(state: tuple) -> tuple:
    """numpy's RNG ``state`` (np.random.get_state's) with its key array as a tensor, which a weights_only load
    accepts."""
    name, keys, pos, has_gauss, cached = state
    return name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached


def _numpy_rng_from(state: tuple) -> tuple:
    name, keys, pos, has_gauss, cached = state
    return name, keys.numpy().astype(np.uint32), pos, has_gauss, cached
