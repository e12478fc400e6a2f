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

    def to(self, device: torch.device | str) -> Split:
        return Split(self.x.to(device), self.y.to(device))


@dataclass
class Dataset:
    """Both splits and what the task knows about them. Per-sample facts in ``meta`` follow one convention, so that
    ``subset`` keeps them aligned with the ids: ``meta["train_NAME"]`` / ``meta["test_NAME"]`` hold one value per
    sample of that split, and ``meta["groups"][attr][split]`` one group label per sample."""

    train: Split
    test: Split
    meta: dict[str, Any] = field(default_factory=dict)

    def to(self, device: torch.device | str) -> Dataset:
        return Dataset(self.train.to(device), self.test.to(device), self.meta)

    def subset(self, n: int) -> Dataset:
        """At most ``n`` samples of each split, spread evenly over it (every k-th, first and last kept), so that a
        split ordered by class or by file name (UTKFace's begin with the age) keeps its range. The kept samples are
        renumbered 0..n-1 (ids are positions); the per-sample ``meta`` entries are cut to match."""
        import numpy as np

        picks = {name: np.unique(np.linspace(0, len(s) - 1, min(n, len(s))).round().astype(np.int64))
                 for name, s in (("train", self.train), ("test", self.test))}

        def cut(split: Split, idx: np.ndarray) -> Split:
            rows = torch.from_numpy(idx)
            return Split(split.x[rows], split.y[rows])

        def per_sample(values: Any, idx: np.ndarray) -> Any:
            return [values[i] for i in idx] if isinstance(values, list) else np.asarray(values)[idx]

        meta = dict(self.meta)
        for key, values in self.meta.items():
            split = key.split("_", 1)[0]
            if split in picks and "_" in key:
                meta[key] = per_sample(values, picks[split])
        if "groups" in meta:
            meta["groups"] = {attr: {sp: per_sample(v, picks[sp]) for sp, v in by_split.items()}
                              for attr, by_split in meta["groups"].items()}
        return Dataset(cut(self.train, picks["train"]), cut(self.test, picks["test"]), meta)


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


def crop_flip_params(b: int, generator: torch.Generator, device: torch.device, pad: int = 4) -> dict[str, Tensor]:
    """Random crop offsets and horizontal flips of ``b`` images (in this order from the generator)."""
    dy = torch.randint(0, 2 * pad + 1, (b,), device=device, generator=generator)
    dx = torch.randint(0, 2 * pad + 1, (b,), device=device, generator=generator)
    flip = torch.rand(b, device=device, generator=generator) < 0.5
    return {"dy": dy, "dx": dx, "flip": flip}


def crop_flip(x: Tensor, params: dict[str, Tensor], pad: int = 4) -> Tensor:
    """Batched CIFAR augmentation on the device: zero-pad by ``pad``, crop back at the drawn offsets, flip the drawn
    images horizontally. x: [B, C, H, W] (any dtype). One gather for the whole batch instead of a per-image loop."""
    b, c, h, w = x.shape
    padded = torch.nn.functional.pad(x, (pad, pad, pad, pad))                       # [B, C, H+2p, W+2p]
    rows = (params["dy"][:, None] + torch.arange(h, device=x.device))[:, :, None]   # [B, H, 1]
    cols = params["dx"][:, None] + torch.arange(w, device=x.device)                  # [B, W]
    cols = torch.where(params["flip"][:, None], cols.flip(1), cols)[:, None, :]      # [B, 1, W]
    batch = torch.arange(b, device=x.device)[:, None, None]
    out = padded.permute(0, 2, 3, 1)[batch, rows, cols].permute(0, 3, 1, 2)      # NHWC memory: channels_last
    # On CUDA the model is channels_last (flctl.cell.Cell.build): the gather's layout is already its own, where a
    # contiguous copy here cost a copy back in the first convolution. The CPU's models are NCHW.
    return out if out.is_cuda else out.contiguous()


class Normalize(torch.nn.Module):
    """uint8 images -> float, per-channel standardized; the first layer, so data can stay uint8 on the device."""

    mean: Tensor
    std: Tensor

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1) * 255.0)
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1) * 255.0)

    def forward(self, x: Tensor) -> Tensor:
        return (x.to(self.mean.dtype) - self.mean) / self.std      # float32, or a float64 copy of the model
