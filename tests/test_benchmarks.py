"""Every benchmark script still runs against today's flctl, at sizes that measure nothing: a refactor that moves
what a benchmark calls (a store method's signature, a step function's home) fails here, not on the next GPU lease.
The numbers come from the scripts run at full size (benchmarks/README.md); nothing here is timed. Each script runs
as its own process, forked warm (tests/warm.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests import warm
from tests.fixtures import real_fashion_mnist

ROOT = Path(__file__).resolve().parents[1]


def smoke(tmp: Path) -> dict[str, list[str]]:
    return {
        "bench_fashion_mnist.py": ["--smoke", "--work", str(tmp / "fm"), "--out", str(tmp / "fm-out")],
        "bench_methods.py": ["--rounds", "2", "--warmup-rounds", "1", "--models", "two-moons"],
        "bench_paper.py": ["--runs", "10", "--samples", "100", "--repeat", "1", "--dir", str(tmp / "paper"),
                           "--out", str(tmp / "paper-out")],
        "bench_reports.py": ["--runs", "8", "--samples", "200", "--repeat", "1", "--dir", str(tmp / "reports")],
        "bench_sweep.py": ["loop", "--repeats", "1"],
        "bench_vision.py": ["--images", "128", "--steps", "1", "--rounds", "1"],
        "bench_stacking.py": ["--tasks", "two-moons", "--rounds", "1", "--k", "2", "--out", str(tmp)],
        "bench_open_directions.py": ["nupi", "--seeds", "1", "--kp", "1", "--epochs", "20"],
        "bench_gpu.py": ["precision", "cifar", "--small", "--device", "cpu", "--engines", "eager",
                         "--precisions", "fp32", "--epochs", "2", "--out", str(tmp / "gpu"), "--work", str(tmp / "w")],
        "plain_two_moons.py": [],
    }


def test_every_benchmark_script_has_a_smoke_run() -> None:
    assert set(smoke(Path("."))) == {p.name for p in (ROOT / "benchmarks").glob("*.py")}


@pytest.mark.parametrize("script", sorted(smoke(Path("."))))
def test_the_benchmark_runs(script: str, tmp_path: Path) -> None:
    if script == "bench_fashion_mnist.py":
        real_fashion_mnist()                     # trains on the real images
    before = sorted((ROOT / "benchmarks" / "results").iterdir())
    res = warm.run([sys.executable, str(ROOT / "benchmarks" / script), *smoke(tmp_path)[script]], cwd=tmp_path,
                   capture_output=True, timeout=240, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    assert sorted((ROOT / "benchmarks" / "results").iterdir()) == before    # a smoke run writes no results
