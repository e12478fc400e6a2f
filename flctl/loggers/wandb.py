"""The ``wandb`` logger: a Weights & Biases run per flctl run, its id the run's id, in the project WANDB_PROJECT
(default "flctl"), grouped by sweep; WANDB_MODE=offline keeps it in RESULTS/wandb/ for `wandb sync`. The
multipliers go to a histogram."""

from __future__ import annotations

import os
import shutil
from typing import Any

from flctl.loggers.base import Logger, RunInfo


def project() -> str:
    """WANDB_PROJECT, default "flctl"."""
    return os.environ.get("WANDB_PROJECT") or "flctl"


class WandB(Logger):
    name = "wandb"
    needs = "wandb"
    extra = "wandb"

    @classmethod
    def where(cls, results_root: Any) -> str:
        from flctl.layout import Layout

        if os.environ.get("WANDB_MODE") == "offline":
            return f"{Layout(results_root).wandb}, offline: `wandb sync` it"
        return f"project {project()}"

    def start(self, run: RunInfo) -> None:
        import wandb

        from flctl.knobs import tracker_timeout_s
        from flctl.layout import Layout

        folder = Layout(self.results_root).wandb
        folder.mkdir(parents=True, exist_ok=True)
        if run.replay:     # an export replaces an earlier offline log of the run (online, W&B keeps one per step)
            for earlier in (folder / "wandb").glob(f"offline-run-*-{run.run_id}"):
                shutil.rmtree(earlier, ignore_errors=True)
        # silent before anything else: W&B online without an API key otherwise asks for one at a terminal, holding
        # the run until someone answers (and a closed stdin ends the prompt in a KeyboardInterrupt)
        wandb.setup(settings=wandb.Settings(silent=True))
        try:
            self.wb = wandb.init(project=project(), id=run.run_id, name=run.title or run.run_id,
                                 group=run.sweep_id, job_type=run.method, tags=[run.task, run.method],
                                 config={**run.params, "flctl": run.tags}, dir=str(folder), resume="allow",
                                 reinit="create_new", settings=wandb.Settings(
                                     silent=True, console="off", init_timeout=tracker_timeout_s()))
        except wandb.errors.UsageError as exc:
            if "API key" not in str(exc):
                raise
            raise RuntimeError("no W&B API key here: set WANDB_API_KEY (or run `wandb login`), or WANDB_MODE=offline "
                               "to keep the run in RESULTS/wandb for `wandb sync`") from None

    def log(self, epoch: int, scalars: dict[str, float], multipliers: Any = None) -> None:
        import wandb

        data: dict[str, Any] = dict(scalars)
        if multipliers is not None and len(multipliers):
            data["multipliers"] = wandb.Histogram(multipliers)
        self.wb.log(data, step=epoch)

    def finish(self, status: str) -> None:
        self.wb.summary["flctl.status"] = status
        from flctl.status import Status

        self.wb.finish(exit_code=0 if status == Status.COMPLETED else 1)
