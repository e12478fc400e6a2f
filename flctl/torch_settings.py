"""torch's process-wide settings while cells together train (flctl.train): on CUDA, its float32 maths and
autotuned convolutions (``set_cuda_math``); on the CPU, its threads (``cpu_threads_while``), put back after."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from flctl.knobs import cpu_threads

if TYPE_CHECKING:
    from flctl.cell import Cell


def set_cuda_math(device: torch.device) -> None:
    """torch's float32 maths and convolution kernels for cells that train on ``device`` (nothing off CUDA)."""
    if device.type != "cuda":
        return
    # float32 on CUDA as torch has done since 1.12, set here so that a torch changing it cannot change a run's
    # numbers unseen: convolutions in cuDNN's TF32, matmuls in full float32 (torch 2.9 began moving these
    # switches to `fp32_precision`; the old names still set them).
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = False
    # Autotuned convolutions (a run's shapes are fixed), unless deterministic kernels were asked for.
    torch.backends.cudnn.benchmark = not (torch.backends.cudnn.deterministic
                                          or torch.are_deterministic_algorithms_enabled())


@contextlib.contextmanager
def cpu_threads_while(threads: int | str | None, c: Cell, device: torch.device) -> Iterator[dict[str, Any]]:
    """torch's threads for CPU cells while they train (flctl.train.train_together's ``threads``: a number, "auto",
    chosen from ``c``'s step, or None, the process's), put back after; yields what ``trained_with`` records of them."""
    before = torch.get_num_threads()
    if device.type != "cpu":
        yield {}
        return
    if threads is None:
        yield {"threads": before, "threads_from": "OMP_NUM_THREADS" if os.environ.get("OMP_NUM_THREADS") else
               "the process"}
        return
    n = threads if isinstance(threads, int) else cpu_threads(
        sum(p.numel() for p in c.model.parameters() if p.requires_grad), c.cfg.batch_size)
    torch.set_num_threads(n)
    try:
        yield {"threads": n, "threads_from": "--threads" if isinstance(threads, int) else "auto"}
    finally:
        torch.set_num_threads(before)
