"""The ``local`` launcher: W worker processes on this machine (submitit's local executor), on CPU cores or GPUs."""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from flctl.errors import ConfigError
from flctl.knobs import check_count
from flctl.launch.backends import JobBody, Slot, SubmititLauncher


class Local(SubmititLauncher):
    name = cluster = "local"
    default_workers = "cores // threads, or GPUs x per-gpu with --device cuda"
    joins = True

    def describe(self) -> str:
        return "local: worker processes on this machine"

    def slots(self, cells: int, device: str, *, workers: int | None, threads: int | None, per_gpu: int
              ) -> list[Slot]:
        return local_slots(cells, device=device, workers=workers, threads=threads, per_gpu=per_gpu)

    def start(self, worker: JobBody, slots: Sequence[Slot], folder: Path, log: Path) -> list[Any]:
        with _stdio_to(log):
            return super().start(worker, slots, folder, log)


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def mps_daemon() -> str | None:
    """The folder where this machine's NVIDIA MPS control daemon listens (CUDA_MPS_PIPE_DIRECTORY, /tmp/nvidia-mps
    by default), or None where none runs. Processes sharing a GPU through MPS run their kernels side by side; without
    it they take turns on it (time-slicing). flctl starts no daemon and changes no GPU setting."""
    folder = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps")
    try:
        return str(folder) if stat.S_ISFIFO((folder / "control").stat().st_mode) else None
    except OSError:
        return None


def gpu_sharing(per_gpu: int) -> str:
    """How --per-gpu K workers share each GPU here, as a person reads it."""
    daemon = mps_daemon()
    if daemon is not None:
        return f"{per_gpu} workers share each GPU through NVIDIA MPS (its daemon listens in {daemon})"
    return (f"{per_gpu} workers share each GPU by taking turns on it: no NVIDIA MPS daemon runs here "
            "(`nvidia-cuda-mps-control -d` starts one; flctl changes no GPU setting)")


def cuda_devices() -> list[str]:
    """The CUDA devices this process may use, as CUDA_VISIBLE_DEVICES entries (imports torch)."""
    import torch

    count = torch.cuda.device_count()
    listed = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return listed[:count] if "CUDA_VISIBLE_DEVICES" in os.environ else [str(i) for i in range(count)]


def local_slots(cells: int, *, device: str, workers: int | None = None, threads: int | None = None,
                per_gpu: int = 1, cores: int | None = None, gpus: Sequence[str] | None = None) -> list[Slot]:
    """The local executor's workers. On the CPU: W = max(1, cores // threads) unless given, each with
    threads = cores // W (at least 1). On CUDA: W = GPUs x per_gpu, worker i on GPU i // per_gpu; ``cuda:N``: GPU N
    only (the worker sees it alone, as its cuda:0: Slot.device). Never more workers than cells
    (threads are then shared among the workers that run)."""
    for name, value in (("--workers", workers), ("--threads", threads), ("--per-gpu", per_gpu)):
        check_count(name, value)
    cores = cores or cpu_count()
    if device.startswith("cuda"):
        if gpus is None:
            gpus = cuda_devices()
        if device != "cuda":                  # cuda:N: that one device
            index = int(device.partition(":")[2] or 0)
            if index >= len(gpus):
                raise ConfigError(f"--device {device}: this machine has {len(gpus)} visible CUDA device(s)")
            gpus = [gpus[index]]
        if not gpus:
            raise ConfigError(f"--device {device}: no CUDA device is visible here (torch.cuda.device_count() is 0)")
        w = min(workers or len(gpus) * per_gpu, max(cells, 1))
        t = threads or max(1, cores // w)
        return [Slot(i, t, gpus[(i // per_gpu) % len(gpus)], per_gpu) for i in range(w)]
    w = min(workers or max(1, cores // (threads or 1)), max(cells, 1))
    t = threads or max(1, cores // w)     # the cores of workers a short sweep does not need go to the others
    return [Slot(i, t) for i in range(w)]


@contextlib.contextmanager
def _stdio_to(path: Path) -> Iterator[None]:
    """Point fds 1 and 2 at a file while local job controllers are spawned.

    submitit's local controllers inherit the submitting process's stdout/stderr; left attached, a pipe
    reader (`flctl sweep | tee`, subprocess capture) would wait until every job has finished.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600), "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
