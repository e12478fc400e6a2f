"""Small helpers shared by the tests."""

from __future__ import annotations

from pathlib import Path

from flctl.config import RunConfig, resolve
from flctl.tasks import get_task


def config(task: str, method: str, **overrides) -> RunConfig:
    """A validated RunConfig from the task's defaults, as `flctl run` builds it."""
    p_min = overrides.pop("p_min", None)
    return resolve(get_task(task), method, overrides, p_min)


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in Path(root).rglob("*") if p.is_file()) if Path(root).exists() else []


def wait_until(predicate, what: str = "a condition", timeout: float = 240, interval: float = 0.5,
               explain=None):
    """Poll ``predicate`` until it returns something truthy (returned); on timeout fail, with ``explain()``
    appended to the message when given (e.g. the queue and job logs)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}" + (f"\n{explain()}" if explain else ""))
