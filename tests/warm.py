"""`python -m flctl ...`, `python -c CODE ...` and `python script.py ...` as separate processes without the ~5 s of CPU
a new interpreter spends importing torch, torch._dynamo and scikit-learn (most of this suite's time on 2 cores).

Each process is forked from a forkserver (multiprocessing's) that imported those third-party libraries once per
pytest worker and nothing of flctl: flctl, its console and its task registry are imported in the child, under the
child's own environment and working directory, as in a fresh `python`, with sys.path laid out as a fresh `python`
lays it out: its first entry, then the child's PYTHONPATH, then the rest of the server's (the installation's). What
differs from a fresh interpreter:
- which third-party modules are already in sys.modules (a PYTHONPATH entry cannot shadow those), and sys.path keeps
  the entries pytest added to the worker's (the checkout);
- /proc/<pid>/cmdline is the forkserver's, so a process that `flctl cancel` must recognise by its command line
  (an `flctl sweep` that is its own worker) stays a real interpreter;
- the process ends after its atexit handlers without the interpreter's finalization: what a command leaves open
  (a database connection) stays open until the process is gone, where a fresh interpreter's teardown would close it.
So tests about start-up and imports (test_process's import checks, the README's Quick start, first contact) keep
starting real interpreters.
tests/test_warm.py holds a warm process to a new interpreter on what the tests rely on.

`Popen` and `run` take the subset of subprocess's arguments the tests use; output goes through files (not pipes), so
a process that prints a lot never blocks on a full pipe.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import traceback
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PIPE, STDOUT, DEVNULL = subprocess.PIPE, subprocess.STDOUT, subprocess.DEVNULL
# What every flctl process imports before it does any work; nothing of flctl, whose import reads the environment.
# (pydantic: typer's parameter adapters; sqlalchemy.orm and alembic: the store and its migrations. Those three take
# `flctl status` from 0.26 to 0.20 CPU-s, a one-epoch `flctl run` from 0.65 to about 0.5. matplotlib is left out: reports
# would gain 0.4 s, but the larger server made every other child slower.)
PRELOAD = ["torch", "torch._dynamo", "torch.optim", "torchvision", "PIL.Image", "sklearn.datasets", "numpy",
           "pyarrow.parquet", "sqlalchemy", "sqlalchemy.orm", "alembic.runtime.migration", "pydantic", "typer",
           "rich.console", "rich.progress", "optuna", "submitit"]
_context = multiprocessing.get_context("forkserver")
_context.set_forkserver_preload(PRELOAD)


def _stream(fd: int, env: dict[str, str], errors: str):
    """A text stream on ``fd`` as a new interpreter opens its stdout/stderr on a file (PYTHONIOENCODING honoured)."""
    import codecs
    import io

    encoding, _, chosen = env.get("PYTHONIOENCODING", "").partition(":")
    return io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding=codecs.lookup(encoding or "utf-8").name,
                            errors=chosen or errors, line_buffering="PYTHONUNBUFFERED" in env,
                            write_through="PYTHONUNBUFFERED" in env)


def _pythonpath(env: Mapping[str, str], cwd: str) -> list[str]:
    """PYTHONPATH's entries as an interpreter started in ``cwd`` puts them on sys.path: made absolute from ``cwd``
    and normalised (an empty entry is ``cwd`` itself); an empty PYTHONPATH has none."""
    value = env.get("PYTHONPATH", "")
    return [os.path.abspath(os.path.join(cwd, p)) for p in value.split(os.pathsep)] if value else []


def _child(argv: list[str], env: dict[str, str], cwd: str, out: str | None, err: str | None) -> None:
    """In the forked process: become `python *argv` (environment, directory, stdout/stderr, sys.argv, sys.path)."""
    import runpy

    # Started daemonic, so a process a failed test leaves behind dies with the pytest worker instead of holding its
    # exit; inside, not daemonic, so it may start processes of its own (a DataLoader's workers), as any program may.
    multiprocessing.current_process()._config["daemon"] = False      # type: ignore[attr-defined]
    multiprocessing.set_start_method(None, force=True)                # the platform's default, not the forkserver
    inherited = _pythonpath(os.environ, os.getcwd())        # the server's, as its interpreter read it at start
    installation = [p for p in sys.path[1:] if p not in inherited]
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for fd, path in ((1, out), (2, err)):
        if path is not None:
            target = os.open(path, os.O_WRONLY | os.O_APPEND)
            os.dup2(target, fd)
            os.close(target)
    sys.stdout, sys.stderr = _stream(1, env, "strict"), _stream(2, env, "backslashreplace")
    first = cwd if argv[0] == "-m" else "" if argv[0] == "-c" else str(Path(argv[0]).resolve().parent)
    sys.path[:] = [first, *_pythonpath(env, cwd), *installation]
    code: Any = 0
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
        else:
            sys.argv = list(argv)
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        code = e.code
    except KeyboardInterrupt:                    # as an interpreter does: die of the signal
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


class Popen:
    """subprocess.Popen of ``[sys.executable, ...]`` on a warm fork: pid, poll, wait, communicate, signals."""

    def __init__(self, args: list[str], *, stdout: int | None = None, stderr: int | None = None,
                 env: dict[str, str] | None = None, cwd: str | Path | None = None, text: bool = True,
                 errors: str = "strict") -> None:
        assert args[0] == sys.executable and text, "warm processes run this Python, in text mode"
        self.args, self.returncode, self._errors = list(args), None, errors
        self._dir = tempfile.mkdtemp(prefix="flctl-warm-")
        weakref.finalize(self, shutil.rmtree, self._dir, True)
        self._out = self._file("stdout") if stdout == PIPE else os.devnull if stdout == DEVNULL else None
        self._err = (self._out if stderr == STDOUT else self._file("stderr") if stderr == PIPE
                     else os.devnull if stderr == DEVNULL else None)
        self._proc = _context.Process(target=_child, args=(self.args[1:], dict(os.environ if env is None else env),
                                                           str(cwd or os.getcwd()), self._out, self._err),
                                      daemon=True)
        self._proc.start()
        self.pid: int = self._proc.pid                   # type: ignore[assignment]

    def _file(self, name: str) -> str:
        path = os.path.join(self._dir, name)
        open(path, "w").close()
        return path

    def poll(self) -> int | None:
        if self.returncode is None and not self._proc.is_alive():
            self.returncode = self._proc.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._proc.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode                           # type: ignore[return-value]

    def _read(self, path: str | None, own: bool) -> str | None:
        if not own or path is None:
            return None
        with open(path, encoding="utf-8", errors=self._errors) as f:
            return f.read()

    def peek(self) -> str:
        """What the process has written to its stdout (PIPE) so far: a test waits on what it said, not on a sleep."""
        return self._read(self._out, self._out != os.devnull) or ""

    def communicate(self, timeout: float | None = None) -> tuple[str | None, str | None]:
        self.wait(timeout)
        return (self._read(self._out, self._out != os.devnull),
                self._read(self._err, self._err not in (os.devnull, self._out)))

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def run(args: list[str], *, capture_output: bool = False, timeout: float | None = None, **kw) -> \
        subprocess.CompletedProcess:
    """subprocess.run of ``[sys.executable, ...]`` on a warm fork (killed at ``timeout``, as subprocess.run does)."""
    if capture_output:
        kw.update(stdout=PIPE, stderr=PIPE)
    proc = Popen(args, **kw)
    try:
        out, err = proc.communicate(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    return subprocess.CompletedProcess(args, proc.returncode, out, err)    # type: ignore[arg-type]
