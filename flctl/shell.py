"""What a user's shell hands a command: its stop signals (STOP_SIGNALS), and stdout and stderr as they come: closed
(`flctl runs >&-`), a pipe whose reader has gone (`flctl run ... | head -1`), a full disk (`> /dev/full`), a terminal
that hung up. What cannot be printed is dropped and the command goes on (a run trains to its end, checkpointed and
recorded as ever); its exit code says whether its work succeeded, never whether its output could be written
(`ending`). Installed first by the console script (flctl.__main__), before anything that prints or opens a file is
imported; a process that calls flctl's API keeps its own streams."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
from typing import Any, TextIO

# The signals that stop a command, each ending it with 128 + its number after one line: SIGHUP (its terminal closed)
# 129, SIGINT (Ctrl-C, `flctl cancel`) 130, SIGTERM 143. A training command first ends its epoch, checkpoints and hands
# its runs back (flctl.runner.stop_on_signals).
STOP_SIGNALS = ("SIGHUP", "SIGINT", "SIGTERM")
# Left ignored when the command starts with it ignored: `nohup flctl ...` asks it to outlive its terminal.
KEPT_IGNORED = ("SIGHUP",)
# The stop signals this process received, in order: noted by the command's own handler (flctl.cli) and by a training
# loop's (flctl.runner.stop_on_signals), so that a command that ends because its workers stopped exits with the code
# of the signal that stopped them, whichever handler took it.
received: list[signal.Signals] = []


def stop_exit_code() -> int:
    """128 + the number of the last stop signal this process received (SIGINT's 130 where none: `flctl cancel`)."""
    return 128 + (received[-1] if received else signal.SIGINT)

# A stream whose write fails with one of these has no reader or no room left: from then on its writes are dropped.
# Any other error (a bug: writing to a closed file object) is raised as it would be.
DROPPED = frozenset({errno.EPIPE, errno.EBADF, errno.EIO, errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
# Of those, the ones that mean the reader went away or never was (`| head`, `>&-`, a terminal hung up): the output was
# not wanted past that point. The others (a full disk or quota, a disk's I/O error) lost output someone wanted.
GONE = frozenset({errno.EPIPE, errno.EBADF})


class Tolerant:
    """A text stream whose writes and flushes never raise for want of a reader or of room (DROPPED). The first such
    error points the stream's file descriptor at /dev/null: later writes, and the interpreter's own flush of the
    stream at exit (which would print "Exception ignored ... BrokenPipeError" and exit 120), succeed into nothing.
    ``failure`` keeps that first error; everything else is the wrapped stream's (isatty, fileno, encoding)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.failure: OSError | None = None
        try:
            self._terminal = stream.isatty()   # now: a terminal that hung up no longer says it is one
        except (OSError, ValueError):
            self._terminal = False

    def write(self, text: str) -> int:
        if self.failure is None:
            try:
                return self._stream.write(text)
            except OSError as exc:
                self._drop(exc)
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            self._drop(exc)

    @property
    def lost(self) -> bool:
        """Whether output someone wanted was lost (a full disk, an I/O error on a file), not merely unread."""
        return self.failure is not None and self.failure.errno not in GONE and not (
            self._terminal and self.failure.errno == errno.EIO)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def _drop(self, exc: OSError) -> None:
        if exc.errno not in DROPPED:
            raise exc
        if self.failure is None:
            self.failure = exc
        with contextlib.suppress(OSError, ValueError):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)
            self._stream.flush()     # what the failed write left in the stream's buffer goes to /dev/null now


def install() -> None:
    """Make this process's standard streams safe to write whatever the shell gave it: a closed descriptor 0, 1 or 2
    is opened on /dev/null (else Python's sys.stdout is None and the first print fails, and the next file this process
    opens, the run database, would take descriptor 1 and receive what is printed), and sys.stdout and sys.stderr
    become Tolerant."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    if sys.stdin is None:
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own stdin, open for its life
    if sys.stdout is None:
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    if sys.stderr is None:
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    if not isinstance(sys.stdout, Tolerant):
        sys.stdout = Tolerant(sys.stdout)  # type: ignore[assignment]
    if not isinstance(sys.stderr, Tolerant):
        sys.stderr = Tolerant(sys.stderr)  # type: ignore[assignment]


def ending(code: int) -> int:
    """The exit code of a command whose work ended with ``code``, once its output is flushed: ``code`` itself, since
    what could not be printed never changes it (a run that trained is a success however its summary fared, and 1 keeps
    each command's own meaning, such as `flctl reproduce`'s "a record file differs"). Where output someone wanted was
    lost (a full disk under stdout, not a closed pipe), one line on stderr says so."""
    out = sys.stdout
    out.flush()
    if isinstance(out, Tolerant) and out.lost and out.failure is not None:
        print(f"flctl: warning: stdout could not be written ({out.failure.strerror or out.failure}): what this command "
              "would have shown there was dropped; what it did is kept", file=sys.stderr)
    return code
