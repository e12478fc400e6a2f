"""In-memory datasets that yield sample ids, in the airbench style: whole splits as tensors on the device."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor


@dataclass
class Split:
    """One split as tensors. Row i is sample id i: ids are positions, stable across runs of a task."""

    x: Tensor  # [N, ...] inputs
    y: Tensor  # [N] class index (long) or target value (float)

    def __len__(self) -> int:
        return self.x.shape[0]

    def to(self, device: torch.device | str) -> "Split":
        return Split(self.x.to(device), self.y.to(device))


@dataclass
class Dataset:
    train: Split
    test: Split
    meta: dict[str, Any] = field(default_factory=dict)

    def to(self, device: torch.device | str) -> "Dataset":
        return Dataset(self.train.to(device), self.test.to(device), self.meta)


def epoch_order(n: int, seed: int, epoch: int) -> Tensor:
    """The sample order of one epoch: a permutation (without replacement, so no id repeats in a batch).

    Seeded by (seed, epoch) rather than by a running generator, so a resumed run draws exactly the order an
    uninterrupted run would have drawn, without carrying generator state in the checkpoint.
    """
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g)


def batches(order: Tensor, batch_size: int) -> tuple[Tensor, ...]:
    """Split an epoch's order into batches of ids; the last batch may be smaller (no sample is dropped)."""
    return order.split(batch_size)
