"""Small helpers shared by the tests."""

from __future__ import annotations

import subprocess
import traceback
from pathlib import Path

from flctl.config import RunConfig, resolve
from flctl.tasks import get_task


def config(task: str, method: str, **overrides) -> RunConfig:
    """A validated RunConfig from the task's defaults, as `flctl run` builds it."""
    p_min = overrides.pop("p_min", None)
    return resolve(get_task(task), method, overrides, p_min)


def lock_pins() -> dict[str, str]:
    """requirements.lock's pins for this interpreter and platform (a package can have one pin per Python range)."""
    from packaging.requirements import Requirement

    pins = {}
    for line in (Path(__file__).resolve().parents[1] / "requirements.lock").read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", line
            if req.marker is None or req.marker.evaluate():
                pins[req.name.lower()] = spec.version
    return pins


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in Path(root).rglob("*") if p.is_file()) if Path(root).exists() else []


def bound(seconds: float) -> float:
    """A wall-clock bound a test asserts, stretched by how loaded this machine is now (the 1-minute load average
    over its cores, at least 1): on a 2-core machine beside two busy processes a bound of a quiet one is twice too
    short, and the test would fail for the machine, not for flctl."""
    import os

    return seconds * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


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


def in_process(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`flctl *args` run in this process by click's runner, its result shaped as subprocess.run's (an exception
    other than SystemExit is appended to stderr as a traceback). For the commands a test needs done, not watched
    as a process: a new interpreter spends ~5 s of CPU importing torch, torch._dynamo and scikit-learn before it
    trains, and the suite's time is mostly that CPU. Signals, kills, exit codes of a real process and concurrent
    writers stay subprocesses."""
    from typer.testing import CliRunner

    from flctl.cli import app

    res = CliRunner().invoke(app, list(args), env={"COLUMNS": "200", **(env or {})})
    said = "".join(traceback.format_exception(res.exception)) \
        if res.exception and not isinstance(res.exception, SystemExit) else ""
    return subprocess.CompletedProcess(list(args), res.exit_code, res.stdout, res.stderr + said)


# The child of a driver script that runs `flctl ARGS` in a pseudo-terminal of its own (pty.fork: the controlling
# terminal of the session the child leads): as `python -m flctl` runs it, atexit handlers included, then the exit code.
# The driver's text replaces ARGS with the command line's repr; ``env`` lines set the child's environment first.
def pty_child(env: dict[str, str] | None = None) -> str:
    setting = f"    os.environ.update({env!r})\n" if env else ""
    return ("pid, master = pty.fork()\n"
            "if pid == 0:\n"
            f"{setting}"
            "    sys.stdout, sys.stderr, sys.argv, code = open(1, 'w', closefd=False), open(2, 'w', closefd=False), "
            "ARGS, 0\n"
            "    try:\n"
            "        runpy.run_module('flctl', run_name='__main__')\n"
            "    except SystemExit as e:\n"
            "        code = e.code\n"
            "    atexit._run_exitfuncs()\n"
            "    os._exit(code)\n")


def one_line_error(res: subprocess.CompletedProcess) -> str:
    """The exit-2 refusal's line; fails on a traceback or more than one line."""
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    return lines[0]
