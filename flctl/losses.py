"""What a task kind means for training and records: each sample's loss g_i, the prediction and confidence kept in
the records, the model's output, and the per-sample evaluation of a whole split."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from flctl.data import Split
from flctl.tasks import Task


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
    bit-exact whatever the precision.

    The autocast weight cache is off: a CUDA graph cannot capture it (the cached bf16 weights would be allocated
    once, at capture, and go stale), and eager steps must be the captured step's exact kernels. The casts it saves
    are a few small kernels per layer."""
    if x.device.type == "cuda" and precision == "auto":
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            return model(x).float()
    return model(x)


@torch.no_grad()
def evaluate(task: Task, model: torch.nn.Module, split: Split, precision: str = "auto") -> dict[str, np.ndarray]:
    """Per-sample loss and prediction of a whole split in eval mode, ordered by sample id."""
    model.eval()
    chunk = task.eval_chunk
    return split_records(task, split, (model_output(model, split.x[start:start + chunk], precision)
                                       for start in range(0, len(split), chunk)))


def split_records(task: Task, split: Split, outputs: Iterable[torch.Tensor]) -> dict[str, np.ndarray]:
    """A split's per-sample loss, prediction (and confidence, correctness) from the model's ``outputs`` on its
    samples in order, chunk by chunk: what ``evaluate`` returns, whichever forward made them."""
    kind = LOSS_KINDS[task.kind]
    losses, preds, confidences = [], [], []
    start = 0
    for out in outputs:
        y = split.y[start:start + len(out)]
        start += len(out)
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
