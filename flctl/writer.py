"""The training loop's background writer: records and checkpoints on one thread, in submission order, fenced by the
run's claim. It does file I/O only (docs/design.md, "Streams and threads on CUDA")."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from flctl.errors import ClaimLost
from flctl.fs import fenced
from flctl.records.run_folder import PLAIN, atomic_save, device_tensors


class Writer:
    """Writes records and checkpoints on one background thread, in submission order (a checkpoint lands after
    the records of its epoch), so the loop does not wait for the disk. Leaving its ``with`` block waits for everything
    and re-raises a write's error; at most one checkpoint per run is pending at a time, which bounds the memory of
    snapshots (cells together checkpointing at the same epoch does not wait for each other's saves: with 50
    two-moons cells a worker, those waits were a tenth of its time). A process killed with writes pending resumes from an older checkpoint and redoes those epochs,
    identically. With a ``fence``, each write checks that the run's claim still holds (ClaimLost if not) just before
    its written file is renamed into place (flctl.fs.fenced), however long it waited in the queue or took.

    Its thread does file I/O only, and is handed host memory only (``checkpoint`` refuses a device tensor). The
    copies a checkpoint saves are freed by the training thread, once saved: freeing pinned memory records a CUDA
    event. So on CUDA this thread never makes a CUDA call, and cannot race the training stream or break a graph
    capture."""

    def __init__(self, fence: Callable[[str], bool] | None = None) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flctl-writer")
        self._pending: list = []
        # per run: its checkpoint being saved, and the list that holds its state (let go by the training thread)
        self._checkpoints: dict[str, tuple[Future, list[dict[str, Any]]]] = {}
        self._fence = fence

    def _fenced(self, run_id: str, fn: Callable, *args: Any) -> Any:
        if self._fence is None:
            return fn(*args)
        with fenced(lambda: self._still_held(run_id)):
            return fn(*args)

    def _still_held(self, run_id: str) -> None:
        if self._fence is not None and not self._fence(run_id):
            raise ClaimLost(f"run {run_id}: another worker holds it now; this write was dropped")

    def submit(self, run_id: str, fn: Callable, *args: Any) -> None:
        self._pending.append(self._pool.submit(self._fenced, run_id, fn, *args))

    def checkpoint(self, run_id: str, state: dict[str, Any], path: Path) -> None:
        """Save ``state`` (host tensors only: Cell.state_dict) at ``path`` once the writes before it are done."""
        if on_device := device_tensors({k: v for k, v in state.items() if k not in PLAIN}):
            # The writer thread must never touch the device: its copy would run on another stream than the one the
            # state was written on, and a CUDA call while the training thread captures a graph breaks the capture.
            raise ValueError(f"checkpoint of run {run_id}: {len(on_device)} tensors are on {on_device[0].device}, "
                             "not in host memory; copy them with flctl.records.run_folder.host_copy first")
        for done in [r for r, (future, _) in self._checkpoints.items() if r == run_id or future.done()]:
            self._let_go(done)        # saved copies are freed now: only saves still running hold memory
        saving = [state]      # the job holds the list, not the state: its last reference stays here
        future = self._pool.submit(self._fenced, run_id, _save_held, saving, path)
        self._checkpoints[run_id] = future, saving
        self._pending.append(future)

    def _let_go(self, run_id: str) -> None:
        """Wait for the run's checkpoint being saved, then free its copies here, on the training thread."""
        if (pending := self._checkpoints.pop(run_id, None)) is not None:
            future, saving = pending
            try:
                future.result()
            finally:
                saving.clear()

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        for future in pending:
            future.result()

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.flush()
        finally:
            self._pool.shutdown(wait=True)
            for _, saving in self._checkpoints.values():
                saving.clear()
            self._checkpoints.clear()


def _save_held(held: list[dict[str, Any]], path: Path) -> None:
    atomic_save(held[0], path)
