"""Training runs: ``train(cfg, records_root, run_dir) -> RunResult``, and ``train_together`` for several cells of one
task in one process.

Reads top to bottom: data -> cells (flctl.cell: model, optimizer, method, resumed from a checkpoint) -> epochs of
[fill the epoch's batches, steps (flctl.step)] -> eval, records, checkpoint (what is written of a run: flctl.outputs,
flctl.records.run_folder). No database, no submitit, no typer here: callers record what this returns.

How cells step (``RunResult.trained_with``):
- eager: each cell's step as Python calls it (the default off CUDA);
- captured: each cell's step replayed as a CUDA graph per batch shape (the default on CUDA, flctl.step.step_engine);
  the same kernels as eager, so the same numbers with deterministic kernels;
- compiled: the step's forward, loss and dual step through ``torch.compile`` (``--engine compiled``); numbers
  change, so it is part of the run's identity;
- grouped: cells together as one grouped model (flctl.grouped), on CUDA and for ``batched`` tasks: equal alone up
  to float rounding. Other cells together interleave step by step, each with its own RNG streams: equal alone exactly.

How cells together step (engines, grouping, RNG streams, the CUDA stream) is flctl.stepper's. On CUDA, all of a
group's device work runs on one stream (``flctl.stepper.worker_stream``), in program order, so no use of a
tensor can overtake its last write; checkpoints leave it as host copies, and the writer thread never touches the
device (docs/design.md, "Streams and threads on CUDA").
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flctl import records
from flctl.cell import Cell, RunResult
from flctl.config import RunConfig
from flctl.fs import make_below
from flctl.grouped.policy import can_train_together
from flctl.knobs import DEFAULT_CHECKPOINT_EVERY_S
from flctl.layout import records_of
from flctl.losses import evaluate
from flctl.metrics import EPOCH_NUMBERS
from flctl.outputs import finish_run, record_epoch
from flctl.records.run_folder import save_extras
from flctl.status import Status
from flctl.stepper import Stepper
from flctl.tasks import Solution, Task, get_task
from flctl.torch_settings import cpu_threads_while, set_cuda_math
from flctl.writer import Writer

__all__ = ["EpochStats", "RunResult", "train", "train_together"]


@dataclass(frozen=True)
class EpochStats:
    """What the training loop reports after each epoch (progress bars, heartbeats, loggers)."""
    epoch: int                      # epochs completed
    epochs: int
    train_avg_loss: float           # over the epoch's training batches (train mode, with augmentation)
    train_max_loss: float
    max_multiplier: float | None
    metrics: dict[str, float] | None = None  # flattened eval summary when this epoch was evaluated
    run_id: str = ""
    multipliers: Any = None         # an evaluated epoch's per-sample multipliers (numpy, the records' host copy)


def train(
    cfg: RunConfig,
    records_root: Path,
    run_dir: Path,
    on_epoch: Callable[[EpochStats], None] | None = None,
    *,
    checkpoint_every: float = DEFAULT_CHECKPOINT_EVERY_S,
    stop: Callable[[], bool] | None = None,
) -> RunResult:
    """Train ``cfg`` to completion (or divergence), resuming from ``run_dir/checkpoint.pt`` if present.

    A checkpoint is written after an epoch when ``checkpoint_every`` seconds have passed since the last one
    (0: every epoch; by time, so that a short epoch does not pay for a write of the whole state), after every eval
    epoch (so a resume never redoes recorded work twice over), and when
    ``stop()`` turns true: the run then ends at that epoch boundary with status "stopped", ready to resume.
    """
    return train_together([cfg], records_root, [run_dir], on_epoch, checkpoint_every=checkpoint_every,
                          stop=stop)[0]


def train_together(
    cfgs: list[RunConfig],
    records_root: Path,
    run_dirs: list[Path],
    on_epoch: Callable[[EpochStats], None] | None = None,
    *,
    checkpoint_every: float = DEFAULT_CHECKPOINT_EVERY_S,
    stop: Callable[[], bool] | None = None,
    on_done: Callable[[RunResult], None] | None = None,
    fence: Callable[[str], bool] | None = None,
    threads: int | str | None = None,
) -> list[RunResult]:
    """Train several cells of one task side by side, each exactly as ``train`` would train it alone (its own
    seed, model, optimizer, multipliers, RNG streams, records and checkpoint). Cells must share
    ``RunConfig.together_key``; each may resume from its own epoch; one that diverges or finishes leaves the
    others, which go on. ``on_done`` hears of a cell that leaves while others still train, once its records are on
    disk (the caller records it then, not when the others end); the returned list holds every cell's result.

    ``fence(run_id)``: whether this process still holds the run's claim (flctl.runner). It is asked before every
    write of the run's files; a cell whose claim is gone ends "lost" at once and writes nothing more. Without a
    fence the folders above ``records_root`` and ``run_dirs`` are made where missing; with one (a worker, whose results
    folder may be deleted under it) none above the results folder is (flctl.fs.make_below).

    ``threads`` (CPU cells): torch's intra-op threads while they train, a number (--threads) or "auto" (chosen from
    the step's size and the cores this process may use, flctl.knobs.cpu_threads); None leaves the process's setting (a
    sweep worker sets its own). Each result's ``trained_with`` says how many, and who chose."""
    records_root = Path(records_root)
    if fence is None:    # the caller's folders, made where missing; a fenced worker's may be deleted under it: none
        for folder in (records_root, *map(Path, run_dirs)):
            folder.parent.mkdir(parents=True, exist_ok=True)
    task = get_task(cfgs[0].task)
    if not can_train_together(cfgs):
        raise ValueError(f"these {len(cfgs)} cells cannot train together")
    device = torch.device(cfgs[0].device)
    set_cuda_math(device)

    # ---- data: whole splits as tensors on the device; row i is sample id i (shared by the cells) ----
    data = task.load(cfgs[0].opts, cfgs[0].data_dir)
    if cfgs[0].subset:
        data = data.subset(cfgs[0].subset)
    if task.solve is not None:
        return [_run_solver(cfg, task, data, records_root, Path(d), fence, on_epoch)
                for cfg, d in zip(cfgs, run_dirs)]
    data = data.to(device)
    cells = []
    for cfg, run_dir in zip(cfgs, run_dirs):
        cells.append(Cell.build(cfg, task, data, Path(run_dir), device))
        if len(cfgs) > 1:
            cells[-1].swap_rng_out()       # each cell keeps its own RNG streams from its seed (or checkpoint) on
    for c in cells:
        # A run restarts at its checkpoint (or from scratch, when it had none or it was set aside); records a
        # failed attempt wrote past that point are redone, and must not survive to mix with the new ones where
        # the redo ends elsewhere (diverges earlier, nondeterministic kernels).
        stale = records.files_after(records_root, c.cfg.run_id, c.epoch)
        if stale and _held(c, fence):
            for path in stale:
                path.unlink(missing_ok=True)
    with cpu_threads_while(threads, cells[0], device) as chosen:
        return _loop(cells, Stepper(cells, task, data), task, data, records_root, on_epoch, checkpoint_every, stop,
                     on_done, fence, chosen)


def _loop(cells: list[Cell], stepper: Stepper, task: Task, data, records_root: Path, on_epoch, checkpoint_every: float,
          stop, on_done, fence, chosen: dict[str, Any]) -> list[RunResult]:
    """``train_together``'s epochs, from its built cells to every cell's result."""
    done: dict[str, RunResult] = {}        # cells reported to on_done before the others ended
    # Records and checkpoints are written in the background; leaving this block (finished, stopped, diverged or
    # interrupted by an exception) waits until they are on disk.
    with stepper.on_stream():
        with Writer(fence) as writer:
            active = [c for c in cells if c.training]
            if stop is not None and stop():     # asked before the first epoch (between a worker's claim and its
                for c in active:                # training): back now, not after an epoch that may take minutes
                    c.result.status = Status.STOPPED
                active = []
            while active:
                # ---- one epoch of alternating GDA: dual step first, then the primal step with lambda_{t+1} ----
                for c in active:
                    with stepper.own(c):
                        stepper.begin_epoch(c)
                stepper.check_captures(active)
                for last in stepper.shapes(active):
                    stepper.step(active, last)
                    for c in active:
                        if c.schedule_per_step:
                            c.scheduler.step()
                numbers = _epoch_numbers(active)            # one host read for the cells' epoch numbers
                evals = stepper.evaluations([c for c in active if _evaluates(c, numbers[c.cfg.run_id])])
                for c in active:
                    with stepper.own(c):
                        c.samples_seen += len(stepper.orders[c.cfg.run_id])
                        if not c.schedule_per_step:
                            c.scheduler.step()
                        _end_epoch(c, task, data, stepper.orders[c.cfg.run_id], records_root, writer, on_epoch,
                                   checkpoint_every, stop, fence, numbers[c.cfg.run_id], evals.get(c.cfg.run_id))
                left = [c for c in active if not c.training]
                active = [c for c in active if c.training]
                if left and active and on_done is not None:
                    writer.flush()
                    for c in left:
                        done[c.cfg.run_id] = _end(c, task, data, records_root, stepper.trained_with(c) | chosen,
                                                  fence)
                        on_done(done[c.cfg.run_id])
        return [done.get(c.cfg.run_id) or _end(c, task, data, records_root, stepper.trained_with(c) | chosen, fence)
                for c in cells]


def _end(c: Cell, task: Task, data, records_root: Path, trained_with: dict[str, Any],
         fence: Callable[[str], bool] | None = None) -> RunResult:
    c.result.trained_with = trained_with
    if c.result.status in (Status.STOPPED, Status.LOST) or not _held(c, fence):
        return c.result
    return finish_run(c, task, data, records_root)


def _held(c: Cell, fence: Callable[[str], bool] | None) -> bool:
    """Whether this process still holds the cell's claim; if not, the cell ends "lost" (it writes nothing more)."""
    if fence is None or fence(c.cfg.run_id):
        return True
    c.result.status = Status.LOST
    return False


def _epoch_numbers(cells: list[Cell]) -> dict[str, list[float]]:
    """Each cell's epoch mean and max loss (and max multiplier), read from the device at once: one host sync per
    epoch for cells together, not one per cell (a GPU waits at each). The max propagates NaN and inf, so it is the
    finiteness check too (an isfinite pass and three reads cost more than the two-moons step itself)."""
    parts = []
    for c in cells:
        lam = c.method.multipliers
        parts.append([c.epoch_losses.mean(), c.epoch_losses.amax()] + ([] if lam is None else [lam.amax()]))
    flat = iter(torch.stack([t for p in parts for t in p]).tolist())
    return {c.cfg.run_id: [next(flat) for _ in p] for c, p in zip(cells, parts)}


def _eval_epoch(cfg: RunConfig, done: int) -> bool:
    """Whether a run evaluates (and writes records) after ``done`` epochs: every eval_every, and at the last."""
    return done % cfg.eval_every == 0 or done == cfg.epochs


def _evaluates(c: Cell, numbers: list[float]) -> bool:
    """Whether the epoch ending now is one of ``c``'s eval epochs and its loss finite (``_end_epoch`` evaluates)."""
    return math.isfinite(numbers[1]) and _eval_epoch(c.cfg, c.epoch + 1)


def _diverged(result: RunResult, epoch: int, step: int) -> None:
    """The run stops, diverged at ``epoch`` and ``step`` (a non-finite loss or metric), instead of crashing."""
    result.status = Status.DIVERGED
    result.diverged_at = {"epoch": epoch, "step": step}
    result.epochs_done = epoch


def _checkpoint(r: Cell, writer: Writer, stop: Callable[[], bool] | None, fence: Callable[[str], bool] | None,
                checkpoint_every: float, *, evaluated: bool) -> bool:
    """A checkpoint after the epoch's records, by time, at eval epochs and when asked to stop; the last epoch needs
    none (the run finishes). A resume redoes the epochs since the checkpoint, identically. False: the run stops here
    (asked to, or its claim is gone)."""
    stopping = stop is not None and stop()
    if r.epoch < r.cfg.epochs and (stopping or evaluated or time.monotonic() - r.last_save >= checkpoint_every):
        if not _held(r, fence):
            return False
        writer.checkpoint(r.cfg.run_id, r.state_dict(), r.checkpoint)     # host copies, after the epoch's steps
        r.last_save = time.monotonic()
        if stopping:
            r.result.status = Status.STOPPED
            return False
    return True


def _end_epoch(r: Cell, task: Task, data, order: torch.Tensor, records_root: Path, writer: Writer,
               on_epoch: Callable[[EpochStats], None] | None, checkpoint_every: float,
               stop: Callable[[], bool] | None, fence: Callable[[str], bool] | None,
               numbers: list[float], evals: tuple[dict, dict] | None = None) -> None:
    """After one run's epoch (``numbers``: its mean and max loss and max multiplier, ``_epoch_numbers``; ``evals``:
    its train and test evaluations where its group made them, ``Stepper.evaluations``): divergence check, eval and
    records, checkpoint, report."""
    cfg, result, epoch = r.cfg, r.result, r.epoch
    steps_per_epoch = math.ceil(len(data.train) / cfg.batch_size)
    r.epoch += 1
    # ---- stop on a non-finite loss instead of crashing ----
    lam = r.method.multipliers
    avg_loss, max_loss, *max_lam = numbers
    if not math.isfinite(max_loss):
        first_bad_position = int((~torch.isfinite(r.epoch_losses[order])).nonzero()[0, 0])
        _diverged(result, epoch + 1, epoch * steps_per_epoch + first_bad_position // cfg.batch_size + 1)
        return

    stats: dict[str, Any] = {"epoch": epoch + 1, "train_avg_loss": avg_loss, "train_max_loss": max_loss,
             "max_multiplier": max_lam[0] if max_lam else None}
    # ---- eval every k epochs and at the end: per-sample records in eval mode, ordered by id ----
    metrics, host_lam = None, None       # an eval epoch's summary, and its multipliers on the host
    if _eval_epoch(cfg, epoch + 1):
        if not _held(r, fence):
            return
        train_eval, test_eval = evals or (evaluate(task, r.model, data.train, cfg.precision),
                                          evaluate(task, r.model, data.test, cfg.precision))
        pruned = None if r.pruner is None else r.pruner.pruned.cpu().numpy().copy()   # this epoch's set
        host_lam = None if lam is None else lam.cpu().numpy().copy()    # a copy: lam moves on while it is written
        metrics = record_epoch(
            cfg, task, records_root, epoch + 1, train_eval, test_eval, host_lam, writer,
            pruned=pruned, samples_seen=r.samples_seen, groups=data.meta.get("groups"),
            told={k: stats[k] for k in EPOCH_NUMBERS})
        if r.pruner is not None and cfg.eps is not None:      # pruning runs have an eps (validate)
            r.pruner.evaluated(train_eval["loss"], cfg.eps)
        if not all(math.isfinite(v) for v in metrics.values()):
            _diverged(result, epoch + 1, (epoch + 1) * steps_per_epoch)
            return
        stats["metrics"] = metrics
        result.metrics = metrics
    result.history.append(stats)
    result.epochs_done = epoch + 1

    if not _checkpoint(r, writer, stop, fence, checkpoint_every, evaluated=metrics is not None):
        return
    if on_epoch is not None:
        on_epoch(EpochStats(epoch + 1, cfg.epochs, stats["train_avg_loss"], stats["train_max_loss"],
                            stats["max_multiplier"], metrics, cfg.run_id, host_lam))


def _run_solver(cfg: RunConfig, task: Task, data, records_root: Path, run_dir: Path,
                fence: Callable[[str], bool] | None = None,
                on_epoch: Callable[[EpochStats], None] | None = None) -> RunResult:
    """Tasks solved in closed form or by a convex solver: one 'epoch', same records and summary, reported to
    ``on_epoch`` as 1 of 1 (a progress bar would otherwise stop at 0 of the configured epochs)."""
    assert task.solve is not None
    sol: Solution = task.solve(cfg, data)
    if fence is not None and not fence(cfg.run_id):
        return RunResult(cfg.run_id, Status.LOST, 0, {}, [])
    make_below(run_dir, 2)
    metrics = record_epoch(cfg, task, records_root, 1, sol.train, sol.test, sol.multipliers)
    result = RunResult(cfg.run_id, Status.COMPLETED, 1, metrics, [{"epoch": 1, "metrics": metrics}])
    result.artifacts.update(save_extras(run_dir, sol.extras))
    result.artifacts["records"] = str(records_of(records_root, cfg.run_id))
    if on_epoch is not None:
        loss = np.asarray(sol.train["loss"], dtype=np.float64)
        lam = None if sol.multipliers is None else float(np.max(sol.multipliers))
        on_epoch(EpochStats(1, 1, float(loss.mean()), float(loss.max()), lam, metrics, cfg.run_id))
    return result
