"""A run's files under ``runs/<id>/`` (checkpoint.pt, model.pt, extras.npz), written from host memory and whole or
not at all: a state's host copies (``host_copy``: the writer thread that saves them makes no CUDA call, and
``device_tensors`` finds what was not copied), ``torch.save`` through a temporary file (``atomic_save``), a task's
extras (``save_extras``), and a checkpoint that cannot be loaded moved aside (``set_aside``). What a checkpoint holds
is flctl.cell's (``Cell.state_dict``)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import IO, Any, cast

import numpy as np
import torch

from flctl.fs import atomic_path
from flctl.layout import RunFolder

# A checkpoint's entries that hold plain Python numbers only: no tensor to copy or look for in them.
PLAIN = frozenset({"history", "py_rng"})


def host_copy(obj: Any) -> Any:
    """A copy of a (nested) state dict in host memory, whose tensors no longer change as training goes on.

    A device tensor is copied into pinned host memory, asynchronously on the current stream (so after every step
    queued there), and one wait at the end covers all the copies: the writer thread that saves the result then does
    file I/O only. (Before, device clones were handed to the writer thread: its `.cpu()` ran on the legacy default
    stream, which does not wait for the cell's stream, and it made CUDA calls while a graph was being captured.)
    Freeing pinned memory records a CUDA event: the training thread drops the copies (flctl.writer.Writer)."""
    devices: set[torch.device] = set()

    def copy(o: Any) -> Any:
        if isinstance(o, torch.Tensor):
            o = o.detach()
            if o.device.type == "cpu":
                return o.clone()
            devices.add(o.device)
            cuda = o.device.type == "cuda"     # empty_like: the same strides (a channels_last weight's momentum)
            return torch.empty_like(o, device="cpu", pin_memory=cuda).copy_(o, non_blocking=cuda)
        if isinstance(o, dict):
            return {k: copy(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return type(o)(copy(v) for v in o)
        return o

    out = copy(obj)
    for device in devices:
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()
    return out


def device_tensors(obj: Any) -> list[torch.Tensor]:
    """The tensors of a nested state that are not in host memory."""
    if isinstance(obj, torch.Tensor):
        return [] if obj.device.type == "cpu" else [obj]
    values = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
    return [t for v in values for t in device_tensors(v)]


def set_aside(checkpoint: Path, why: BaseException) -> Path:
    """Move a checkpoint that cannot be loaded to ``<name>.corrupt-<UTC time>`` beside it, with a one-line
    warning on stderr; the run then starts from scratch (its records are rewritten as it goes)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = checkpoint.with_name(f"{checkpoint.name}.corrupt-{stamp}")
    n = 1
    while aside.exists():                 # set aside twice in one second: keep both
        n += 1
        aside = checkpoint.with_name(f"{checkpoint.name}.corrupt-{stamp}-{n}")
    checkpoint.rename(aside)
    # torch's messages run to 6 lines, and the weights_only one advises a load that would run planted code
    reason = (str(why).strip().splitlines() or [""])[0].split(". ")[0][:160]
    print(f"flctl: warning: checkpoint {checkpoint} cannot be loaded ({type(why).__name__}: {reason}); moved to "
          f"{aside.name}, starting the run from scratch", file=sys.stderr, flush=True)
    return aside


def save_extras(run_dir: Path, extras: dict[str, np.ndarray]) -> dict[str, str]:
    """A task's extras of a finished run (Task.extras: a decision grid, a fit) in its folder; its artifact entry."""
    if not extras:
        return {}
    path = RunFolder(run_dir).extras
    with atomic_path(path, parents=False) as tmp, open(tmp, "wb") as f:
        np.savez(f, **extras)  # type: ignore[arg-type]  # numpy's stub reads **kwds as its allow_pickle
    return {"extras": str(path)}


def atomic_save(obj: Any, path: Path) -> None:
    """``torch.save`` whole or not at all (flctl.fs.atomic_path). Written through a file that keeps the first
    OSError: torch's writer reports a failed write as `[enforce fail at inline_container.cc] unexpected pos`,
    which hides the errno that tells a full disk (one line naming the path, the run resumable) from a bug."""
    with atomic_path(path, parents=False) as tmp, open(tmp, "wb") as f:
        out = _KeepsError(f)
        try:
            torch.save(obj, cast(IO[bytes], out))     # torch calls write() and flush() only
        except RuntimeError as exc:
            if out.error is not None:
                raise out.error from exc
            raise


class _KeepsError:
    """A binary file for torch.save that remembers the first OSError of a write."""

    def __init__(self, f: Any) -> None:
        self.f, self.error = f, cast(OSError | None, None)

    def write(self, data: bytes) -> int:
        try:
            return self.f.write(data)
        except OSError as exc:
            self.error = self.error or exc
            raise

    def flush(self) -> None:
        self.f.flush()
