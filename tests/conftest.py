from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Hides a GPU from the suite by default; a machine's GPU run (benchmarks/gpu_lease.sh) sets it, and then every test
# sees CUDA: a test that needs CUDA absent says so (the no_cuda fixture), none relies on this line.
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
# A database, results folder or plugin list the developer's shell names is never the tests': dropped at session start, before
# module- and session-scoped fixtures (the populated folder of test_bad_input) run, which _isolate_env comes too
# late for.
for _name in ("FLCTL_DB", "FLCTL_RESULTS", "FLCTL_TASKS"):
    os.environ.pop(_name, None)
# pytest-xdist's workers inherit COLUMNS=80 from their controller; flctl's tables then wrap at 80 columns and the
# tests that read whole rows of them fail under -n but not without it. Tests that want a width set their own.
os.environ.pop("COLUMNS", None)
# The suite runs several processes at once (xdist's workers, each test's flctl processes and sweep workers) on
# machines with few cores. torch's OpenMP pool takes a thread per core in every one of them, and waiting threads
# spin: oversubscribed, tests ran 3-20x slower under xdist. One thread each; no test's numbers depend on more.
# flctl's local sweep workers take it as their default --threads too (flctl.launch.settings.omp_threads).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# huggingface_hub reads these once, at import: set them before any test imports it.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"


def pytest_configure(config: pytest.Config) -> None:
    """A torchvision built for another torch (another version or build) breaks a hundred tests, most with one line
    that says nothing (`EOFError`, as the forkserver dies loading torchvision): stop at once with flctl's own line,
    the one `flctl` itself starts with."""
    from flctl.versions import torch_pair_problem

    if (problem := torch_pair_problem()) is not None:
        pytest.exit(f"error: {problem}", returncode=2)


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """A fresh results directory; its SQLite database is results/flctl.db."""
    root = tmp_path / "results"
    return root


@pytest.fixture(autouse=True)
def _isolate_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Tests never touch the checkout's results/ or a database named in the developer's environment.
    monkeypatch.delenv("FLCTL_DB", raising=False)
    monkeypatch.setenv("FLCTL_RESULTS", str(tmp_path / "results"))


# The modules whose tests run minutes of other processes (workers, Slurm jobs, killed and resumed runs), longest
# first: xdist hands tests out in collection order, and one of these started last is the whole suite's tail.
LONG_FIRST = ("test_readme_commands.py", "test_slurm.py", "test_sweep_launch.py", "test_process.py",
              "test_plugins.py", "test_fencing.py", "test_benchmarks.py", "test_first_contact_sweep.py",
              "test_concurrency.py", "test_results_folder.py")


def _module_fixture(item: pytest.Item) -> bool:
    """Whether the test uses a module-scoped fixture of its own module (a results folder trained once, a package
    installed once)."""
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(defs[-1].scope == "module" and Path(defs[-1].baseid or ".").name == item.path.name
                                    for defs in info.name2fixturedefs.values() if defs)


@pytest.hookimpl(tryfirst=True)    # before xdist's own, which reads the groups into the test ids on each worker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Under xdist's --dist loadgroup (pyproject's addopts) tests sharing a resource run on one worker: the Slurm
    # cluster has one node of 2 CPUs, and two tests' job arrays on it would wait on each other past their timeouts.
    # The tests of a module-scoped fixture too: each worker that runs one of them builds the fixture again (the
    # populated folders of test_results_folder and test_bad_input are flctl processes; test_plugins' is pip).
    for item in items:
        if item.path.name == "test_slurm.py":
            item.add_marker(pytest.mark.xdist_group("slurm"))
        elif _module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(f"fixture:{item.path.name}"))
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))     # stable: the rest keep their order


@pytest.fixture
def clean_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plugins loaded in this process (api.use_tasks, FLCTL_TASKS read in process) stay in this test."""
    from flctl import plugins, tasks

    monkeypatch.setattr(plugins, "_extra", [])
    monkeypatch.setattr(plugins, "_modules", {})
    monkeypatch.setattr(plugins, "_problems", {})
    monkeypatch.setattr(tasks, "_SOURCES", {})
    monkeypatch.setattr(tasks, "_PLUGIN_TASKS", {})
    monkeypatch.delenv(plugins.ENV, raising=False)


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as on a machine without CUDA, whatever the machine has, for the tests that check `--device cuda`
    is refused there (on a GPU the command trains instead). flctl asks torch (flctl.devices.resolve_device,
    flctl.launch.backends.local.cuda_devices); CUDA_VISIBLE_DEVICES cannot hide a GPU from a process that has seen it."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


# ---- a CUDA fault ends its process ----

def _cuda_fault() -> Exception | None:
    """The error a CUDA context of this process holds after its last kernels ran, or None. Touches CUDA only where
    this process initialised it (torch imported and torch.cuda.is_initialized()), so no test process starts a CUDA
    context here."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    has_context = getattr(torch._C, "_cuda_hasPrimaryContext", None)    # private: without it, the current device
    try:
        for i in range(torch.cuda.device_count()):
            if has_context(i) if has_context is not None else i == torch.cuda.current_device():
                torch.cuda.synchronize(i)
    except Exception as exc:    # torch.AcceleratorError (a RuntimeError before torch 2.8)
        return exc
    return None


_dead_context: list[str] = []     # the fault that ends this process, once seen


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    # A kernel's fault (a device-side assert, an illegal address) is sticky: every later CUDA call of the process
    # fails, torch.manual_seed's included, so on the H200 (2026-11-26) 2 captured-engine failures took 21 later tests
    # of their xdist workers with them, CPU runs among them. After each test of a process that uses CUDA (gpu-marked
    # or not: a `--device cuda` run needs no mark), wait for its kernels; a fault fails this test's teardown and ends
    # the process: an xdist worker exits once the report is sent (pytest_runtest_logreport below; xdist reports the
    # test as crashed and runs the rest in a fresh worker), a session without xdist stops after this test.
    try:
        return (yield)
    finally:
        fault = _cuda_fault()
        if fault is not None:
            said = (str(fault).strip().splitlines() or [""])[0]
            _dead_context.append(f"CUDA error after {item.nodeid}: {type(fault).__name__}: {said}")
            if not os.environ.get("PYTEST_XDIST_WORKER"):
                item.session.shouldstop = f"{_dead_context[0]} (later tests would fail on its dead CUDA context)"
            pytest.fail(f"{_dead_context[0]}; this process's CUDA context is dead, so it ends here", pytrace=False)


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # trylast: after xdist's own hook has sent the teardown report to the controller (a synchronous write)
    if _dead_context and report.when == "teardown" and os.environ.get("PYTEST_XDIST_WORKER"):
        sys.stderr.flush()
        os._exit(1)


# ---- tests marked notorch run where torch is not installed (.ci/run: Python 3.12 and 3.13) ----

class _TorchImportWitness:
    """Notes where torch was imported in this process: the innermost frame of the repository's code that asked for
    it (a test, a fixture or a flctl module), for the notorch check's message. The import itself goes on. Each
    lookup before torch is in sys.modules overwrites the last: a lookup that imported nothing
    (importlib.util.find_spec) is not the import."""

    where: str | None = None

    def find_spec(self, name: str, path=None, target=None) -> None:
        if name == "torch" and "torch" not in sys.modules:
            ours = [f"{rel}:{f.lineno}" for f in traceback.extract_stack()[:-1]
                    if (rel := _in_repository(f.filename)) and rel != "tests/conftest.py"]
            self.where = ours[-1] if ours else "?"
        return None


def _in_repository(filename: str) -> str | None:
    """``filename`` relative to the checkout, None outside it or in a venv inside it (.venv, .venv-3.12)."""
    path = Path(filename)
    if not path.is_relative_to(ROOT) or path.relative_to(ROOT).parts[0].startswith("."):
        return None
    return path.relative_to(ROOT).as_posix()


_WITNESS = _TorchImportWitness()
sys.meta_path.insert(0, _WITNESS)    # type: ignore[arg-type]
_TORCH_BEFORE = pytest.StashKey[bool]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_TORCH_BEFORE] = "torch" in sys.modules


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    # A notorch test that imports torch, itself or through a fixture or a flctl module, fails here in a process that
    # had not imported it (`pytest -m notorch FILES`, as .ci/run runs them) rather than only in CI's venvs without
    # torch. Where an earlier test imported torch, this cannot tell.
    result = yield
    if item.get_closest_marker("notorch") and not item.stash.get(_TORCH_BEFORE, True) and "torch" in sys.modules:
        pytest.fail(f"{item.nodeid} is marked notorch but imported torch (from {_WITNESS.where}); "
                    "CI runs it where torch is not installed", pytrace=False)
    return result


@pytest.fixture
def float64(monkeypatch: pytest.MonkeyPatch):
    """Tasks whose models, data and state are float64 (the same computations, rounding at 1e-16), and whose cells
    group as on CUDA (``batched``)."""
    import dataclasses

    import torch

    import flctl.train
    from flctl.tasks import get_task

    def in_float64(task):
        def load(*args):
            data = task.load(*args)
            for split in (data.train, data.test):
                if split.x.is_floating_point():
                    split.x = split.x.double()
                if split.y.is_floating_point():
                    split.y = split.y.double()
            return data
        return dataclasses.replace(task, batched=True, load=load, extras=None,    # (two-moons' grid is float32)
                                   build_model=lambda *a: task.build_model(*a).double())

    monkeypatch.setattr(flctl.train, "get_task", lambda name: in_float64(get_task(name)))
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(default)
