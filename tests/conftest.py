from __future__ import annotations

import os
from pathlib import Path

import pytest

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
