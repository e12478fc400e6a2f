"""One training run: ``train(cfg, records_root, run_dir) -> RunResult``.

Reads top to bottom: data -> model -> optimizers -> (resume) -> epochs of [dual step, primal step] ->
eval, records, checkpoint. No database, no submitit, no typer here: callers record what this returns.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F

from flctl import records
from flctl.config import RunConfig
from flctl.data import Split, batches, epoch_order
from flctl.fs import atomic_path
from flctl.methods import LAMBDA_CAP, NuPI, get_method
from flctl.metrics import flatten, split_summary
from flctl.pruning import Pruner
from flctl.tasks import Task, get_task


@dataclass(frozen=True)
class EpochStats:
    """What the training loop reports after each epoch (for progress bars and heartbeats)."""

    epoch: int                      # epochs completed
    epochs: int
    train_avg_loss: float           # over the epoch's training batches (train mode, with augmentation)
    train_max_loss: float
    max_multiplier: float | None
    metrics: dict[str, float] | None = None  # flattened eval summary when this epoch was evaluated
    run_id: str = ""


@dataclass
class RunResult:
    run_id: str
    status: str                                  # "completed" | "diverged" | "stopped" (asked to, checkpointed)
    epochs_done: int
    metrics: dict[str, float]                    # flattened final summary: "train.avg_loss", ...
    history: list[dict[str, Any]] = field(default_factory=list)
    diverged_at: dict[str, int] | None = None    # {"epoch": e, "step": global step} of the first non-finite loss
    lambda_capped: int = 0                       # multipliers held at LAMBDA_CAP at the end (infeasible FL)
    artifacts: dict[str, str] = field(default_factory=dict)
    resumed_from: int = 0                        # epoch the run resumed from (0 = fresh start)


@dataclass
class Solution:
    """What a task with its own solver (no gradient loop) returns; see tasks/polyfit.py.

    ``train`` and ``test`` map "loss", "prediction", "target" (and "correct" if it applies) to per-sample
    arrays ordered by sample id, as ``evaluate`` does for trained models.
    """

    train: dict[str, np.ndarray]
    test: dict[str, np.ndarray]
    extras: dict[str, np.ndarray] = field(default_factory=dict)
    multipliers: np.ndarray | None = None


def _cross_entropy(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, y, reduction="none")


def _squared_error(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (out.squeeze(-1) - y).square()


def _dpo_sigmoid(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # The model outputs the policy margin beta*(log pi(y+|x) - log pi(y-|x)) and y holds the reference's, so
    # g = -log sigmoid(beta*[log pi/ref (y+) - log pi/ref (y-)]) = -log sigmoid(out - y).
    return -F.logsigmoid(out - y)


@dataclass(frozen=True)
class LossKind:
    """What a task kind (flctl.tasks.Kind) means for training and records."""

    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]         # g_i of each sample: [B, ...] -> [B]
    prediction: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]   # what records keep as the prediction
    correct: Callable[[np.ndarray, np.ndarray], np.ndarray] | None     # (prediction, target) -> bool, or none
    # the probability the model gives its prediction (calibration: records' confidence, summaries' ece), or none
    confidence: Callable[[torch.Tensor], torch.Tensor] | None = None


LOSS_KINDS: dict[str, LossKind] = {
    "classification": LossKind(_cross_entropy, lambda out, y: out.argmax(-1), lambda pred, target: pred == target,
                               lambda out: out.float().softmax(-1).amax(-1)),      # max softmax probability
    "regression": LossKind(_squared_error, lambda out, y: out.squeeze(-1), None),
    # prediction: DPO's implicit reward margin (> 0: the policy prefers the chosen answer more than the reference
    # does), which is also its reward accuracy's test
    "preference": LossKind(_dpo_sigmoid, lambda out, y: out - y, lambda pred, target: pred > 0),
}


def per_sample_loss(task: Task, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """g_i for each sample of the batch. [B, ...] -> [B]: cross-entropy, squared error or DPO's sigmoid loss."""
    return LOSS_KINDS[task.kind].loss(out, y)


def model_output(model: torch.nn.Module, x: torch.Tensor, precision: str = "auto") -> torch.Tensor:
    """The model's output in float32. On CUDA with precision "auto" the forward runs under bf16 autocast (the
    losses, multipliers and optimizer state stay float32); otherwise it is a plain call, so CPU results are
    bit-exact whatever the precision."""
    if x.device.type == "cuda" and precision == "auto":
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return model(x).float()
    return model(x)


def train_step(task: Task, model: torch.nn.Module, method, optimizer: torch.optim.Optimizer,
               x: torch.Tensor, y: torch.Tensor, ids: torch.Tensor, micro_batch: int = 0,
               precision: str = "auto") -> torch.Tensor:
    """One alternating GDA step: dual step first, then the primal step with lambda_{t+1}. Returns g [B].

    With ``micro_batch`` the batch is processed in chunks whose gradients accumulate before the one optimizer
    step. Every chunk is evaluated at the same parameters and each multiplier depends only on its own sample's
    loss, so the dual steps and the accumulated gradient are those of the whole batch.
    """
    optimizer.zero_grad(set_to_none=True)
    size = len(ids)
    chunk = micro_batch if 0 < micro_batch < size else size
    losses_out = []
    for start in range(0, size, chunk):
        part = slice(start, start + chunk)
        losses = per_sample_loss(task, model_output(model, x[part], precision), y[part])   # [b]
        method.dual_step_(losses, ids[part])                  # lambda[ids] moves; no-op for ERM/CSERM
        objective = method.primal_loss(losses, ids[part])     # scalar: mean g, CSERM, or sum lambda*g
        if chunk < size and method.reduction == "mean":
            objective = objective * (len(losses) / size)      # this chunk's share of the batch mean
        objective.backward()
        losses_out.append(losses.detach())
    optimizer.step()
    return losses_out[0] if len(losses_out) == 1 else torch.cat(losses_out)


def batched_step(task: Task, runs: list, xs: list[torch.Tensor], ys: list[torch.Tensor],
                 step_ids: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``train_step`` for several runs of one small model at once: their parameters are stacked (stacking is
    differentiable, so each run's own parameters get its gradient) and one vmapped forward and one backward
    serve them all; then each run's own dual step, objective and optimizer step, as alone. Returns each run's g.

    Equal to the runs' separate steps up to float rounding (batched matrix products sum in another order).
    """
    from torch.func import functional_call

    base = runs[0].model                     # its code runs with each run's parameters; batched tasks have no buffers
    params = [dict(r.model.named_parameters()) for r in runs]
    stacked = {name: torch.stack([p[name] for p in params]) for name in params[0]}     # [R, ...] each
    x = torch.stack(xs)                                                                 # [R, B, ...]
    forward = torch.vmap(lambda theta, xb: functional_call(base, theta, (xb,)))
    if x.device.type == "cuda" and runs[0].cfg.precision == "auto":
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = forward(stacked, x).float()
    else:
        out = forward(stacked, x)                                                       # [R, B, out]
    objectives, losses_out = [], []
    for r, out_r, y, ids in zip(runs, out, ys, step_ids):
        losses = per_sample_loss(task, out_r, y)                           # [B]
        r.method.dual_step_(losses, ids)
        objectives.append(r.method.primal_loss(losses, ids))
        losses_out.append(losses.detach())
        r.optimizer.zero_grad(set_to_none=True)
    torch.stack(objectives).sum().backward()    # runs share no parameter: each gets its own objective's gradient
    for r in runs:
        r.optimizer.step()
    return losses_out


@torch.no_grad()
def evaluate(task: Task, model: torch.nn.Module, split: Split, precision: str = "auto") -> dict[str, np.ndarray]:
    """Per-sample loss and prediction of a whole split in eval mode, ordered by sample id."""
    model.eval()
    kind = LOSS_KINDS[task.kind]
    losses, preds, confidences = [], [], []
    for start in range(0, len(split), task.eval_chunk):
        x, y = split.x[start:start + task.eval_chunk], split.y[start:start + task.eval_chunk]
        out = model_output(model, x, precision)
        losses.append(kind.loss(out, y))
        preds.append(kind.prediction(out, y))
        if kind.confidence is not None:
            confidences.append(kind.confidence(out))
    result = {
        "loss": torch.cat(losses).cpu().numpy(),
        "prediction": torch.cat(preds).cpu().numpy(),
        "target": split.y.cpu().numpy(),
    }
    if confidences:
        result["confidence"] = torch.cat(confidences).cpu().numpy()
    if kind.correct is not None:
        result["correct"] = kind.correct(result["prediction"], result["target"])
    return result


def _summarize_and_record(
    cfg: RunConfig, task: Task, records_root: Path, epoch: int,
    train_eval: dict[str, np.ndarray], test_eval: dict[str, np.ndarray], multipliers: np.ndarray | None,
    writer: _Writer | None = None, *, pruned: np.ndarray | None = None, samples_seen: int | None = None,
    groups: dict[str, dict[str, np.ndarray]] | None = None,
) -> dict[str, float]:
    """Write one eval epoch's per-sample records (through ``writer`` when given) and return its flattened
    summary metrics. ``pruned``: the training samples left out of this epoch (--prune-after);
    ``samples_seen``: per-sample losses back-propagated so far (``train.samples_seen``); ``groups``: the task's
    group labels ({attribute: {split: labels by sample id}}) for ``worst_group_avg_loss``."""
    labels = {split: [v[split] for v in (groups or {}).values()] for split in ("train", "test")}
    eps = None if cfg.eps is None else (np.asarray(cfg.eps) if isinstance(cfg.eps, tuple) else cfg.eps)
    tables = [
        records.split_table(cfg.run_id, "train", epoch, multiplier=multipliers, pruned=pruned, **train_eval),
        records.split_table(cfg.run_id, "test", epoch, **test_eval),
    ]
    if writer is not None:
        writer.submit(records.write_epoch, records_root, cfg.run_id, epoch, tables)
    else:
        records.write_epoch(records_root, cfg.run_id, epoch, tables)
    # Per-sample eps is defined on the training samples only; test violations use its mean as the level.
    test_eps = None if eps is None else float(np.mean(eps))
    summary = {
        "train": split_summary(train_eval["loss"], correct=train_eval.get("correct"), eps=eps,
                               multipliers=multipliers, pruned=pruned, confidence=train_eval.get("confidence"),
                               groups=labels["train"])
        | ({} if samples_seen is None else {"samples_seen": float(samples_seen)}),
        "test": split_summary(test_eval["loss"], correct=test_eval.get("correct"), eps=test_eps,
                              confidence=test_eval.get("confidence"), groups=labels["test"]),
    }
    return flatten(summary)


class _Writer:
    """Writes records and checkpoints on one background thread, in submission order (a checkpoint lands after
    the records of its epoch), so the loop does not wait for the disk. Leaving its ``with`` block waits for everything
    and re-raises a write's error; at most one checkpoint is pending at a time, which bounds the memory of
    snapshots. A process killed with writes pending resumes from an older checkpoint and redoes those epochs,
    identically."""

    def __init__(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flctl-writer")
        self._pending: list = []
        self._checkpoint: Future | None = None

    def submit(self, fn: Callable, *args: Any) -> None:
        self._pending.append(self._pool.submit(fn, *args))

    def checkpoint(self, state: dict[str, Any], path: Path) -> None:
        if self._checkpoint is not None:
            self._checkpoint.result()
        self._checkpoint = self._pool.submit(_atomic_save, state, path)
        self._pending.append(self._checkpoint)

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        for future in pending:
            future.result()

    def __enter__(self) -> _Writer:
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.flush()
        finally:
            self._pool.shutdown(wait=True)


def _snapshot(obj: Any) -> Any:
    """A copy of a (nested) state dict whose tensors no longer change as training goes on."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _snapshot(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_snapshot(v) for v in obj)
    return obj


def _atomic_save(obj: Any, path: Path) -> None:
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def _save_extras(run_dir: Path, extras: dict[str, np.ndarray]) -> dict[str, str]:
    if not extras:
        return {}
    path = run_dir / "extras.npz"
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, **extras)  # type: ignore[arg-type]  # numpy's stub reads **kwds as its allow_pickle
    return {"extras": str(path)}


def build_optimizer(cfg: RunConfig, params) -> torch.optim.Optimizer:
    # foreach: one multi-tensor kernel per update instead of a Python loop over parameters (bitwise equal;
    # torch picks it on CUDA by default, not on CPU, where it made two-moons steps 5% faster).
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                               foreach=True)
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=True)


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


def _trained_names(model: torch.nn.Module) -> set[str]:
    """State keys training changes: trainable parameters and (persistent) buffers such as BatchNorm statistics.
    Frozen parameters are left out, and with them any extra state a quantized layer keeps beside its weight."""
    return {n for n, p in model.named_parameters() if p.requires_grad} | {n for n, _ in model.named_buffers()}


def _trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What checkpoints and model.pt hold: everything for a fully trained model, the LoRA adapter for an LLM
    (whose frozen base is rebuilt from its source)."""
    keep = _trained_names(model)
    return {k: v for k, v in model.state_dict().items() if k in keep}


def _load_trainable_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = sorted(set(missing) & _trained_names(model))
    if unexpected or missing:
        raise RuntimeError(f"checkpoint does not match the model: missing {missing[:3]}, unexpected {unexpected[:3]}")


def _numpy_rng_state() -> tuple:
    """numpy's global RNG state with its key array as a tensor, which a weights_only load accepts."""
    name, keys, pos, has_gauss, cached = cast(tuple, np.random.get_state(legacy=True))
    return name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached


def _numpy_rng_from(state: tuple) -> tuple:
    name, keys, pos, has_gauss, cached = state
    return name, keys.numpy().astype(np.uint32), pos, has_gauss, cached


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def train(
    cfg: RunConfig,
    records_root: Path,
    run_dir: Path,
    on_epoch: Callable[[EpochStats], None] | None = None,
    *,
    checkpoint_every: float = 0.0,
    stop: Callable[[], bool] | None = None,
) -> RunResult:
    """Train ``cfg`` to completion (or divergence), resuming from ``run_dir/checkpoint.pt`` if present.

    A checkpoint is written after an epoch when ``checkpoint_every`` seconds have passed since the last one
    (0: every epoch), after every eval epoch (so a resume never redoes recorded work twice over), and when
    ``stop()`` turns true: the run then ends at that epoch boundary with status "stopped", ready to resume.
    """
    return train_together([cfg], records_root, [run_dir], on_epoch, checkpoint_every=checkpoint_every,
                          stop=stop)[0]


@dataclass
class _Run:
    """One run's state in the loop: what ``train`` sets up from its config (and checkpoint) and moves on."""

    cfg: RunConfig
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    schedule_per_step: bool
    method: Any
    run_dir: Path
    result: RunResult
    epoch: int                                   # the next epoch to train (epochs done so far)
    epoch_losses: torch.Tensor                   # this epoch's training loss per sample id (pruned: last visit's)
    last_save: float = field(default_factory=time.monotonic)
    pruner: Pruner | None = None                 # --prune-after: the samples left out of the epoch order
    samples_seen: int = 0                        # per-sample losses back-propagated so far (all epochs)

    @property
    def checkpoint(self) -> Path:
        return self.run_dir / "checkpoint.pt"

    @property
    def training(self) -> bool:
        return self.result.status == "completed" and self.epoch < self.cfg.epochs


def train_together(
    cfgs: list[RunConfig],
    records_root: Path,
    run_dirs: list[Path],
    on_epoch: Callable[[EpochStats], None] | None = None,
    *,
    checkpoint_every: float = 0.0,
    stop: Callable[[], bool] | None = None,
    on_done: Callable[[RunResult], None] | None = None,
) -> list[RunResult]:
    """Train several cells of one task side by side, each exactly as ``train`` would train it alone (its own
    seed, model, optimizer, multipliers, records and checkpoint), with one stacked forward and backward per
    step when more than one is training (``batched_step``). Cells must share ``RunConfig.together_key``; each may
    resume from its own epoch; one that diverges or finishes leaves the group and the others go on. ``on_done``
    hears of a cell that leaves while others still train, once its records are on disk (the caller records it
    then, not when the group ends); the returned list holds every cell's result either way."""
    records_root = Path(records_root)
    task = get_task(cfgs[0].task)
    if len({c.together_key() for c in cfgs}) != 1 or (len(cfgs) > 1 and not task.batched):
        raise ValueError(f"these {len(cfgs)} cells cannot train together")
    device = torch.device(cfgs[0].device)

    # ---- data: whole splits as tensors on the device; row i is sample id i (shared by the cells) ----
    data = task.load(cfgs[0].opts, cfgs[0].data_dir)
    if task.solve is not None:
        return [_run_solver(cfg, task, data, records_root, Path(d)) for cfg, d in zip(cfgs, run_dirs)]
    data = data.to(device)
    runs = [_start(cfg, task, data, Path(run_dir), device) for cfg, run_dir in zip(cfgs, run_dirs)]
    done: dict[str, RunResult] = {}          # cells reported to on_done before the group ended
    x_train, y_train, batch_size = data.train.x, data.train.y, cfgs[0].batch_size

    # Records and checkpoints are written in the background; leaving this block (finished, stopped, diverged or
    # interrupted by an exception) waits until they are on disk.
    with _Writer() as writer:
        active = [r for r in runs if r.training]
        while active:
            # ---- one epoch of alternating GDA: dual step first, then the primal step with lambda_{t+1} ----
            for r in active:
                if not r.model.training:    # only after an eval epoch: walking the modules every epoch adds up
                    r.model.train()
            orders = [epoch_order(len(data.train), r.cfg.seed, r.epoch).to(device) for r in active]
            orders = [o if r.pruner is None else r.pruner.epoch_order(o, r.epoch) for r, o in zip(active, orders)]
            aug_gens = [torch.Generator(device=device).manual_seed(r.cfg.seed * 7919 + r.epoch)
                        if task.augment else None for r in active]
            for step_ids in zip(*(batches(order, batch_size) for order in orders)):
                xs, ys = [x_train[ids] for ids in step_ids], [y_train[ids] for ids in step_ids]   # [B, ...], [B]
                if task.augment is not None:
                    xs = [task.augment(x, gen) for x, gen in zip(xs, aug_gens)]
                if len(active) == 1:
                    r, ids = active[0], step_ids[0]
                    losses = train_step(task, r.model, r.method, r.optimizer, xs[0], ys[0], ids, r.cfg.micro_batch,
                                        r.cfg.precision)
                    r.epoch_losses.index_copy_(0, ids, losses)
                    if r.pruner is not None:    # pruning runs train alone (RunConfig.together_key)
                        r.pruner.visited(ids, r.method.satisfied(losses, ids))
                else:
                    for r, ids, losses in zip(active, step_ids, batched_step(task, active, xs, ys, step_ids)):
                        r.epoch_losses.index_copy_(0, ids, losses)
                for r in active:
                    if r.schedule_per_step:
                        r.scheduler.step()
            for r, order in zip(active, orders):
                r.samples_seen += len(order)
                if not r.schedule_per_step:
                    r.scheduler.step()
                _end_epoch(r, task, data, order, records_root, writer, on_epoch, checkpoint_every, stop)
            left = [r for r in active if not r.training]
            active = [r for r in active if r.training]
            if left and active and on_done is not None:
                writer.flush()
                for r in left:
                    done[r.cfg.run_id] = _end(r, task, data, records_root)
                    on_done(done[r.cfg.run_id])
    return [done.get(r.cfg.run_id) or _end(r, task, data, records_root) for r in runs]


def _end(r: _Run, task: Task, data, records_root: Path) -> RunResult:
    return r.result if r.result.status == "stopped" else _finish(r, task, data, records_root)


def _start(cfg: RunConfig, task: Task, data, run_dir: Path, device: torch.device) -> _Run:
    """Model, primal optimizer + schedule and method (which holds the multipliers) of one run; resumed from its
    checkpoint when there is one."""
    run_dir.mkdir(parents=True, exist_ok=True)
    n_train = len(data.train)
    eps: float | torch.Tensor = 0.0 if cfg.eps is None else cfg.eps if not isinstance(cfg.eps, tuple) else \
        torch.tensor(cfg.eps, dtype=torch.float32)
    if isinstance(eps, torch.Tensor) and len(eps) != n_train:
        raise ValueError(f"per-sample eps has {len(eps)} entries; task {cfg.task} has {n_train} samples")

    _seed_everything(cfg.seed)
    assert task.build_model is not None      # tasks without a model are solved by _run_solver
    model = task.build_model(cfg.opts, data).to(device)
    if device.type == "cuda" and data.train.x.dim() == 4:
        model = model.to(memory_format=torch.channels_last)   # faster convolutions with tensor cores
    if task.prepare is not None:
        task.prepare(model, data, cfg.opts, cfg.precision)   # e.g. DPO reference margins, with the model on the device
    optimizer = build_optimizer(cfg, [p for p in model.parameters() if p.requires_grad])
    steps_per_epoch = math.ceil(n_train / cfg.batch_size)
    scheduler, schedule_per_step = build_scheduler(cfg, optimizer, steps_per_epoch)
    nupi = {} if cfg.dual_optimizer == "gd" else {"nupi": NuPI(n_train, cfg.kp, cfg.ki, cfg.nu, device)}
    pruner = Pruner(n_train, cfg.prune_after, cfg.prune_patience, device) if cfg.prune_after > 0 else None
    method = get_method(cfg.method)(n_train, eps=eps if eps is not None else 0.0, alpha=cfg.alpha,
                                    dual_lr=cfg.dual_lr, device=device, **nupi)

    # ---- resume: everything the remaining epochs depend on comes back from the checkpoint ----
    checkpoint = run_dir / "checkpoint.pt"
    start_epoch, history, samples_seen = 0, [], 0
    epoch_losses = torch.empty(n_train, device=device)
    if checkpoint.exists():
        # Loaded on the CPU: load_state_dict copies each tensor to where its parameter lives, and the RNG
        # setters need CPU byte tensors (mapping the whole checkpoint to CUDA broke every resume on a GPU).
        # weights_only: tensors and plain containers only, so a results folder on a shared file system is no
        # place to plant a pickle that runs code when a run resumes.
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
        _load_trainable_state(model, state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        method.load_state_dict(state["method"])
        torch.set_rng_state(state["torch_rng"])
        if device.type == "cuda" and state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(state["cuda_rng"], device)
        random.setstate(state["py_rng"])
        np.random.set_state(_numpy_rng_from(state["np_rng"]))
        if pruner is not None:
            pruner.load_state_dict(state["pruner"])
            epoch_losses.copy_(state["epoch_losses"])
        start_epoch, history = state["epoch"], state["history"]
        samples_seen = state.get("samples_seen", start_epoch * n_train)   # older checkpoints: every sample
    result = RunResult(cfg.run_id, "completed", start_epoch, {}, history, resumed_from=start_epoch)
    return _Run(cfg, model, optimizer, scheduler, schedule_per_step, method, run_dir, result, start_epoch,
                epoch_losses, pruner=pruner, samples_seen=samples_seen)


def _end_epoch(r: _Run, task: Task, data, order: torch.Tensor, records_root: Path, writer: _Writer,
               on_epoch: Callable[[EpochStats], None] | None, checkpoint_every: float,
               stop: Callable[[], bool] | None) -> None:
    """After one run's epoch: divergence check, eval and records, checkpoint, report."""
    cfg, result, epoch = r.cfg, r.result, r.epoch
    steps_per_epoch = math.ceil(len(data.train) / cfg.batch_size)
    r.epoch += 1
    # ---- one host sync for the epoch's numbers; stop on a non-finite loss instead of crashing. The max
    # propagates NaN and inf, so it is the finiteness check too (an isfinite pass and three reads cost more
    # than the two-moons step itself). ----
    lam = r.method.multipliers
    numbers = [r.epoch_losses.mean(), r.epoch_losses.amax()] + ([] if lam is None else [lam.amax()])
    avg_loss, max_loss, *max_lam = torch.stack(numbers).tolist()
    if not math.isfinite(max_loss):
        first_bad_position = int((~torch.isfinite(r.epoch_losses[order])).nonzero()[0, 0])
        result.status = "diverged"
        result.diverged_at = {"epoch": epoch + 1,
                              "step": epoch * steps_per_epoch + first_bad_position // cfg.batch_size + 1}
        result.epochs_done = epoch + 1
        return

    stats = {"epoch": epoch + 1, "train_avg_loss": avg_loss, "train_max_loss": max_loss,
             "max_multiplier": max_lam[0] if max_lam else None}
    # ---- eval every k epochs and at the end: per-sample records in eval mode, ordered by id ----
    metrics = None
    if (epoch + 1) % cfg.eval_every == 0 or epoch + 1 == cfg.epochs:
        train_eval = evaluate(task, r.model, data.train, cfg.precision)
        pruned = None if r.pruner is None else r.pruner.pruned.cpu().numpy().copy()   # this epoch's set
        metrics = _summarize_and_record(
            cfg, task, records_root, epoch + 1, train_eval, evaluate(task, r.model, data.test, cfg.precision),
            None if lam is None else lam.cpu().numpy().copy(), writer,   # a copy: lam moves on while it is written
            pruned=pruned, samples_seen=r.samples_seen, groups=data.meta.get("groups"))
        if r.pruner is not None and cfg.eps is not None:      # pruning runs have an eps (validate)
            r.pruner.evaluated(train_eval["loss"], np.asarray(cfg.eps) if isinstance(cfg.eps, tuple) else cfg.eps)
        if not all(math.isfinite(v) for v in metrics.values()):
            result.status = "diverged"
            result.diverged_at = {"epoch": epoch + 1, "step": (epoch + 1) * steps_per_epoch}
            result.epochs_done = epoch + 1
            return
        stats["metrics"] = metrics
        result.metrics = metrics
    result.history.append(stats)
    result.epochs_done = epoch + 1

    # ---- checkpoint after the records, by time, at eval epochs and when asked to stop; the last epoch needs
    # none (the run finishes). A resume redoes the epochs since the checkpoint, identically. ----
    stopping = stop is not None and stop()
    if epoch + 1 < cfg.epochs and (stopping or metrics is not None
                                   or time.monotonic() - r.last_save >= checkpoint_every):
        device = r.epoch_losses.device
        writer.checkpoint({   # copies: training goes on while the writer thread saves them
            "epoch": epoch + 1, "history": list(result.history), "model": _snapshot(_trainable_state(r.model)),
            "optimizer": _snapshot(r.optimizer.state_dict()), "scheduler": _snapshot(r.scheduler.state_dict()),
            "method": r.method.state_dict(), "torch_rng": torch.get_rng_state(),
            "pruner": None if r.pruner is None else r.pruner.state_dict(), "samples_seen": r.samples_seen,
            # a pruned sample's entry is its last visit's loss, which the epoch statistics still read
            "epoch_losses": r.epoch_losses.clone() if r.pruner is not None else None,
            "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
            "py_rng": random.getstate(), "np_rng": _numpy_rng_state(),
        }, r.checkpoint)
        r.last_save = time.monotonic()
        if stopping:
            result.status = "stopped"
            return
    if on_epoch is not None:
        on_epoch(EpochStats(epoch + 1, cfg.epochs, stats["train_avg_loss"], stats["train_max_loss"],
                            stats["max_multiplier"], metrics, cfg.run_id))


def _finish(r: _Run, task: Task, data, records_root: Path) -> RunResult:
    """Final metrics, task extras, model weights; the checkpoint is no longer needed."""
    result = r.result
    if result.status == "completed" and not result.metrics:
        result.metrics = next((h["metrics"] for h in reversed(result.history) if h.get("metrics")), {})
    if r.method.multipliers is not None:
        result.lambda_capped = int((r.method.multipliers >= LAMBDA_CAP).sum())
    if result.status == "completed":
        if task.extras is not None:
            result.artifacts.update(_save_extras(r.run_dir, task.extras(r.model, data, r.cfg.opts)))
        _atomic_save(_trainable_state(r.model), r.run_dir / "model.pt")
        result.artifacts["model"] = str(r.run_dir / "model.pt")
    result.artifacts["records"] = str(records.run_dir(records_root, r.cfg.run_id))
    r.checkpoint.unlink(missing_ok=True)
    return result


def _run_solver(cfg: RunConfig, task: Task, data, records_root: Path, run_dir: Path) -> RunResult:
    """Tasks solved in closed form or by a convex solver: one 'epoch', same records and summary."""
    run_dir.mkdir(parents=True, exist_ok=True)
    assert task.solve is not None
    sol: Solution = task.solve(cfg, data)
    metrics = _summarize_and_record(cfg, task, records_root, 1, sol.train, sol.test, sol.multipliers)
    result = RunResult(cfg.run_id, "completed", 1, metrics, [{"epoch": 1, "metrics": metrics}])
    result.artifacts.update(_save_extras(run_dir, sol.extras))
    result.artifacts["records"] = str(records.run_dir(records_root, cfg.run_id))
    return result
