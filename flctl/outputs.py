"""What training writes of a run besides its checkpoints (flctl.train's loop calls these): each eval epoch's
per-sample records with that epoch's summary metrics (``record_epoch``), and as a run ends its final metrics, the
task's extras and the model's weights, the checkpoint then no longer needed (``finish_run``). The files are
flctl.records' (``writes``, ``run_folder``); this is training's side, beside flctl.train, as it reads a Cell."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from flctl.cell import Cell, RunResult, trainable_state
from flctl.config import RunConfig
from flctl.layout import RunFolder, records_of
from flctl.methods import LAMBDA_CAP
from flctl.metrics import epoch_numbers, flatten, split_summary
from flctl.records.run_folder import atomic_save, host_copy, save_extras
from flctl.records.writes import split_table, write_epoch
from flctl.status import Status
from flctl.tasks import Task
from flctl.writer import Writer


def record_epoch(
    cfg: RunConfig, task: Task, records_root: Path, epoch: int,
    train_eval: dict[str, np.ndarray], test_eval: dict[str, np.ndarray], multipliers: np.ndarray | None,
    writer: Writer | None = None, *, pruned: np.ndarray | None = None, samples_seen: int | None = None,
    groups: dict[str, dict[str, np.ndarray]] | None = None, told: dict[str, Any] | None = None,
) -> dict[str, float]:
    """Write one eval epoch's per-sample records (through ``writer`` when given) and return its flattened
    summary metrics. ``pruned``: the training samples left out of this epoch (--prune-after);
    ``samples_seen``: per-sample losses back-propagated so far (``train.samples_seen``); ``groups``: the task's
    group labels ({attribute: {split: labels by sample id}}) for ``worst_group_avg_loss``; ``told``: the epoch's
    training-batch numbers (EPOCH_NUMBERS), kept in the file only (a logger is told them live; `flctl export` reads)."""
    labels = {split: [v[split] for v in (groups or {}).values()] for split in ("train", "test")}
    tables = [
        split_table(cfg.run_id, "train", epoch, multiplier=multipliers, pruned=pruned, **train_eval),
        split_table(cfg.run_id, "test", epoch, **test_eval),
    ]
    summary = {
        "train": split_summary(train_eval["loss"], correct=train_eval.get("correct"), eps=cfg.eps,
                               multipliers=multipliers, pruned=pruned, confidence=train_eval.get("confidence"),
                               groups=labels["train"])
        | ({} if samples_seen is None else {"samples_seen": float(samples_seen)}),
        "test": split_summary(test_eval["loss"], correct=test_eval.get("correct"), eps=cfg.eps,
                              confidence=test_eval.get("confidence"), groups=labels["test"]),
    }
    flat = flatten(summary)
    kept = flat | epoch_numbers(told or {})
    if writer is not None:      # the summary kept in the file: what a logger was told, for `flctl export`
        writer.submit(cfg.run_id, write_epoch, records_root, cfg.run_id, epoch, tables, kept)
    else:
        write_epoch(records_root, cfg.run_id, epoch, tables, kept)
    return flat


def finish_run(r: Cell, task: Task, data, records_root: Path) -> RunResult:
    """Final metrics, task extras, model weights; the checkpoint is no longer needed."""
    result = r.result
    if result.status == Status.TRAINING:      # every epoch done, none diverged
        result.status = Status.COMPLETED
    if result.status == Status.COMPLETED and not result.metrics:
        result.metrics = next((h["metrics"] for h in reversed(result.history) if h.get("metrics")), {})
    if r.method.multipliers is not None:
        result.lambda_capped = int((r.method.multipliers >= LAMBDA_CAP).sum())
    if result.status == Status.COMPLETED:
        if task.extras is not None:
            result.artifacts.update(save_extras(r.run_dir, task.extras(r.model, data, r.cfg.opts)))
        model = RunFolder(r.run_dir).model
        # host copies: a grouped cell's tensors are views of its group's, and torch.save writes a view's whole storage
        atomic_save(host_copy(trainable_state(r.model)), model)
        result.artifacts["model"] = str(model)
    result.artifacts["records"] = str(records_of(records_root, r.cfg.run_id))
    r.checkpoint.unlink(missing_ok=True)
    return result
