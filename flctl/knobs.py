"""The knobs of a launch (workers, threads, attempts, checkpoint interval): each one's default and check, written
once. Kept apart from flctl.launch (submitit, SQLAlchemy) so that the CLI declares its options and help from them
without importing either."""

from __future__ import annotations

from flctl.errors import ConfigError

DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_CHECKPOINT_EVERY_S = 60.0
SLURM_DEFAULT_WORKERS = 64
# Seconds `flctl cancel` gives a worker to checkpoint and hand its cell back before it is killed.
DEFAULT_CANCEL_TIMEOUT_S = 60.0
# Most cells of a small model (Task.batched) one worker trains together by default, by device kind
# (flctl.launch.batch_runs_for, which says what each was chosen from).
AUTO_BATCH_RUNS = {"cuda": 8, "cpu": 16}


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
# Without a terminal (a log file, nohup, CI, Slurm), `run`, `sweep --wait`, `status --watch` and `paper` print a
# timestamped line at least this often (and at each evaluation), so that a log shows a live job.
LOG_EVERY_S = 30.0
