"""A process forked warm (tests/warm.py) behaves as `python ...` would, on what the tests that use it rely on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import warm

pytestmark = pytest.mark.notorch

SHOW = ("import json, os, sys; print(json.dumps([sys.argv, os.getcwd(), sys.path[:4], os.environ.get('FLCTL_X'), "
        "'flctl' in sys.modules, [(f.encoding, f.errors) for f in (sys.stdout, sys.stderr)]])); "
        "print('to stderr', file=sys.stderr); sys.exit(3)")


@pytest.mark.parametrize("start", [subprocess.run, warm.run], ids=["new", "warm"])
def test_argv_directory_environment_output_and_exit_code_are_a_new_interpreters(start, tmp_path: Path) -> None:
    env = {**os.environ, "FLCTL_X": "given", "PYTHONPATH": f"plugins/../mine::{tmp_path.parent}",
           "PYTHONIOENCODING": "latin-1"}
    out = start([sys.executable, "-c", SHOW, "a", "b"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert out.returncode == 3, out.stderr
    path = ["", str(tmp_path / "mine"), str(tmp_path), str(tmp_path.parent)]    # PYTHONPATH's, from the cwd
    streams = [["iso8859-1", "strict"], ["iso8859-1", "backslashreplace"]]
    assert json.loads(out.stdout) == [["-c", "a", "b"], str(tmp_path), path, "given", False, streams]
    assert out.stderr == "to stderr\n"


def test_a_signal_or_an_uncaught_interrupt_ends_it_as_it_ends_an_interpreter() -> None:
    for code, sig, expected in (("import time; time.sleep(60)", signal.SIGTERM, -signal.SIGTERM),
                                ("raise KeyboardInterrupt", None, -signal.SIGINT)):
        procs = [start([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for start in (subprocess.Popen, warm.Popen)]
        for proc in procs:
            if sig is not None:
                proc.send_signal(sig)
            assert proc.wait(60) == expected, (code, type(proc))


def test_a_module_runs_as_main_with_its_path_first_on_argv(tmp_path: Path) -> None:
    (tmp_path / "hello.py").write_text("import sys; print(__name__, sys.argv[1:])\n")
    out = warm.run([sys.executable, "-m", "hello", "x"], capture_output=True, cwd=tmp_path)
    assert (out.returncode, out.stdout) == (0, "__main__ ['x']\n"), out.stderr
