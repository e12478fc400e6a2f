"""The guard of every call flctl makes to a tracker (a logger's tool): made in a thread of its own and waited for at
most FLCTL_TRACKER_TIMEOUT_S (flctl.knobs.tracker_timeout_s), so that a tracker that never answers holds a command
that long, not the minutes of its own retries; whatever it raises is a failure, never the command's. Beside it, what
this process remembers of trackers (those that gave no answer: not called again) and the wording of a failure."""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Callable
from typing import Any

from flctl.loggers.base import Logger


def call_tracker(logger: type[Logger], call: Callable[[], Any]) -> BaseException | None:
    """The one guard of every call to ``logger``'s tool: None when ``call()`` returned within FLCTL_TRACKER_TIMEOUT_S,
    else what it raised, or a TimeoutError. The logger's tool (its ``needs`` and ``imports``) is imported first, in
    this thread and off the clock (an import of MLflow, W&B or torch's TensorBoard writer takes seconds, and is no
    answer of a tracker). The call itself runs in a daemon thread that this one waits for, so that calls are still
    made one at a time (a logging thread running beside training raced its imports); one given up on is left to end
    there, and never holds the process's exit."""
    from flctl.knobs import tracker_timeout_s

    try:
        for module in (logger.needs, *logger.imports):
            if module is not None:
                importlib.import_module(module)
        seconds = tracker_timeout_s()
    except Exception as exc:     # noqa: BLE001 - a tool that will not import fails its logger, not the command
        return exc
    said: list[BaseException | None] = []

    def made() -> None:
        try:
            call()
            said.append(None)
        except BaseException as exc:     # noqa: BLE001 - even a tool's KeyboardInterrupt (a prompt's closed stdin)
            said.append(exc)             # is the tool's: a user's Ctrl-C reaches the waiting thread, not this one

    thread = threading.Thread(target=made, name=f"flctl-{logger.name}", daemon=True)
    thread.start()
    thread.join(seconds)
    return said[0] if said else TimeoutError(f"no answer within {seconds:g} s (FLCTL_TRACKER_TIMEOUT_S)")


def gave_no_answer(name: str) -> bool:
    """Whether logger ``name`` gave no answer in time once in this process (``no_answer``): it is not called again
    (its call may still hang in its thread, and each later run would wait the whole timeout again)."""
    return name in _NO_ANSWER


def no_answer(name: str) -> None:
    """Remember, for the rest of this process, that logger ``name`` gave no answer in time."""
    _NO_ANSWER.add(name)


def describe(failure: BaseException) -> str:
    """A failure in a warning: its kind and the first line of its message, after the socket's error it came from
    where there is one (a tool's own message, a URL and its retries, cuts off the "Connection refused" at its end)."""
    def first(exc: BaseException, most: int) -> str:
        return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:most]}"

    root, seen = failure, {id(failure)}
    while (below := root.__cause__ or root.__context__) is not None and id(below) not in seen:
        root = below
        seen.add(id(root))
    if root is failure or not isinstance(root, OSError):
        return first(failure, 200)
    return f"{first(root, 100)}, from {first(failure, 140)}"


def warn(text: str) -> None:
    print(f"flctl: warning: {text}", file=sys.stderr, flush=True)


# The loggers that gave no answer within FLCTL_TRACKER_TIMEOUT_S in this process: not called again (session.Logging).
_NO_ANSWER: set[str] = set()
