"""What a step costs the host, held where a CPU can count it (benchmarks/bench_step_cost.py measures and records the
numbers): dispatched ops and host-device syncs do not depend on the device, so a CUDA step's launches and waits are
counted here, on a step built as on CUDA (fused optimizers, cells of a groupable model grouped)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.data_writers import write_cifar10

# Slow (pyproject.toml's markers; `pytest -m "not slow"` is the fast loop): CIFAR-10 steps counted, one cell and
# grouped cells: 5 s of the suite's 904 s of test time (2 cores, xdist -n 2).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_step_cost", ROOT / "benchmarks" / "bench_step_cost.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("task", ["cifar10", "two-moons"])
def test_fl_costs_little_more_than_erm_grouped_cells_share_launches_and_no_step_waits(bench, task: str,
                                                                                     tmp_path: Path) -> None:
    data = str(write_cifar10(tmp_path / "data", per_batch=4)) if task == "cifar10" else None
    ops, syncs = {}, {}
    configs = {**bench.CONFIGS, **(bench.MANY if task == "two-moons" else {})}     # a sweep's 64 small cells too
    for name, (method, k) in configs.items():
        stepper = bench.build(task, method, k, tmp_path / name, data)
        bench.step(stepper)                      # optimizer moments exist from here on
        count = bench.Count(bench.host_scalars(stepper))
        bench.step(stepper, count)
        ops[name], syncs[name] = count.total, bench.epoch_syncs(stepper)
        if k > 1:
            assert {r["engine"] for r in map(stepper.trained_with, stepper.cells)} == {"grouped"}
    assert syncs == {name: 0 for name in configs}, "a step or an epoch's set-up waits for the device"
    assert ops["fl"] <= 1.15 * ops["erm"], ops
    # K grouped: one launch per op of the shared model (CIFAR-10 K = 4: 1.26x; interleaved, 4x), one dual step and
    # objective for the cells of one method (flctl.grouped.methods), one optimizer step for all
    # (flctl.grouped.optim; it was 2-4 ops a cell). Two-moons, a 3-layer MLP of 69 ops alone, keeps each cell's samples
    # apart, [K, F, B], from input to output: 1.22x at K = 4 and at K = 64 alike (2.34x at K = 4 with the cells'
    # features side by side and their methods and optimizers one by one).
    for many in [name for name in configs if name.endswith(("_k4", "_k64"))]:
        assert ops[many] <= 1.5 * ops[many.partition("_")[0]], ops
    if task == "two-moons":
        assert ops["fl_k64"] == ops["fl_k4"] and ops["erm_k64"] == ops["erm_k4"], ops      # the ops do not grow with K
