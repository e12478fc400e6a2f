"""The errors flctl raises on purpose, in one light module: any layer raises them without importing another
layer (config, store, migrations), and the CLI turns each into one `error:` line with exit code 2."""

from __future__ import annotations


class ConfigError(ValueError):
    """Bad user input (a run configuration, a sweep, a spec, a report request); the message is one line and names
    the fix."""


class StoreError(RuntimeError):
    """The database cannot be used (unreachable, corrupt, other schema); the message is one line."""


class DamagedRow(StoreError):
    """A run's row holds a column flctl cannot read (invalid JSON, or JSON of another shape: another tool's write, a
    damaged file). A reader of that one run refuses it in one line, exit 1 (damaged state, not bad input); listings
    and reports leave it out with a warning (flctl.db.checked.checked_runs)."""

    exit_code = 1
    FIX = "restore that row from a backup, or delete it and train the run again"

    def __init__(self, run_id: str, column: str, why: str) -> None:
        said = run_id if run_id.isalnum() and len(run_id) <= 64 else repr(run_id[:24])     # an id damaged too
        self.run_id, self.column = run_id, column
        self.damage = f"run {said}'s {column} column is damaged ({why})"
        super().__init__(f"{self.damage}; {self.FIX}")


class DatabaseDeleted(StoreError):
    """A sweep's SQLite database is no longer there (Store.open without create): the ground moved."""


class OlderSchema(StoreError):
    """A command that only reads met a database from an older flctl (`flctl migrate` upgrades it)."""


class EmptyDatabase(StoreError):
    """A command that only reads met an empty database, flctl's not made yet (`flctl migrate`, run and sweep make
    its schema)."""


class NewerSchema(RuntimeError):
    """The database was written by a newer flctl (its revision is not among ours)."""


class PartlyDone(RuntimeError):
    """A step of a command refused its input (the one line says why) after earlier steps of the same command wrote
    what stays written (cells trained, sweeps recorded): not "bad input, nothing written" (exit 2) but exit 1."""

    exit_code = 1


class ClaimLost(RuntimeError):
    """This process no longer holds a run's claim: it was presumed lost (no heartbeat for longer than the stale
    bound) and another worker took the run over. It must stop without touching the run's files or row."""


# A worker process whose device failed for good exits with this code (EX_TEMPFAIL: try again, elsewhere), after it
# recorded the cells it was training; a fresh process takes its place (flctl.launch.worker).
DEVICE_LOST_EXIT = 75

# What CUDA says when the context is dead: every later CUDA call in the process fails, `torch.manual_seed` of a CPU run
# included. Out-of-memory is not among them: it leaves the context usable.
_FATAL_DEVICE_SIGNS = ("CUDA error", "CUBLAS_STATUS_", "CUDNN_STATUS_", "illegal memory access", "device-side assert",
                       "unspecified launch failure", "illegal instruction", "misaligned address")


def is_fatal_device_error(exc: BaseException) -> bool:
    """Whether ``exc`` says this process's device context may be dead (a device-side assert, an illegal address, a
    launch failure): torch.AcceleratorError (torch >= 2.8) or, before it, a RuntimeError naming a CUDA error; not
    out-of-memory or an unsupported operation, which leave it usable. The worker then checks that the device really
    stopped working (flctl.launch.worker) before it gives the process up."""
    text = str(exc)
    if type(exc).__name__ == "OutOfMemoryError" or not isinstance(exc, RuntimeError) or "out of memory" in text \
            or "NOT_SUPPORTED" in text:
        return False
    return type(exc).__name__ == "AcceleratorError" or any(sign in text for sign in _FATAL_DEVICE_SIGNS)


class DeviceLost(RuntimeError):
    """A worker running in the calling process (`sweep --wait`, the debug executor) met a fatal device error: the
    process's device context is dead. Its cells are recorded, and a fresh worker process was started in its place
    where the executor can start one."""


class GroundMoved(RuntimeError):
    """The database file or the results folder a process works in was deleted or replaced while it ran: it stops
    and writes no more (its writes would go into an unlinked file, or make an empty database in the new one's
    place). The message is one line."""


class DiskFull(OSError):
    """A write that found no room (flctl.fs.FULL_ERRNOS). Its text is one line naming the file; the file itself is
    left as it was (see flctl.fs.atomic_path), so the run that wrote it can resume once there is space."""

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror} (disk or quota full, or a file size limit)"
