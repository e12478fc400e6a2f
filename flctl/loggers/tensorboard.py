"""The ``tensorboard`` logger: event files under RESULTS/tensorboard/<sweep id or "runs">/<run id>/, which
`tensorboard --logdir RESULTS/tensorboard` shows (on a cluster: the shared results folder, so that every node's
workers write where one TensorBoard reads). Hyper-parameters go to its HParams tab, the multipliers to a histogram."""

from __future__ import annotations

import json
import shutil
from typing import Any

from flctl.loggers.base import Logger, RunInfo


class TensorBoard(Logger):
    name = "tensorboard"
    needs = "tensorboard"
    extra = "tensorboard"
    imports = ("torch.utils.tensorboard", "tensorboard.compat.proto.summary_pb2")

    @classmethod
    def where(cls, results_root: Any) -> str:
        from flctl.layout import Layout

        return f"`tensorboard --logdir {Layout(results_root).tensorboard_root}`"

    def start(self, run: RunInfo) -> None:
        from torch.utils.tensorboard import SummaryWriter

        from flctl.layout import Layout

        folder = Layout(self.results_root).tensorboard(run.sweep_id, run.run_id)
        if run.replay:                   # an export replaces what an earlier log of the run left
            shutil.rmtree(folder, ignore_errors=True)
        self.run, self.last = run, dict[str, float]()
        # a deep queue: a full one (10 events by default) makes each epoch wait for the writer thread
        self.writer = SummaryWriter(str(folder), max_queue=10_000, flush_secs=30)
        self.writer.add_text("flctl/run", run.title or run.run_id)    # the folder is the run id; this, its name
        self.writer.add_text("flctl/config", "```\n" + json.dumps(run.params, indent=1, default=str) + "\n```")
        self.writer.add_text("flctl/tags", "\n".join(f"{k}: {v}  " for k, v in run.tags.items()))

    def log(self, epoch: int, scalars: dict[str, float], multipliers: Any = None) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        # one event holding the epoch's numbers: as add_scalar writes them, an event each
        values = [Summary.Value(tag=key, simple_value=value) for key, value in scalars.items()]
        self.writer._get_file_writer().add_summary(Summary(value=values), epoch)
        if multipliers is not None and len(multipliers):
            self.writer.add_histogram("multipliers", multipliers, epoch)
        self.last |= {k: v for k, v in scalars.items() if not k.startswith("epoch.")}

    def finish(self, status: str) -> None:
        hparams = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in self.run.params.items()}
        self.writer.add_hparams({**hparams, "status": status}, {f"hparam/{k}": v for k, v in self.last.items()},
                                run_name=".")
        self.writer.close()
