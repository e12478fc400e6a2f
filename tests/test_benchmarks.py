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
        "plain_two_moons.py": [],
    }


def test_every_benchmark_script_has_a_smoke_run() -> None:
    # bench_gpu.py runs through the script a GPU lease runs (the last test)
    assert set(smoke(Path("."))) | {"bench_gpu.py"} == {p.name for p in (ROOT / "benchmarks").glob("*.py")}


@pytest.mark.parametrize("script", sorted(smoke(Path("."))))
def test_the_benchmark_runs(script: str, tmp_path: Path) -> None:
    if script == "bench_fashion_mnist.py":
        real_fashion_mnist()                     # trains on the real images
    before = sorted((ROOT / "benchmarks" / "results").iterdir())
    res = warm.run([sys.executable, str(ROOT / "benchmarks" / script), *smoke(tmp_path)[script]], cwd=tmp_path,
                   capture_output=True, timeout=240, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    assert sorted((ROOT / "benchmarks" / "results").iterdir()) == before    # a smoke run writes no results


def test_the_gpu_lease_script_packs_what_it_measured_and_names_what_it_had_no_time_for(tmp_path: Path) -> None:
    """benchmarks/gpu_lease.sh is what a 15-minute GPU lease runs, once, through bench_gpu.py: a section it starts
    comes back in the tarball, and one that the budget leaves no time for is written as not measured rather than
    lost or overrun."""
    import json
    import subprocess
    import tarfile

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable, "OUT": str(tmp_path / "out"),
           "SECTIONS": "cifar:120 share:5", "LEASE_S": "300", "RESULTS": str(tmp_path / "gpu-bench"),
           "BENCH_ARGS": f"--small --work {tmp_path / 'w'} --engines eager --precisions fp32 --epochs 2"}
    res = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_lease.sh")], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=240)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    with tarfile.open(tmp_path / "out" / "gpu-bench.tar.gz") as tar:
        got = {Path(m.name).name: m for m in tar.getmembers()}
        section = {name: json.load(tar.extractfile(got[f"{name}.json"])) for name in ("cifar", "share")}
    assert section["cifar"]["ok"] and set(section["cifar"]["runs"]) == {"eager/fp32/erm", "eager/fp32/fl"}
    assert section["share"] == {"env": section["share"]["env"], "ok": False, "not_measured": True}
    assert {"bench.log", "machine.txt"} <= set(got)
