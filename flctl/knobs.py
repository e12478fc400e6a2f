"""The knobs of a launch (workers, threads, attempts, checkpoint interval): each one's default and check, written
once. Kept apart from flctl.launch (submitit, SQLAlchemy) so that the CLI declares its options and help from them
without importing either."""

from __future__ import annotations

import math
import os

from flctl.errors import ConfigError

DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_CHECKPOINT_EVERY_S = 60.0
# Seconds `flctl cancel` gives a worker to checkpoint and hand its cell back before it is killed.
DEFAULT_CANCEL_TIMEOUT_S = 60.0


def check_count(flag: str, value: object) -> None:
    """A count such as --workers, given (None: not given) or read from a spec's TOML: an integer of at least 1.
    ConfigError otherwise; a TOML ``true`` is refused, though Python counts it as the integer 1."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(f"{flag} must be an integer of at least 1, got {value!r}")


def check_checkpoint_every(value: object) -> None:
    """--checkpoint-every as seconds >= 0 (0: every epoch); ConfigError for anything else (a negative, NaN, a TOML
    ``true``)."""
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and value >= 0):
        raise ConfigError(f"--checkpoint-every must be a number of seconds >= 0, got {value!r}")
# The longest one tracker call (a logger's set-up, a run's start, an evaluation's log, its finish) may hold a command
# before flctl gives that logger up for the run (flctl.loggers): a tracker that never answers (a server that accepts
# and stalls, W&B waiting on a network) would otherwise hold training for minutes. FLCTL_TRACKER_TIMEOUT_S sets it.
DEFAULT_TRACKER_TIMEOUT_S = 30.0


def tracker_timeout_s() -> float:
    """FLCTL_TRACKER_TIMEOUT_S as seconds (DEFAULT_TRACKER_TIMEOUT_S when unset); ConfigError for anything but a
    positive, finite number (``30s``, ``0``, ``inf``, NaN)."""
    raw = os.environ.get("FLCTL_TRACKER_TIMEOUT_S")
    if raw is None:
        return DEFAULT_TRACKER_TIMEOUT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ConfigError(f"FLCTL_TRACKER_TIMEOUT_S must be a positive number of seconds (e.g. 30), got {raw!r}")
    return seconds


# Without a terminal (a log file, nohup, CI, Slurm), `run`, `sweep --wait`, `status --watch` and `paper` print a
# timestamped line at least this often (and at each evaluation), so that a log shows a live job.
LOG_EVERY_S = 30.0


# A CPU step of fewer floating-point operations than this (6 x parameters x batch: forward and backward) runs fastest
# on one thread: its ops are too small to split, and the extra threads spin, the more so on a busy machine
# (benchmarks/bench_threads.py: a two-moons step is about 16 MFLOP).
ONE_THREAD_BELOW_FLOP = 1e8


def usable_cores() -> int:
    """The cores this process may run on (its affinity; os.cpu_count() where there is none). Never the load: the
    thread count changes a run's rounding (oneDNN and reductions split their work by it), so a choice that followed
    the load would give the same command different records on the same machine."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cpu_threads(params: int, batch: int) -> int:
    """torch threads for a CPU run whose model has ``params`` trainable parameters and trains on batches of
    ``batch``: one for a small step, else the cores this process may use. The same on every call on one machine
    (and one affinity), however busy it is."""
    return 1 if 6 * params * batch < ONE_THREAD_BELOW_FLOP else usable_cores()


def threads_of_a_run(given: int | None) -> int | str | None:
    """A single run's torch threads (`flctl run --threads`, flctl.api.run): as given; else OMP_NUM_THREADS rules
    where set (None: torch obeys it); else "auto" (cpu_threads, once the model is built)."""
    check_count("--threads", given)
    if given is not None:
        return given
    return None if os.environ.get("OMP_NUM_THREADS", "").strip() else "auto"
