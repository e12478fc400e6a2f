"""What tests/conftest.py does for the suite's own soundness, checked on a CPU: a test whose CUDA context faults
ends its process (the tests after it run in a fresh one), and a test marked notorch that imports torch fails. Each
case is a small pytest of its own, in a folder with a copy of the conftest and a stand-in `torch` package, so no GPU
and no torch is needed (these tests are notorch themselves)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.notorch

CONFTEST = Path(__file__).with_name("conftest.py")

# A stand-in for torch's CUDA state: nothing initialised until a test calls fault(), which initialises CUDA and
# leaves the sticky error of a device-side assert; touching the device before that fails the test that does.
FAKE_TORCH = '''
import types

_state = {"initialized": False, "poisoned": False}


def _touch():
    assert _state["initialized"], "the conftest touched CUDA in a process that never used it"


def _synchronize(device=None):
    _touch()
    if _state["poisoned"]:
        raise RuntimeError("CUDA error: device-side assert triggered\\nmore lines")


def _fault():
    _state["initialized"] = _state["poisoned"] = True


cuda = types.SimpleNamespace(is_initialized=lambda: _state["initialized"], synchronize=_synchronize,
                             device_count=lambda: _touch() or 1, current_device=lambda: _touch() or 0, fault=_fault)
_C = types.SimpleNamespace()
'''


def suite(tmp_path: Path, tests: str) -> Path:
    folder = tmp_path / "suite"
    (folder / "torch").mkdir(parents=True)
    (folder / "torch" / "__init__.py").write_text(FAKE_TORCH)
    shutil.copy(CONFTEST, folder / "conftest.py")
    (folder / "pytest.ini").write_text("[pytest]\nmarkers =\n    notorch: no torch\n")
    (folder / "test_fake.py").write_text(tests)
    return folder


def pytest_in(folder: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CUDA_VISIBLE"))}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args], cwd=folder,
                          capture_output=True, text=True, timeout=120, env={**env, "PYTHONPATH": str(folder)})


FAULTING = '''
import torch


def test_cpu_only():
    pass


def test_faults():
    torch.cuda.fault()          # passes: the fault shows only when the device is waited for


def test_after():
    assert not torch.cuda.is_initialized(), "ran in the process whose CUDA context faulted"
'''


def test_a_cuda_fault_ends_its_xdist_worker_and_the_next_test_runs_in_a_fresh_one(tmp_path: Path) -> None:
    out = pytest_in(suite(tmp_path, FAULTING), "-n", "1", "-rA")
    said = out.stdout + out.stderr
    assert out.returncode == 1, said
    assert "ERROR at teardown of test_faults" in said, said
    assert ("CUDA error after test_fake.py::test_faults: RuntimeError: CUDA error: device-side assert triggered; "
            "this process's CUDA context is dead") in said, said
    assert "crashed while running 'test_fake.py::test_faults'" in said and "PASSED test_fake.py::test_after" in said
    assert "never used it" not in said, said


def test_without_xdist_a_cuda_fault_stops_the_session_after_its_test(tmp_path: Path) -> None:
    out = pytest_in(suite(tmp_path, FAULTING), "-p", "no:xdist", "-rA")
    said = out.stdout + out.stderr
    assert out.returncode == 2, said            # interrupted
    assert "ERROR at teardown of test_faults" in said and "CUDA error after test_fake.py::test_faults" in said, said
    assert "later tests would fail on its dead CUDA context" in said and "2 passed, 1 error" in said, said
    assert "test_after" not in said and "never used it" not in said, said


def test_a_notorch_test_that_imports_torch_fails_and_names_the_import(tmp_path: Path) -> None:
    folder = suite(tmp_path, '''
import pytest

pytestmark = pytest.mark.notorch


def test_plain():
    import json  # noqa: F401


def test_through_a_helper():
    import helper  # noqa: F401
''')
    (folder / "helper.py").write_text("import json\nimport torch  # noqa: F401\n")
    out = pytest_in(folder, "-p", "no:xdist", "-m", "notorch")
    said = out.stdout + out.stderr
    assert out.returncode == 1, said
    assert "1 failed, 1 passed" in said
    assert "test_fake.py::test_through_a_helper is marked notorch but imported torch (from suite/helper.py:2)" \
        in said, said
