"""The ``debug`` launcher: one worker in the launching process (submitit's debug executor), which returns once it
has trained every cell. Errors surface as they happen, in the command itself."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flctl.launch.backends import JobBody, Slot, SubmititLauncher


class Debug(SubmititLauncher):
    name = cluster = "debug"
    in_process = True

    def describe(self) -> str:
        return "debug: one worker in this process"

    def slots(self, cells: int, device: str, *, workers: int | None, threads: int | None, per_gpu: int
              ) -> list[Slot]:
        return [Slot(0)] if cells else []

    def start(self, worker: JobBody, slots: Sequence[Slot], folder: Path, log: Path) -> list[Any]:
        jobs = super().start(worker, slots, folder, log)
        for job in jobs:            # submitit's debug jobs run in this process when their result is asked for
            job.result()
        return jobs
