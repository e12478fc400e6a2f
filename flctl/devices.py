"""Where and how a run trains: its device (checked without torch, resolved with it) and its step engine (which
engines replay CUDA graphs, which compile, which keep the eager step's numbers)."""

from __future__ import annotations

import re

from flctl.errors import ConfigError

# How a cell's step runs (flctl.train): eager; captured, replayed as CUDA graphs (the eager step's kernels, so the
# same numbers: not part of the identity); compiled, through torch.compile (other kernels, other rounding: part of it);
# compiled-captured, the compiled step captured as CUDA graphs (inductor's fused kernels inside the graph: compiled's
# kernels, part of the identity as compiled is); captured-streams, captured, each cell of a worker's group replaying
# its graphs on a CUDA stream of its own, side by side (the same kernels: captured's numbers); auto, captured where
# that equals eager on CUDA, else eager (flctl.step.step_engine).
ENGINES = ("auto", "eager", "captured", "compiled", "compiled-captured", "captured-streams")
SAME_NUMBERS_ENGINES = ("auto", "eager", "captured", "captured-streams")
CAPTURED_ENGINES = ("captured", "compiled-captured", "captured-streams")   # CUDA graphs: CUDA only, the same batches
COMPILED_ENGINES = ("compiled", "compiled-captured")        # through torch.compile
ALONE_ENGINES = (*COMPILED_ENGINES, "captured-streams")    # whose cells never run as one grouped model

# Where a run may train: torch's CPU, its CUDA devices, or "auto" (resolved to one of them before a run is recorded,
# flctl.cli.common.check_device). Others (mps, tpu, xla) are not supported by the training engine.
DEVICE = re.compile(r"cpu|auto|cuda(:[0-9]+)?")


def device_problem(device: object) -> str | None:
    """What is wrong with a device name (None: nothing), checked without torch."""
    if isinstance(device, str) and DEVICE.fullmatch(device):
        return None
    return f"unknown device {device!r}; choose cpu, cuda, cuda:N or auto"


def resolve_device(device: str, *, here: bool = True, planning: bool = False) -> str:
    """The device a run or sweep trains on, checked at input and resolved (ConfigError otherwise): ``auto`` becomes
    cuda where CUDA is available, else cpu. torch is imported only for a CUDA device or auto. ``here``: the runs
    train on this machine, so CUDA must be there (not so for Slurm jobs submitted from a login node, where only the
    name is checked). ``planning`` (a dry run): nothing trains, so a named CUDA device is checked by name too, and a
    GPU sweep can be planned on a laptop; auto is still this machine's."""
    if (problem := device_problem(device)) is not None:
        raise ConfigError(problem)
    if device == "cpu":
        return device
    if not here or (planning and device != "auto"):
        if device == "auto":
            raise ConfigError("--device auto is resolved on this machine, not on the cluster's nodes; give cuda or cpu")
        return device
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not torch.cuda.is_available():
        raise ConfigError(f"--device {device}: CUDA is not available on this machine; use --device cpu")
    index, count = int(device.partition(":")[2] or 0), torch.cuda.device_count()
    if index >= count:
        raise ConfigError(f"--device {device}: this machine has {count} visible CUDA device(s) (cuda:0..cuda:{count - 1})")
    return device


def device_works() -> bool:
    """Whether this process's CUDA context still runs a kernel (False where CUDA was never used: then an error's
    text is all there is to go by). Some errors that name CUDA leave the context usable (a cuBLAS handle that could
    not be made for lack of memory, an invalid argument): those are a cell's own failure. Asked once per failure, by
    flctl.outcomes (its "device lost" row)."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return False
    try:
        torch.cuda.synchronize()
        return torch.ones(1, device="cuda").add_(1).item() == 2.0
    except Exception:
        return False
