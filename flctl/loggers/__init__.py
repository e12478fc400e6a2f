"""Loggers: runs shown where researchers already look (TensorBoard, MLflow, Weights & Biases), live as they train
(`--log-to NAME`) and after the fact (`flctl export`). One file per logger, behind ``Logger``; flctl's own are
``tensorboard``, ``mlflow`` and ``wandb``, and an installed package adds one through the entry-point group
``flctl.loggers`` (docs/extending.md, "A logger of your own"), as launchers are added.

A logger is told what the training loop already brought to the host at each evaluation (``EpochStats``: the
epoch's mean and max training loss and largest multiplier, its summary metrics, the violation rate among them, and
the per-sample multipliers, of which it gets summary statistics and a histogram): it adds no host sync to a step. It
is given the run's configuration as hyper-parameters, and the run and sweep ids, task, method and library versions
as tags. A logger that fails never fails the training: one warning per run, the records intact, and a line at the
end naming what was not logged (`flctl export` fills it in later).

The package's rooms, each one job:

- ``base``: what a logger is (``Logger``) and is told (``RunInfo`` and ``run_info`` of a run; ``scalars`` of an
  epoch, its ``epoch.*`` keys made by flctl.metrics.epoch_numbers, as the record file keeps them for the export);
- ``registry``: which loggers there are (``BUILT_IN`` and the entry points, ``names``), one found by name with its
  tool installed (``get_logger``; ``install_extra``, the pip command that installs it), the loggers a command names
  checked before anything is written (``check``, which gives a ``Chosen``: their classes, found once, and names),
  and where they write (``where``);
- ``tracker_guard``: every call to a tracker, its once-per-launch set-up included, made in a thread of its own and
  waited for at most FLCTL_TRACKER_TIMEOUT_S (``call_tracker``), so that a tracker that never answers holds a
  command that long, not the minutes of its own retries; what the process remembers of trackers that gave no
  answer; the wording of a failure (``describe``) and its warning (``warn``);
- ``session``: a launch's set-up (``prepare``) and ``Logging``, the logs of the runs one process trains or exports,
  each logger's class found once for it;
- ``export``: `flctl export`'s replay of finished runs; ``tensorboard``, ``mlflow``, ``wandb``: one logger each.

What callers use is importable from here."""

from __future__ import annotations

from flctl.loggers.base import Logger, RunInfo, run_info, scalars
from flctl.loggers.registry import BUILT_IN, GROUP, Chosen, check, get_logger, install_extra, names, where
from flctl.loggers.session import Logging, prepare
from flctl.loggers.tracker_guard import call_tracker, describe, warn

__all__ = ["BUILT_IN", "GROUP", "Chosen", "Logger", "Logging", "RunInfo", "call_tracker", "check", "describe",
           "get_logger", "install_extra", "names", "prepare", "run_info", "scalars", "warn", "where"]
