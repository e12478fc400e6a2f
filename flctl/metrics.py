"""Summary statistics of per-sample losses. numpy only: shared by training and reports (no torch)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

CVAR_Q = 0.9
ECE_BINS = 15          # equal-width confidence bins of the expected calibration error (Guo et al. 2017)
SPLITS = ("train", "test")
# The summary metrics split_summary may return, in the order tables and summaries show them; stored flattened as
# "<split>.<name>" (flatten) in the run database.
SUMMARY_METRICS = ("avg_loss", "max_loss", f"cvar_{CVAR_Q}", "accuracy", "violation_rate", "zero_multiplier_share",
                   "max_multiplier", "ece", "worst_group_avg_loss", "pruned_share", "samples_seen")


def cvar(losses: np.ndarray, q: float = CVAR_Q) -> float:
    """Conditional value at risk: the mean loss of the samples at or above the q-quantile. A diverged model's losses
    decide it without a quantile: a NaN loss has no place in their order, so the tail is undefined, NaN (as their
    mean is); else a +inf loss is the largest, in the tail whatever q, so the tail's mean is +inf. (numpy's quantile
    of either is NaN, which no loss is at or above: the mean of that empty selection was NaN with a RuntimeWarning,
    and +inf losses read as NaN.)"""
    losses = np.asarray(losses, dtype=np.float64)
    if np.isnan(losses).any():
        return math.nan
    if np.isposinf(losses).any():
        return math.inf
    threshold = np.quantile(losses, q)
    return float(losses[losses >= threshold].mean())


def calibration_bins(confidence: np.ndarray, correct: np.ndarray, bins: int = ECE_BINS) -> tuple[np.ndarray, ...]:
    """Per equal-width confidence bin (lo, hi] of [0, 1] (a confidence of exactly 0 goes to the first bin): the
    number of samples, the number correct and the sum of confidences; what ``ece`` and reliability diagrams read."""
    confidence = np.asarray(confidence, dtype=np.float64)
    correct = np.asarray(correct, dtype=np.float64)
    which = np.digitize(confidence, np.linspace(0.0, 1.0, bins + 1)[1:-1], right=True)
    return (np.bincount(which, minlength=bins), np.bincount(which, correct, bins),
            np.bincount(which, confidence, bins))


def ece(confidence: np.ndarray, correct: np.ndarray, bins: int = ECE_BINS) -> float:
    """Expected calibration error: Σ_b (n_b / n) |accuracy_b − mean confidence_b| over ``calibration_bins``."""
    _, n_correct, sum_confidence = calibration_bins(confidence, correct, bins)
    # per bin, Σ correct − Σ confidence = n_b (accuracy_b − confidence_b)
    return float(np.abs(n_correct - sum_confidence).sum() / len(confidence))


def worst_group_mean(values: np.ndarray, groups: Sequence[np.ndarray]) -> float:
    """The largest mean of ``values`` over the groups of every labelling in ``groups`` (e.g. UTKFace's genders and
    races: the worst-off of all 7 groups); each labelling gives one label per sample."""
    values = np.asarray(values, dtype=np.float64)
    return float(max(values[labels == g].mean() for labels in groups for g in np.unique(labels)))


def split_summary(
    losses: np.ndarray,
    *,
    correct: np.ndarray | None = None,
    eps: float | None = None,
    multipliers: np.ndarray | None = None,
    pruned: np.ndarray | None = None,
    confidence: np.ndarray | None = None,
    groups: Sequence[np.ndarray] = (),
) -> dict[str, float]:
    """avg/max loss, CVaR at 0.9, and where they apply: accuracy, violation rate, share of zero multipliers, share
    of samples pruned from the epoch (``samples_seen`` is added by the training loop: it is not a split's)."""
    losses = np.asarray(losses, dtype=np.float64)
    out = {
        "avg_loss": float(losses.mean()),
        "max_loss": float(losses.max()),
        f"cvar_{CVAR_Q}": cvar(losses, CVAR_Q),
    }
    if correct is not None:
        out["accuracy"] = float(np.mean(correct))
    if eps is not None:
        out["violation_rate"] = float(np.mean(losses > eps))
    if multipliers is not None:
        out["zero_multiplier_share"] = float(np.mean(multipliers == 0))
        out["max_multiplier"] = float(multipliers.max())
    if confidence is not None and correct is not None:
        out["ece"] = ece(confidence, correct)
    if len(groups):
        out["worst_group_avg_loss"] = worst_group_mean(losses, groups)
    if pruned is not None:
        out["pruned_share"] = float(np.mean(pruned))
    return out


# What the training loop reports of each epoch's training batches (flctl.train.EpochStats' fields): every logger is
# told them as ``epoch.<name>``, and each record file keeps them so (`flctl export`), both through ``epoch_numbers``.
EPOCH_NUMBERS = ("train_avg_loss", "train_max_loss", "max_multiplier")


def epoch_numbers(told: Mapping[str, float | None]) -> dict[str, float]:
    """An epoch's training-batch numbers (``told``: EPOCH_NUMBERS' names to values) under the keys a record file
    keeps and a logger is told live, ``epoch.<name>``, in EPOCH_NUMBERS' order; one not told (None) is left out."""
    return {f"epoch.{k}": float(v) for k in EPOCH_NUMBERS if (v := told.get(k)) is not None}


def flatten(per_split: dict[str, dict[str, float]]) -> dict[str, float]:
    """{'train': {'avg_loss': ..}} -> {'train.avg_loss': ..}: the names sweeps and reports refer to."""
    return {f"{split}.{k}": v for split, d in per_split.items() for k, v in d.items()}
