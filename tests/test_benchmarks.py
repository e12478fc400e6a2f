"""Every benchmark script still runs against today's flctl, at sizes that measure nothing: a refactor that moves
what a benchmark calls (a store method's signature, a step function's home) fails here, not on the next GPU lease.
The numbers come from the scripts run at full size (benchmarks/README.md); nothing here is timed. Each script runs
as its own process, forked warm (tests/warm.py). The parts of bench_gpu.py that a GPU lease relies on to bring back
what a diagnosis needs (failed cells' errors, the commit, the diagnose section, collect) are tested on their own,
on the CPU, at the end."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests import warm
from tests.data_writers import real_fashion_mnist

# Slow (pyproject.toml's markers; `pytest -m "not slow"` is the fast loop): every benchmark script run at a small
# size: 54 s of the suite's 904 s of test time (2 cores, xdist -n 2).
pytestmark = pytest.mark.slow

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
        "bench_together.py": ["--tasks", "two-moons", "--rounds", "1", "--k", "2", "--out", str(tmp)],
        "bench_step_cost.py": ["--rounds", "1", "--steps", "1", "--out", str(tmp)],
        "bench_open_directions.py": ["nupi", "--seeds", "1", "--kp", "1", "--epochs", "20"],
        "plain_two_moons.py": [],
        "bench_threads.py": ["--repeats", "1", "--epochs", "2", "--loads", "quiet", "--out", str(tmp)],
        "bench_task_costs.py": ["--tasks", "two-moons", "--out", str(tmp)],
        "bench_estimates.py": ["--steps", "1", "--executor", "debug", "--out", str(tmp)],
        "bench_loggers.py": ["--repeats", "1", "--epochs", "2", "--out", str(tmp)],
        "bench_overhead.py": ["start", "--repeats", "1", "--out", str(tmp)],   # cells: minutes even at its least
        "bench_mirror.py": ["--cells", "40", "--new", "4", "--repeats", "1", "--out", str(tmp)],
        "bench_reads.py": ["--cells", "1000", "--repeats", "1", "--out", str(tmp)],
        "bench_pace.py": ["--sizes", "40", "80", "--seconds", "1", "--warmup", "1", "--out", str(tmp)],
    }


def test_every_benchmark_script_has_a_smoke_run() -> None:
    # bench_gpu.py runs through the script a GPU lease runs (the last test); bench_scale.py in its own test, which
    # reads what it found
    assert set(smoke(Path("."))) | {"bench_gpu.py", "bench_scale.py"} == \
        {p.name for p in (ROOT / "benchmarks").glob("*.py")}


@pytest.mark.parametrize("script", sorted(smoke(Path("."))))
def test_the_benchmark_runs(script: str, tmp_path: Path) -> None:
    if script == "bench_fashion_mnist.py":
        real_fashion_mnist()                     # trains on the real images
    before = sorted((ROOT / "benchmarks" / "results").iterdir())
    res = warm.run([sys.executable, str(ROOT / "benchmarks" / script), *smoke(tmp_path)[script]], cwd=tmp_path,
                   capture_output=True, timeout=240, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    assert sorted((ROOT / "benchmarks" / "results").iterdir()) == before    # a smoke run writes no results


@pytest.mark.parametrize("backend", ["sqlite", "postgresql", "pgbouncer"])
def test_the_scale_simulation_claims_no_cell_twice_and_loses_none(backend: str, tmp_path: Path) -> None:
    """benchmarks/bench_scale.py at its smoke size (300 cells, 6 simulated workers in 3 processes, one killed -9
    half-way): the harness runs against today's claim, and finds no cell claimed twice and none lost, the killed
    worker's cells taken back by the others (the script exits 1 where it finds either)."""
    env = {"postgresql": "FLCTL_TEST_PG", "pgbouncer": "FLCTL_TEST_PGBOUNCER"}.get(backend)
    if env and not os.environ.get(env):
        if os.environ.get("CI"):
            pytest.fail(f"CI must provide {env} (.ci/postgres.sh, .ci/pgbouncer.sh)")
        pytest.skip(f"no {env}")
    res = warm.run([sys.executable, str(ROOT / "benchmarks" / "bench_scale.py"), "--quick", "--backend", backend,
                    "--out", str(tmp_path)], cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    [run] = json.loads(next(tmp_path.glob("scale-*-cpu.json")).read_text())["runs"]
    assert run["backend"] == backend and run["drained"] and run["errors"] == 0
    assert run["claimed_twice"] == 0 and run["lost"] == 0
    assert run["killed_processes"] == 1 and run["taken_back"] == run["killed_cells"]
    assert run["claims_per_s"] > 0 and run["claim_p99_ms"] >= run["claim_p50_ms"] > 0
    if backend != "sqlite":     # each worker's one connection, and the launcher's
        assert run["max_connections"] <= 6 + 1 and run["server_cpu_s"] > 0


def test_the_gpu_lease_script_packs_what_it_measured_and_names_what_it_had_no_time_for(tmp_path: Path) -> None:
    """benchmarks/gpu_lease.sh is what a 15-minute GPU lease runs, once, through bench_gpu.py: a section that the
    budget leaves no time for comes back in the tarball written as not measured rather than lost or overrun (the
    sections it measures come back too: test_the_lease_plan_runs_every_section_on_a_cpu_and_collect_reads_it)."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable, "OUT": str(tmp_path / "out"),
           "SECTIONS": "share:5", "LEASE_S": "300", "RESULTS": str(tmp_path / "gpu-bench"),
           "FLCTL_COMMIT": "0000000-dirty",                 # read only where the checkout has no .git
           "BENCH_ARGS": f"--small --work {tmp_path / 'w'} --engines eager --precisions fp32 --epochs 2"}
    res = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_lease.sh")], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=240)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    with tarfile.open(tmp_path / "out" / "gpu-bench.tar.gz") as tar:
        got = {Path(m.name).name: m for m in tar.getmembers()}
        section = {name: json.load(tar.extractfile(got[f"{name}.json"])) for name in ("share",)}
    assert section["share"] == {"env": section["share"]["env"], "ok": False, "not_measured": True}
    assert {"bench.log", "machine.txt"} <= set(got)
    # the commit is the project's, in machine.txt and in the sections' files: its git tree's where this checkout
    # has one, FLCTL_COMMIT's in a copy without .git (the device's; the H100's suite failed here when it assumed git)
    with tarfile.open(tmp_path / "out" / "gpu-bench.tar.gz") as tar:
        machine = tar.extractfile(got["machine.txt"]).read().decode()
    commit = json.loads(next(line for line in machine.splitlines() if line.startswith("{")))
    if (ROOT / ".git").exists():
        assert commit["commit_from"] == "git" and isinstance(commit["dirty"], bool)
        assert subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit['commit']}^{{commit}}"]).returncode == 0
    else:
        assert commit == {"commit": "0000000", "dirty": True, "commit_from": "FLCTL_COMMIT"}
    assert {k: section["share"]["env"][k] for k in commit} == commit
    assert "BENCH_ARGS=--small" in machine.replace("\\", "")


@pytest.mark.slow    # the lease's whole plan, small, on a CPU: ~90 s
def test_the_lease_plan_runs_every_section_on_a_cpu_and_collect_reads_it(tmp_path: Path) -> None:
    """gpu_lease.sh's own plan (its SECTIONS and LEASE_S as a lease runs them), each section at --small's sizes: every
    section comes back measured, and collect turns the call into the figures the GPU issue asks for (the suite's
    counts, the ways cells train together, the 1,000-cell grid's seconds, the programme's hours)."""
    env = {k: v for k, v in os.environ.items() if k not in ("SECTIONS", "LEASE_S")}
    env.update({"CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable, "OUT": str(tmp_path / "out"),
                "RESULTS": str(tmp_path / "call"), "FLCTL_COMMIT": "0000000",
                "BENCH_ARGS": f"--small --work {tmp_path / 'w'} --engines eager --epochs 3"})  # 1 warm-up, 1 timed, 1 eval
    res = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_lease.sh")], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    with tarfile.open(tmp_path / "out" / "gpu-bench.tar.gz") as tar:
        tar.extractall(tmp_path / "back", filter="data")
    call = tmp_path / "back" / "call"
    log = (call / "bench.log").read_text()
    planned = ["suite", "cifar", "share", "moons", "utkface"]
    assert re.findall(r"^== (\w+): \d+ s of \d+ s left$", log, re.M) == planned, log
    for name in planned:
        section = json.loads((call / f"{name}.json").read_text())
        assert section["ok"] is True and not section.get("not_measured"), (name, section)
    cifar = json.loads((call / "cifar.json").read_text())["runs"]
    assert {"erm", "fl"} <= {key.split("/")[-1] for key in cifar if key.startswith("eager/")}, cifar
    results = tmp_path / "results"
    collected = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_gpu.py"), "collect", str(call),
                                "--results", str(results)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert collected.returncode == 0, collected.stderr
    [summary] = results.glob("gpu-*.json")
    got = json.loads(summary.read_text())
    assert got["suite"]["passed"] > 0 and got["suite"]["failed"] == 0
    assert got["together"]["grouped"]["1"] and got["together"]["grouped"]["2"] and got["together"]["processes"]["2"]
    assert got["two_moons_1000_cells_s"] is not None and got["two_moons_fastest_way"] in ("one_process", "per_gpu_4")
    assert got["utkface_s_per_epoch"]["erm"] and got["not_measured"] == []


# ------------------------------------------------------------------------------------------------ bench_gpu's parts

def test_bench_gpu_resolves_a_config_with_the_device_it_runs_on() -> None:
    """The captured engine is refused off CUDA: a config resolved as cpu and moved to cuda afterwards was refused
    on the GPU itself (the H200 lease measured no captured configuration)."""
    from benchmarks import bench_gpu

    cfg = bench_gpu.config("cifar10", "fl", "cuda", engine="captured")     # resolve does not ask whether CUDA is here
    assert (cfg.device, cfg.engine) == ("cuda", "captured")


def test_a_sweeps_failed_cells_come_back_counted_by_error(tmp_path: Path) -> None:
    """The failed cells' errors, read through flctl's store from the database a sweep leaves on the lent machine:
    one entry per error (the traceback's exception line, with numbers and ids made alike), most frequent first."""
    import torch

    from benchmarks import bench_gpu
    from flctl.db import Store
    from flctl.db.queue import RunQueue
    from flctl.db.urls import file_url
    from flctl.layout import Layout

    def raised(fn, *a) -> str:
        try:
            fn(*a)
        except Exception:
            return traceback.format_exc(limit=8)
        raise AssertionError("did not raise")

    def cuda_assert() -> None:      # torch's text: the error, then advice lines that every CUDA error repeats
        raise RuntimeError("CUDA error: device-side assert triggered\nCUDA kernel errors might be asynchronously "
                           "reported at some other API call\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1")

    def out_of_bounds(i: int) -> None:
        torch.zeros(2)[torch.tensor([i])]

    def chained() -> None:          # the exception raised last names the error
        try:
            out_of_bounds(7)
        except IndexError as exc:
            raise RuntimeError("CUDA error: device-side assert triggered") from exc

    errors = [raised(cuda_assert), raised(out_of_bounds, 5), raised(chained), raised(out_of_bounds, 9),
              raised(cuda_assert), "worker lost (heartbeat stale); gave up after 3 attempts"]
    cfgs = [bench_gpu.config("two-moons", "fl", "cpu", seed=s) for s in range(len(errors) + 2)]
    store = Store.open(file_url(Layout(tmp_path).db))
    try:
        store.add_runs(cfgs)              # the last two stay queued: not failed, not counted
        queue = RunQueue(store)
        for cfg, error in zip(cfgs, errors):
            queue.fail_run(cfg.run_id, queue.claim_run(cfg.run_id), error, 0.5)
    finally:
        store.close()
    got = bench_gpu.sweep_errors(tmp_path)
    assert [(e["message"], e["count"]) for e in got] == [
        ("RuntimeError: CUDA error: device-side assert triggered", 3),
        ("IndexError: index N is out of bounds for dimension N with size N", 2),
        ("worker lost (heartbeat stale); gave up after N attempts", 1)]
    # the example is one of the runs that failed so (runs written in one moment are listed in no set order)
    error_of = {cfg.run_id: error for cfg, error in zip(cfgs, errors)}
    assert got[0]["example_run_id"] in {cfgs[0].run_id, cfgs[4].run_id}
    assert got[0]["example_error"] == error_of[got[0]["example_run_id"]]
    assert got[1]["example_run_id"] in {cfgs[1].run_id, cfgs[3].run_id}
    assert bench_gpu.sweep_errors(tmp_path / "none") == []          # a sweep that never started: no database


def test_the_commit_is_the_projects_own_and_says_whether_the_tree_differs(tmp_path: Path, monkeypatch) -> None:
    """A copy of the project without .git (what the device tool sends) inside another repository records
    FLCTL_COMMIT, not the enclosing repository's commit; the project's own repository records its HEAD and
    whether tracked files differ from it, whatever FLCTL_COMMIT says."""
    from benchmarks import bench_gpu

    def git(where: Path, *cmd: str) -> str:
        return subprocess.run(["git", "-C", str(where), "-c", "user.name=t", "-c", "user.email=t@example.com", *cmd],
                              capture_output=True, text=True, check=True).stdout.strip()

    outer, project = tmp_path / "outer", tmp_path / "outer" / "project"
    project.mkdir(parents=True)
    git(outer, "init", "-q")
    git(outer, "commit", "-q", "--allow-empty", "-m", "outer")
    monkeypatch.setenv("FLCTL_COMMIT", "3623c99")
    assert bench_gpu.project_commit(project) == {"commit": "3623c99", "dirty": None, "commit_from": "FLCTL_COMMIT"}
    monkeypatch.setenv("FLCTL_COMMIT", "3623c99-dirty")          # git describe --always --dirty's form
    assert bench_gpu.project_commit(project)["dirty"] is True
    monkeypatch.delenv("FLCTL_COMMIT")
    assert bench_gpu.project_commit(project) == {"commit": None, "dirty": None, "commit_from": None}

    monkeypatch.setenv("FLCTL_COMMIT", "3623c99")
    (project / "a.py").write_text("x = 1\n")
    git(project, "init", "-q")
    git(project, "add", "a.py")
    git(project, "commit", "-q", "-m", "project")
    head = git(project, "rev-parse", "--short", "HEAD")
    (project / "new.py").write_text("")                            # untracked: the commit's files are unchanged
    assert bench_gpu.project_commit(project) == {"commit": head, "dirty": False, "commit_from": "git"}
    (project / "a.py").write_text("x = 2\n")
    assert bench_gpu.project_commit(project) == {"commit": head, "dirty": True, "commit_from": "git"}


def write_junit(path: Path, cases: list[tuple[str, str, str | None]]) -> Path:
    """A junit.xml as pytest writes it: (classname, name, failure message or None for a pass), in that order."""
    root = ET.Element("testsuites")
    suite = ET.SubElement(root, "testsuite", name="pytest")
    for classname, name, failure in cases:
        case = ET.SubElement(suite, "testcase", classname=classname, name=name, time="0.1")
        if failure is not None:
            ET.SubElement(case, "failure", message=failure).text = f"E   {failure}"
    ET.ElementTree(root).write(path)
    return path


PLANTED_TESTS = '''import os

import pytest

CHECKS = ("CUDA_LAUNCH_BLOCKING", "TORCH_CUDA_SANITIZER")


def test_on_the_cpu():
    assert False


@pytest.mark.gpu
def test_marked():
    assert False


class TestCase:
    @pytest.mark.gpu
    @pytest.mark.parametrize("k", [1, 2])
    def test_param(self, k):
        print("checks:", {c: os.environ.get(c) for c in CHECKS})
        assert k == 1
'''


def test_diagnose_reruns_the_first_failing_gpu_test_alone_under_each_check(tmp_path: Path, monkeypatch) -> None:
    """The first test marked gpu that failed, in junit.xml's order (a CPU test's failure before it is passed over),
    is run again alone, once with CUDA_LAUNCH_BLOCKING=1 and once with TORCH_CUDA_SANITIZER=1, each with its own
    log; with no gpu test failed (or no junit.xml), the section says so and runs nothing."""
    from benchmarks import bench_gpu

    project, out = tmp_path / "project", tmp_path / "out"
    (project / "tests").mkdir(parents=True)
    out.mkdir()
    (project / "tests" / "test_planted.py").write_text(PLANTED_TESTS)
    monkeypatch.setattr(bench_gpu, "ROOT", project)
    args = argparse.Namespace(out=out, timeout=60.0, deadline=None, min_left_s=30.0, partial=lambda out: None)
    assert bench_gpu.diagnose(args) == {"test": None, "why": "no junit.xml: the suite section did not run"}
    write_junit(out / "junit.xml", [("tests.test_planted", "test_on_the_cpu", "AssertionError: assert False"),
                                    ("tests.test_planted.TestCase", "test_param[1]", None),
                                    ("tests.test_planted", "test_gone", "AssertionError"),   # not in the tree now
                                    ("tests.test_removed", "test_marked", "AssertionError"),
                                    ("tests.test_planted", "test_on_the_cpu", "AssertionError: assert False")])
    assert bench_gpu.diagnose(args) == {"test": None, "why": "no test marked gpu failed in the suite"}
    assert not list(out.glob("diagnose-*"))

    write_junit(out / "junit.xml", [("tests.test_planted", "test_on_the_cpu", "AssertionError: assert False"),
                                    ("tests.test_planted.TestCase", "test_param[1]", None),
                                    ("tests.test_planted.TestCase", "test_param[2]", "AssertionError: assert 2 == 1"),
                                    ("tests.test_planted", "test_marked", "AssertionError: assert False")])
    got = bench_gpu.diagnose(args)
    assert got["test"] == "tests/test_planted.py::TestCase::test_param[2]"
    assert {name: (run["rc"], run["log"], run["env"]) for name, run in got["runs"].items()} == {
        "launch-blocking": (1, "diagnose-launch-blocking.log", {"CUDA_LAUNCH_BLOCKING": "1"}),
        "sanitizer": (1, "diagnose-sanitizer.log", {"TORCH_CUDA_SANITIZER": "1"})}
    blocking, sanitizer = ((out / f"diagnose-{n}.log").read_text() for n in ("launch-blocking", "sanitizer"))
    assert "'CUDA_LAUNCH_BLOCKING': '1', 'TORCH_CUDA_SANITIZER': None" in blocking and "1 failed" in blocking
    assert "'CUDA_LAUNCH_BLOCKING': None, 'TORCH_CUDA_SANITIZER': '1'" in sanitizer and "1 failed" in sanitizer
    assert "test_marked" not in blocking + sanitizer                # alone


def test_collect_merges_the_calls_of_a_lease_and_says_what_failed(tmp_path: Path) -> None:
    """collect on the raw-output layout of three calls of gpu_lease.sh: the commit given beside the one the files
    recorded, the suite's failures counted by message, a section whose process died (a signal in bench.log)
    charged to the engine it ran (from the call's arguments, or the file's running marker), a sweep with failed
    cells priced at nothing and its errors kept, a measured section over one not measured, and every raw file
    copied beside the summary."""
    from benchmarks import bench_gpu

    env = {"device": "NVIDIA H200", "torch": "2.11.0+cu130", "cuda": "13.0", "cudnn": 91900, "commit": "d7c5cf3",
           "small": False}
    cuda_assert = "torch.AcceleratorError: CUDA error: device-side assert triggered\nSearch for `cudaErrorAssert'"
    moons_errors = [{"message": "RuntimeError: index N is out of bounds", "count": 7, "example_run_id": "ab12cd34",
                     "example_error": "Traceback ..."}]
    calls = {
        "first-call": {
            "suite.json": {"env": env, "ok": True, "passed": 1, "failed": 2, "skipped": 0, "errors": 0, "rc": 1,
                           "failures": ["tests.test_gpu_engine::test_a", "tests.test_tasks::test_b"],
                           "command": "python -m pytest -q"},
            "cifar.json": {"env": env, "ok": True, "not_measured": ["compiled/auto/fl"], "runs": {
                "eager/auto/erm": {"epoch_s": 4.0, "minutes_200_epochs": 13.5},
                "eager/auto/fl": {"epoch_s": 4.4, "minutes_200_epochs": 14.8},
                "captured/auto/erm": {"error": "ConfigError: --engine captured replays CUDA graphs"}}},
            "moons.json": {"env": env, "ok": True,
                           "stacked": {"cells": 9, "ledger": {"completed": 2, "failed": 7}, "seconds": 5.0,
                                       "cells_per_s": 0.4, "errors": moons_errors},
                           "one_per_worker": {"cells": 3, "not_measured": True, "ledger": {}, "seconds": None}},
            "utkface.json": {"env": env, "ok": False, "not_measured": True},
            "bench.log": "== suite: 150 s of 483 s left\n== suite done in 144 s (ok=True)\nrc=0 after 167 s\n"
                         "== cifar: 170 s of 333 s left\nrc=0 after 325 s\n== moons: 100 s of 175 s left\n"
                         "rc=0 after 416 s\n== utkface: 8 s of 8 s left\n== utkface not measured: 8 s of the budget "
                         "left\nrc=0 after 496 s\n",
            "machine.txt": "GPU 0: NVIDIA H200\n2.11.0+cu130 True\nsetup took 17 s\n",
            "pytest.log": "FAILED tests/test_gpu_engine.py::test_a\n"},
        "second-call": {                  # a lease from before machine.txt named its arguments: --bench-args does
            "utkface.json": {"env": env, "ok": True, "methods": {"erm": {"epoch_s": 0.39}, "rfl": {"epoch_s": 0.41}}},
            "bench.log": "== cifar: 110 s of 243 s left\nrc=139 after 25 s\n== utkface: 50 s of 206 s left\n"
                         "rc=0 after 79 s\n",
            "machine.txt": "GPU 0: NVIDIA H200\nsetup took 7 s\n"},
        "third-call": {                   # today's lease: its arguments in machine.txt, the running marker
            "profile.json": {"env": env, "ok": False, "partial": True, "running": "compiled"},
            "bench.log": "== profile: 60 s of 100 s left\nrc=134 after 30 s\n",
            "machine.txt": "LEASE_S=100\nSECTIONS=profile:60\nBENCH_ARGS=--engines\\ eager,compiled\n"}}
    lease = tmp_path / "lease"
    for call, files in calls.items():
        (lease / call).mkdir(parents=True)
        for name, content in files.items():
            (lease / call / name).write_text(content if isinstance(content, str) else json.dumps(content))
    write_junit(lease / "first-call" / "junit.xml", [("tests.test_gpu_engine", "test_a", cuda_assert),
                                                     ("tests.test_tasks", "test_b", cuda_assert),
                                                     ("tests.test_tasks", "test_c", None)])
    results = tmp_path / "results"
    bench_gpu.main(["collect", *(str(lease / c) for c in calls), "--commit", "3623c99", "--date", "2026-11-26",
                    "--bench-args", "second-call=--engines captured --precisions auto", "--results", str(results)])

    got = json.loads((results / "gpu-2026-11-26-h200.json").read_text())
    assert {k: got[k] for k in ("device", "commit", "dirty", "commit_from", "commit_in_raw_files", "date")} == {
        "device": "NVIDIA H200", "commit": "3623c99", "dirty": None, "commit_from": "collect --commit",
        "commit_in_raw_files": ["d7c5cf3"], "date": "2026-11-26"}
    assert got["suite"]["failed"] == 2 and [(e["message"], e["count"], e["example_test"])
                                            for e in got["suite"]["failures_by_message"]] == [
        ("torch.AcceleratorError: CUDA error: device-side assert triggered", 2, "tests.test_gpu_engine::test_a")]
    cifar = got["cifar10"]
    assert cifar["captured"]["crashed"] == ["second-call/cifar: SIGSEGV (exit 139)"]
    assert cifar["captured"]["errors"] == {"auto/erm": "ConfigError: --engine captured replays CUDA graphs"}
    assert cifar["compiled"]["crashed"] == ["third-call/profile: SIGABRT (exit 134)"]
    assert "crashed" not in cifar["eager"] and cifar["eager"]["erm_s_per_epoch"] == 4.0
    assert got["calls"]["second-call"] == {"bench_args": "--engines captured --precisions auto",
                                           "sections": {"cifar": "SIGSEGV (exit 139)", "utkface": "exit 0"}}
    assert got["calls"]["third-call"]["bench_args"] == "--engines eager,compiled"
    assert got["two_moons_1000_cells_s"] is None          # 7 of 9 cells failed: the seconds price nothing
    assert got["sweep_failures"] == {"moons/stacked": {"ledger": {"completed": 2, "failed": 7}, "errors": moons_errors}}
    assert got["programme_hours"]["specs"]["two-moons.toml"]["default"] is None
    assert got["utkface_s_per_epoch"] == {"erm": 0.39, "rfl": 0.41}
    assert got["not_measured"] == ["cifar/compiled/auto/fl", "moons/one_per_worker", "profile (stopped partway)"]
    assert got["raw"]["utkface"] == "gpu-2026-11-26-h200/second-call/utkface.json"
    copied = results / "gpu-2026-11-26-h200"
    assert {(p.parent.name, p.name): p.read_bytes() for p in copied.glob("*/*")} == \
        {(p.parent.name, p.name): p.read_bytes() for p in lease.glob("*/*")}


def test_collect_writes_the_cuda_task_costs_the_dry_run_prices_with(tmp_path: Path) -> None:
    """collect turns the cells it timed one at a time on the default engine into task-costs-<date>-cuda.json: the
    first epoch's extra is the start-up, one evaluation every 10 epochs is spread over them; flctl.cost then prices
    a CIFAR-10 cell on cuda from it (the paper's dry run on a machine with no CUDA runs of its own)."""
    from benchmarks import bench_gpu
    from flctl import api
    from flctl.cost import reference_cost

    env = {"device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "cuda": "13.0", "commit": "abc1234"}
    cifar = {"env": env, "ok": True, "runs": {
        "captured/auto/erm": {"epoch_s": 1.2, "first_epoch_s": 9.2, "eval_s": 1.0},
        "captured/auto/fl": {"epoch_s": 1.4, "first_epoch_s": 9.4, "eval_s": 1.0},
        "eager/auto/fl": {"epoch_s": 4.0, "first_epoch_s": 30.0, "eval_s": 1.0}}}       # not the default engine
    (tmp_path / "call").mkdir()
    (tmp_path / "call" / "cifar.json").write_text(json.dumps(cifar))
    results = tmp_path / "results"
    bench_gpu.main(["collect", str(tmp_path / "call"), "--date", "2026-11-26", "--results", str(results)])

    got = json.loads((results / "task-costs-2026-11-26-cuda.json").read_text())
    assert got["tasks"] == {"cifar10": {"s_per_cell": 8.0, "s_per_epoch": 1.4, "from": 2}}   # medians: 8, 1.3 + 0.1
    cost = reference_cost([api.config("cifar10", "fl", check_data=False, device="cuda", epochs=200)], 1, results)
    assert cost is not None and cost.source == "benchmarks/results/task-costs-2026-11-26-cuda.json"
    assert abs(cost.device_hours - (8.0 + 200 * 1.4) / 3600) < 1e-9
    assert reference_cost([api.config("cifar10", "fl", check_data=False, epochs=200)], 1, results) is None       # cpu: none here
