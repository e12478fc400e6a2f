"""GPU proof: the suite with CUDA visible and paper-scale timings of the CUDA paths, one JSON file per section.

Every timing trains through flctl's own code (``train()`` or ``flctl sweep``) on data written in the dataset's real
on-disk format, so the loaders, the on-device pipelines, the store and the checkpoints are all in the numbers.

    python benchmarks/bench_gpu.py suite --out DIR      # python -m pytest with CUDA visible (junit + log)
    python benchmarks/bench_gpu.py cifar                # 50k/10k CIFAR-format batches: ERM/FL s/epoch per engine, precision
    python benchmarks/bench_gpu.py profile              # torch.profiler over one FL epoch: GPU busy vs wall, per engine
    python benchmarks/bench_gpu.py share                # flctl sweep on one GPU: K cells together vs K processes
    python benchmarks/bench_gpu.py moons                # 1,000-cell two-moons grid through flctl sweep, grouped vs not
    python benchmarks/bench_gpu.py utkface              # 22,190 JPEGs (4,438 training images) at the default 200 px
    python benchmarks/bench_gpu.py dpo                  # orca-dpo: a ~1B causal LM in 4-bit NF4 with LoRA, length 1024
    python benchmarks/bench_gpu.py precision            # bf16 autocast vs fp32 metrics, two-moons and digits, 3 seeds
    python benchmarks/bench_gpu.py diagnose --out DIR   # the suite's first failing gpu test alone, under CUDA's checks
    python benchmarks/bench_gpu.py collect DIR...       # merge sections into benchmarks/results/gpu-<date>-<device>.json
    python benchmarks/bench_gpu.py commit               # the project's commit, as each section's JSON records it

``--small`` shrinks every size so the sections run on a CPU in minutes (a check of this script, not a measurement).
Epoch times are medians of the epochs after the first (which pays cuDNN's, the allocator's, graph capture's and
the compiler's warm-up); an epoch that evaluates is timed separately and its extra cost reported as ``eval_s``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))          # the tests' writers of the real on-disk formats

from flctl.config import resolve  # noqa: E402
from flctl.db.urls import file_url  # noqa: E402
from flctl.layout import Layout  # noqa: E402
from flctl.tasks import get_task  # noqa: E402
from flctl.train import EpochStats, train, train_together  # noqa: E402
from tests.data_writers import orca_rows, write_cifar10, write_orca_dpo  # noqa: E402

PAPER_EVAL_EVERY = 10      # the paper schedule for CIFAR-10: 200 epochs, evaluated every 10


class Stop(Exception):
    """Raised from the epoch callback once enough epochs are timed."""


def config(task: str, method: str, device: str, **overrides):
    """The task's config for ``method`` on ``device``. The device is one of the overrides resolve() checks, so that
    validation (the captured engine needs CUDA) and the task's per-device options see where the run trains."""
    return resolve(get_task(task), method, {**overrides, "device": device})


def cuda(device: str) -> bool:
    return device.startswith("cuda")


def sync(device: str) -> None:
    if cuda(device):
        torch.cuda.synchronize()


def timed_epochs(cfg, work: Path, epochs: int, on_epoch=None) -> dict:
    """Train ``cfg`` for ``epochs`` epochs (of its full schedule) and time each one from the callback."""
    marks: list[tuple[float, bool]] = []
    start = time.perf_counter()

    def callback(stats: EpochStats) -> None:
        sync(cfg.device)
        marks.append((time.perf_counter(), stats.metrics is not None))
        if on_epoch is not None:
            on_epoch(len(marks))
        if len(marks) >= epochs:
            raise Stop

    if cuda(cfg.device):
        torch.cuda.reset_peak_memory_stats()
    status = "timed"
    try:
        status = train(cfg, Layout(work).records, Layout(work).run_dir(cfg.run_id), on_epoch=callback).status
    except Stop:
        pass
    times = [b - a for (a, _), (b, _) in zip([(start, False)] + marks[:-1], marks)]
    plain = [t for t, (_, ev) in zip(times[1:], marks[1:]) if not ev]
    with_eval = [t for t, (_, ev) in zip(times[1:], marks[1:]) if ev]
    if not plain:
        return {"status": status, "epochs_done": len(marks), "epoch_times_s": times}
    epoch_s = statistics.median(plain)
    return {"status": status, "epoch_s": epoch_s, "epoch_times_s": [round(t, 4) for t in times],
            "first_epoch_s": times[0],          # includes data loading, model build, warm-up, capture, compile
            "eval_s": (statistics.median(with_eval) - epoch_s) if with_eval else None,
            "peak_mem_gb": torch.cuda.max_memory_allocated() / 2**30 if cuda(cfg.device) else None}


def whole_run_s(t: dict, epochs: int, eval_every: int) -> float:
    """Whole-run seconds: first epoch + the remaining epochs + one eval per eval_every (and the final one)."""
    evals = len(set(range(eval_every, epochs + 1, eval_every)) | {epochs})
    return t["first_epoch_s"] + (epochs - 1) * t["epoch_s"] + evals * (t["eval_s"] or 0.0)


def left(args) -> float:
    """Seconds left of ``--budget-s`` (a lease's device time), infinite without one."""
    return float("inf") if args.deadline is None else args.deadline - time.monotonic()


def run_logged(cmd: list[str], log: Path, timeout: float, env: dict[str, str] | None = None,
               cwd: Path | None = None) -> tuple[int | None, float]:
    """Run ``cmd`` with ``env`` added to this process's environment and output appended to ``log`` (the command
    line first, with the variables it adds); kill its process group at ``timeout``. (rc or None, seconds)."""
    env = env or {}
    t0 = time.perf_counter()
    with open(log, "a") as fh:
        fh.write(f"$ {shlex.join([f'{k}={v}' for k, v in env.items()] + cmd)}\n")
        fh.flush()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, **env}, cwd=cwd,
                                start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            rc = None
    return rc, time.perf_counter() - t0


def given_commit(text: str) -> dict:
    """A commit named by hand, in ``git describe --always --dirty`` form: ``3623c99`` or ``3623c99-dirty``. A plain
    sha says nothing of the tree (dirty None): a copy without .git cannot tell."""
    text = text.strip()
    return {"commit": text.removesuffix("-dirty"), "dirty": True if text.endswith("-dirty") else None}


def project_commit(root: Path = ROOT) -> dict:
    """The commit of the project this script lives in, and whether its tracked files differ from it (untracked
    files do not count, as for git describe --dirty). Asked of ``root``'s own repository only: a copy of the
    working tree without .git (what the device tool sends) would otherwise answer with whatever repository encloses
    the copy, which is how a lease recorded another repository's commit for its results. There FLCTL_COMMIT names
    it (given_commit). ``commit_from`` says which of the two answered."""
    def git(*cmd: str) -> str | None:
        # no optional locks: other processes work in the same tree, and a status must not take its index.lock
        res = subprocess.run(["git", "-C", str(root), *cmd], capture_output=True, text=True,
                             env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})
        return res.stdout.strip() if res.returncode == 0 else None

    if (root / ".git").exists() and (head := git("rev-parse", "--short", "HEAD")):
        status = git("status", "--porcelain", "--untracked-files=no")
        return {"commit": head, "dirty": None if status is None else bool(status), "commit_from": "git"}
    if os.environ.get("FLCTL_COMMIT", "").strip():
        return {**given_commit(os.environ["FLCTL_COMMIT"]), "commit_from": "FLCTL_COMMIT"}
    return {"commit": None, "dirty": None, "commit_from": None}


def count_errors(errors: Iterable[tuple[str, str | None]], example: str) -> list[dict]:
    """(id, error text) pairs counted by error (flctl.status.count_errors, as `flctl status` counts a sweep's), most
    frequent first: each as {message (with what differs between occurrences replaced), count, ``example`` (the first
    id with it), example_error (its whole text, tail-cut to 3,000 characters)}."""
    from flctl.status import count_errors as counted

    return [{"message": g["key"], "count": g["count"], example: g["run"], "example_error": g["error"]}
            for g in counted(errors)]


def sweep_errors(results: Path) -> list[dict]:
    """The failed cells of the sweep in the results folder ``results``, counted by error (count_errors), read from
    its database through flctl's store: the folder, and the errors in it, stay on the lent machine."""
    from flctl.db import Store
    from flctl.status import Status

    layout = Layout(results)
    if not layout.db.exists():
        return []
    store = Store.open(file_url(layout.db), readonly=True)
    try:
        failed = store.list_runs(status=Status.FAILED)
    finally:
        store.close()
    return count_errors(((r.id, r.error) for r in failed), "example_run_id")


# ------------------------------------------------------------------------------------------------ sections

def suite(args) -> dict:
    """The whole suite, CUDA visible. pytest-xdist spreads it over processes when it is installed."""
    junit = args.out / "junit.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", "-ra"]
    try:
        import xdist  # noqa: F401
        cmd += ["-n", str(args.workers)]
    except ImportError:
        pass
    cmd += args.pytest_args
    if args.small:           # a check of this section on a CPU: one quick test file, in this process's pytest
        cmd = [c for c in cmd if c not in ("-n", str(args.workers))] + ["-n", "0", "tests/test_methods.py"]
    rc, seconds = run_logged(cmd, args.out / "pytest.log", min(args.timeout, left(args)))
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    failures = []
    if junit.exists():
        for case in ET.parse(junit).getroot().iter("testcase"):
            kind = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
            key = {"failure": "failed", "error": "errors"}.get(kind, kind)
            counts[key] += 1
            if kind in ("failure", "error"):
                failures.append(f"{case.get('classname')}::{case.get('name')}")
    return {**counts, "failures": failures, "rc": rc, "seconds": seconds,
            "command": " ".join(["python", "-m", "pytest"] + cmd[cmd.index("pytest") + 1:]).replace(str(junit),
                                                                                                  "junit.xml")}


# The reruns of the suite's first failing gpu test, each alone in a process: its log's name and what it adds to the
# environment. Launch blocking makes a kernel's fault surface at the call that launched it, not at a later
# synchronisation; PyTorch's CUDA sanitizer (CSAN) reports a tensor used on two streams with nothing ordering them.
DIAGNOSE = {"launch-blocking": {"CUDA_LAUNCH_BLOCKING": "1"}, "sanitizer": {"TORCH_CUDA_SANITIZER": "1"}}


def _junit_address(nodeid: str) -> tuple[str, str]:
    """A pytest node id as junit.xml names the test, (classname, name): pytest's junitxml plugin's mangling."""
    path, bracket, params = nodeid.partition("[")
    names = path.split("::")
    names[0] = re.sub(r"\.py$", "", names[0].replace("/", "."))
    names[-1] += bracket + params
    return ".".join(names[:-1]), names[-1]


def _test_file(classname: str, root: Path) -> str | None:
    """The test file (relative to ``root``) of a junit classname (``tests.test_x`` or ``tests.test_x.TestCase``)."""
    parts = classname.split(".")
    for i in range(len(parts), 0, -1):
        if (root / "/".join(parts[:i])).with_suffix(".py").is_file():
            return "/".join(parts[:i]) + ".py"
    return None


def failed_tests(junit: Path) -> list[tuple[str, str, str]]:
    """The tests that failed or errored in ``junit``, in its order: (classname, name, failure message)."""
    return [(case.get("classname") or "", case.get("name") or "", bad.get("message") or bad.text or "")
            for case in ET.parse(junit).getroot().iter("testcase")
            for bad in [next((c for c in case if c.tag in ("failure", "error")), None)] if bad is not None]


def first_failing_gpu_test(junit: Path, root: Path, timeout: float = 120) -> str | None:
    """The node id of the first test marked gpu that failed in ``junit``, or None. junit.xml lists the tests in the
    order their results came in, so a process's first failure comes before the cascade its dead CUDA context causes
    in its later tests (CPU tests among them, which are not marked gpu). pytest itself says which tests are marked
    (--collect-only -m gpu over the failed tests' files)."""
    failed = [(cls, name) for cls, name, _ in failed_tests(junit)]
    files = sorted({f for cls, _ in failed if (f := _test_file(cls, root))})
    if not files:
        return None
    res = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-n", "0",
                          "-p", "no:cacheprovider", *files], cwd=root, capture_output=True, text=True, timeout=timeout)
    if res.returncode not in (0, 5):        # 5: none of them is marked gpu
        raise RuntimeError(f"pytest could not collect {' '.join(files)}: {(res.stdout + res.stderr)[-2000:]}")
    marked = {_junit_address(line.strip()): line.strip() for line in res.stdout.splitlines() if "::" in line}
    return next((marked[t] for t in failed if t in marked), None)


def diagnose(args) -> dict:
    """The suite's first failing gpu test (first_failing_gpu_test, from OUT/junit.xml) run again alone, once per
    DIAGNOSE entry, each with its own log (OUT/diagnose-NAME.log) and an equal share of the time left."""
    junit = args.out / "junit.xml"
    if not junit.exists():
        why = "no junit.xml: the suite section did not run"
        test = None
    else:
        test = first_failing_gpu_test(junit, ROOT, timeout=min(args.timeout, left(args)))
        why = "no test marked gpu failed in the suite"
    if test is None:
        print(f"diagnose: {why}; nothing to run", flush=True)
        return {"test": None, "why": why}
    print(f"diagnose: {test}", flush=True)
    out: dict = {"test": test, "runs": {}}
    for i, (name, env) in enumerate(DIAGNOSE.items()):
        if left(args) < args.min_left_s:
            out["runs"][name] = {"env": env, "not_measured": True}
            continue
        cap = min(args.timeout, left(args) / (len(DIAGNOSE) - i))
        log = args.out / f"diagnose-{name}.log"
        # -s: output goes to the log as it is written, so a process killed at its cap or by a crash leaves it
        rc, seconds = run_logged([sys.executable, "-m", "pytest", "-s", "-n", "0", "-p", "no:cacheprovider", test],
                                 log, cap, env=env, cwd=ROOT)
        out["runs"][name] = {"env": env, "log": log.name, "rc": rc, "seconds": seconds, "cap_s": cap,
                             "timed_out": rc is None}
        print(f"diagnose {name}: rc {rc} in {seconds:.0f} s (log {log.name})", flush=True)
        args.partial(out)
    return out


def cifar_per_batch(args) -> int:
    """Images per CIFAR-10 batch file: 5 train batches and 1 test batch, as the real data (--small: a check of the
    path, sized so that one epoch is a few steps)."""
    return 50 if args.small else 10_000


def cifar_data(args) -> Path:
    per_batch = cifar_per_batch(args)
    return write_cifar10(args.work / f"cifar-{per_batch}", per_batch=per_batch)


def cifar(args) -> dict:
    data = cifar_data(args)
    n = 5 * cifar_per_batch(args)
    width = 8 if args.small else 64
    out: dict = {"images_train": n, "width": width, "runs": {}}
    for engine in args.engines.split(","):
        for precision in args.precisions.split(","):
            if engine == "compiled" and precision == "fp32" and not args.small:
                continue     # one compile per method is what the lease affords; bf16 is the default
            for m in ("erm", "fl"):
                key = f"{engine}/{precision}/{m}"
                if left(args) < args.min_left_s:      # the lease's end: name what was not measured
                    out.setdefault("not_measured", []).append(key)
                    continue
                torch._dynamo.reset()      # each configuration compiles afresh, as in its own process
                # named in the file before it trains: a process that dies of it (a segfault) leaves no traceback
                args.partial({**out, "running": key})
                try:
                    # eval at the last timed epoch, so it shows the evaluation's cost
                    cfg = config("cifar10", m, args.device, data_dir=str(data), eval_every=args.epochs,
                                 options={"width": width}, precision=precision, engine=engine)
                    t = timed_epochs(cfg, args.work / "runs", args.epochs)
                except Exception as exc:          # one broken engine must not cost the others' numbers
                    import traceback

                    traceback.print_exc()
                    out["runs"][key] = {"error": f"{type(exc).__name__}: {exc}"}
                    continue
                out["runs"][key] = t
                args.partial(out)
                if "epoch_s" in t:
                    t["images_per_s"] = n / t["epoch_s"]
                    t["minutes_200_epochs"] = whole_run_s(t, 200, PAPER_EVAL_EVERY) / 60
                    print(f"cifar10 {key}: {t['epoch_s']:.2f} s/epoch ({t['epoch_times_s']}), eval {t['eval_s']}, "
                          f"200 epochs ~ {t['minutes_200_epochs']:.1f} min", flush=True)
                else:
                    print(f"cifar10 {key}: {t}", flush=True)
    return out


def profile(args) -> dict:
    """One FL epoch of CIFAR-10 (bf16) under torch.profiler per engine, and the same epoch unprofiled."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    data = cifar_data(args)
    out: dict = {}
    tables = []
    for engine in args.engines.split(","):
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda(args.device) else [])
        prof = torch_profile(activities=activities)
        torch._dynamo.reset()
        state = {}

        def on_epoch(done: int) -> None:       # epoch 2 unprofiled, epoch 3 profiled
            if done == 2:
                prof.start()
                state["t0"] = time.perf_counter()
            if done == 3:
                prof.stop()
                state["wall"] = time.perf_counter() - state["t0"]

        args.partial({**out, "running": engine})      # as in cifar: what a crash interrupted
        try:
            cfg = config("cifar10", "fl", args.device, data_dir=str(data), eval_every=100,
                         options={"width": 8 if args.small else 64}, engine=engine)
            t = timed_epochs(cfg, args.work / "prof", 3, on_epoch=on_epoch)
        except Exception as exc:
            out[engine] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        events = prof.key_averages()
        steps = -(-5 * cifar_per_batch(args) // cfg.batch_size)
        device_us = sum(e.self_device_time_total for e in events) if cuda(args.device) else 0.0
        kernels = sum(e.count for e in events if e.device_type.name == "CUDA")
        sort = "self_cuda_time_total" if cuda(args.device) else "self_cpu_time_total"
        tables.append(f"== engine {engine}: one FL epoch of CIFAR-10, {steps} steps\n"
                      + events.table(sort_by=sort, row_limit=25))
        out[engine] = {"steps": steps, "wall_ms_per_step": t["epoch_times_s"][1] / steps * 1e3,
                       "profiled_wall_ms_per_step": state["wall"] / steps * 1e3,
                       "gpu_busy_ms_per_step": device_us / steps / 1e3,
                       "gpu_busy_share": device_us / 1e6 / t["epoch_times_s"][1],
                       "device_events_per_step": kernels / steps}
        print(f"profile {engine}: {out[engine]}", flush=True)
        args.partial(out)
    (args.out / "profile.txt").write_text("\n\n".join(tables))
    return out


def _ledger(db: Path) -> dict[str, int]:
    with sqlite3.connect(db) as con:
        return dict(con.execute("select status, count(*) from runs group by status").fetchall())


def flctl_sweep(args, name: str, task_args: list[str], launch: list[str], timeout: float) -> dict:
    """``flctl sweep ... --wait`` in a fresh results folder; wall seconds, what the ledger says at the end, and the
    failed cells' errors counted by error (sweep_errors)."""
    results = args.work / "sweeps" / name
    if results.exists():
        shutil.rmtree(results)
    cmd = [sys.executable, "-m", "flctl", "sweep", *task_args, "--device", args.device, "--wait",
           "--results-dir", str(results), *launch]
    layout = Layout(results)
    if left(args) < args.min_left_s:
        print(f"{name}: not measured, {left(args):.0f} s of the budget left", flush=True)
        return {"command": "flctl sweep " + " ".join(task_args + launch), "not_measured": True, "rc": None,
                "seconds": None, "ledger": {}, "timed_out": False}
    rc, seconds = run_logged(cmd, args.out / "sweeps.log", min(timeout, left(args)),
                             env={"FLCTL_DB": file_url(layout.db), "TERM": "dumb"})
    ledger = _ledger(layout.db) if layout.db.exists() else {}
    row: dict = {"command": "flctl sweep " + " ".join(task_args + launch), "rc": rc, "seconds": seconds,
                 "ledger": ledger, "timed_out": rc is None}
    print(f"{name}: {row}", flush=True)
    try:
        row["errors"] = sweep_errors(results)
    except Exception as exc:           # the figures above stand without them
        row["errors"] = None
        row["errors_unread"] = f"{type(exc).__name__}: {exc}"
    for e in (row["errors"] or [])[:5]:
        print(f"  {e['count']} x {e['message']} (e.g. run {e['example_run_id']})", flush=True)
    return row


def steady(cfgs: list, work: Path, seconds: float, images_per_epoch: int, warmup_epochs: int = 2) -> dict:
    """Train ``cfgs`` together in this process; images/s over ``seconds`` of steady training after ``warmup_epochs``
    (warm-up steps, capture, cuDNN's autotuning): no process start-up, data, model build, eval or checkpoint in the
    window. Ends once the window is full."""
    marks: list[float] = []
    first = cfgs[0].run_id

    def on_epoch(stats: EpochStats) -> None:
        if stats.run_id != first:
            return
        sync(cfgs[0].device)
        marks.append(time.perf_counter())
        if len(marks) > warmup_epochs and marks[-1] - marks[warmup_epochs] >= seconds:
            raise Stop

    layout = Layout(work)
    try:
        train_together(cfgs, layout.records, [layout.run_dir(c.run_id) for c in cfgs], on_epoch,
                       checkpoint_every=float("inf"))
    except Stop:
        pass
    epochs = len(marks) - 1 - warmup_epochs
    if epochs < 1:
        return {"cells": len(cfgs), "images_per_s": None, "epochs_timed": 0}
    span = marks[-1] - marks[warmup_epochs]
    images = len(cfgs) * epochs * images_per_epoch
    return {"cells": len(cfgs), "epochs_timed": epochs, "seconds": span, "window": (marks[warmup_epochs], marks[-1]),
            "images": images, "images_per_s": images / span}


def _steady_one(cfg, work: str, seconds: float, images_per_epoch: int) -> dict:
    """One cell in a process of its own (``share``'s K processes per GPU); its window in perf_counter time, which is
    the system-wide monotonic clock on Linux, so the K windows can be compared."""
    return steady([cfg], Path(work), seconds, images_per_epoch)


# Ways K FL CIFAR-10 cells train together on one GPU (share), each behind the one setting that picks it:
# grouped: one process, one grouped model (--batch-runs K; engine auto, so captured); captured-streams: one process,
# each cell's captured graphs replayed on a CUDA stream of its own (--engine captured-streams); compiled-captured: one
# process, each cell's compiled step captured, replayed in turn (--engine compiled-captured); processes: K processes of
# one cell (--per-gpu K), through NVIDIA MPS where the machine runs its daemon (``mps`` says).
TOGETHER = {"grouped": {}, "captured-streams": {"engine": "captured-streams"},
            "compiled-captured": {"engine": "compiled-captured"}, "processes": {}}
# (way, K) in the order a lease cut short still answers most: K = 4 of each first, then 8, then 2
TOGETHER_PLAN = [("grouped", 1), ("grouped", 4), ("processes", 4), ("captured-streams", 4), ("compiled-captured", 1),
                 ("compiled-captured", 4), ("grouped", 8), ("processes", 8), ("captured-streams", 8),
                 ("compiled-captured", 8), ("grouped", 2), ("processes", 2), ("captured-streams", 2),
                 ("compiled-captured", 2)]


def share(args) -> dict:
    """Steady-state images/s of K FL CIFAR-10 cells on one GPU, K = 1, 2, 4, 8, each way of TOGETHER, over a window
    of steady training per configuration; process start-up, data, warm-up, capture and compilation are outside it
    (``steady``). Written under ``together``: {way: {K: row}}."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from flctl.launch.backends.local import mps_daemon

    data = cifar_data(args)
    per_batch, seconds = cifar_per_batch(args), 1.0 if args.small else 8.0
    out: dict = {"seconds_each": seconds, "images_train": 5 * per_batch, "mps": mps_daemon(),
                 "together": {way: {} for way in TOGETHER}}
    ways = [(w, k) for w, k in TOGETHER_PLAN if cuda(args.device) or "engine" not in TOGETHER[w]]   # graphs: CUDA
    if args.small:                # a check of the section: each way once, with two cells
        ways = [(w, k) for w, k in ways if k in (1, 2)]

    def cfgs(way: str, k: int) -> list:
        over = {"options": {"width": 8}} if args.small else {}
        return [config("cifar10", "fl", args.device, seed=i, epochs=100_000, eval_every=100_000, data_dir=str(data),
                       **TOGETHER[way], **over) for i in range(k)]
    for way, k in ways:
        if left(args) < args.min_left_s + seconds:
            out["together"][way][str(k)] = {"not_measured": True, "images_per_s": None}
            continue
        work = args.work / "share" / f"{way}-{k}"
        shutil.rmtree(work, ignore_errors=True)
        torch._dynamo.reset()
        try:
            if way != "processes":
                row = steady(cfgs(way, k), work, seconds, 5 * per_batch)
            else:
                with ProcessPoolExecutor(k, mp_context=get_context("spawn")) as pool:
                    rows = list(pool.map(_steady_one, cfgs(way, k), [str(work / str(i)) for i in range(k)],
                                         [seconds] * k, [5 * per_batch] * k))
                starts, ends = [r["window"][0] for r in rows], [r["window"][1] for r in rows]
                overlap = max(0.0, min(ends) - max(starts)) / max(r["seconds"] for r in rows)
                row = {"cells": k, "images_per_s": sum(r["images_per_s"] for r in rows), "processes": rows,
                       "overlap": overlap}   # the share of the windows all K processes trained at once
        except Exception as exc:            # one configuration's failure costs only its own figure
            row = {"error": f"{type(exc).__name__}: {exc}"}
        row["images_per_s"] = row.get("images_per_s")
        out["together"][way][str(k)] = row
        print(f"share {way} K={k}: {row.get('images_per_s')} images/s", flush=True)
        args.partial(out)
    out["together"]["processes"]["1"] = out["together"]["grouped"].get("1", {"images_per_s": None})
    return out


# Ways the 1,000-cell two-moons grid runs on one GPU (moons), fewest processes first: one worker with groups of 250
# cells, 4 workers of one group each, 8 workers of 125; then the 8 workers of 8 cells the first leases ran.
MOONS_WAYS = {"one_process": ["--per-gpu", "1", "--batch-runs", "250"],
              "per_gpu_4": ["--per-gpu", "4", "--batch-runs", "250"],
              "per_gpu_8": ["--per-gpu", "8", "--batch-runs", "125"],
              "per_gpu_8_k8": ["--per-gpu", "8", "--batch-runs", "8"]}


def moons(args) -> dict:
    """lr x dual lr x seeds = 10 x 10 x 10 FL cells of two-moons (paper schedule, 250 epochs) through flctl sweep
    --wait, the whole grid each way of MOONS_WAYS while the budget lasts; cells/s from the ledger. ``--small``: 8
    cells of 5 epochs, one worker's groups on a CPU (its --per-gpu has no meaning there)."""
    n = 2 if args.small else 10
    grid = ["two-moons", "-m", "fl", "--lr", f"1e-4..1e-2:{n}", "--dual-lr", f"1e-3..1:{n}", "--seeds", str(n)]
    over = ["--epochs", "5"] if args.small else []
    out = {}
    for name, launch in list(MOONS_WAYS.items())[:2 if args.small else None]:
        if not cuda(args.device):
            launch = ["--workers", "1", "--batch-runs", launch[-1] if args.small else "16"]
        row = flctl_sweep(args, f"moons-{name}", grid + over, launch, args.timeout)
        row["cells"] = n ** 3
        row["cells_per_s"] = row["ledger"].get("completed", 0) / row["seconds"] if row["seconds"] else None
        out[name] = row
        args.partial(out)
    return out


def precision(args) -> dict:
    import pyarrow.parquet as pq

    out: dict = {}
    seeds = (0, 1) if args.small else (0, 1, 2)        # small: two, the fewest a spread needs
    for task, method in (("two-moons", "fl"), ("digits", "fl")):
        for prec in ("auto", "fp32"):
            rows = []
            for seed in seeds:
                over = {"epochs": 2} if args.small else {}
                cfg = config(task, method, args.device, seed=seed, precision=prec, **over)
                t0 = time.perf_counter()
                prec_work = Layout(args.work / "prec")
                res = train(cfg, prec_work.records, prec_work.run_dir(cfg.run_id))
                files = sorted(prec_work.run_records(cfg.run_id).glob("epoch=*.parquet"))
                schema = pq.read_schema(files[-1])
                rows.append({"seed": seed, "seconds": time.perf_counter() - t0, "status": res.status,
                             **{k: res.metrics[k] for k in ("train.avg_loss", "train.max_loss", "train.accuracy",
                                                            "test.accuracy", "test.avg_loss", "train.violation_rate")},
                             "record_types": {f: str(schema.field(f).type) for f in ("loss", "multiplier")}})
            summary = {}
            for k in ("train.avg_loss", "train.max_loss", "train.accuracy", "test.accuracy", "test.avg_loss",
                      "train.violation_rate"):
                vals = [r[k] for r in rows]
                summary[k] = {"mean": statistics.mean(vals), "std": statistics.stdev(vals)}
            out[f"{task}/{method}/{'bf16' if prec == 'auto' else 'fp32'}"] = {"summary": summary, "runs": rows}
            print(f"{task} {method} {prec}: " + ", ".join(f"{k} {v['mean']:.4f}±{v['std']:.4f}"
                                                          for k, v in summary.items()), flush=True)
    return out



def _write_faces(folder: Path, size: int, start: int, stop: int) -> None:
    from PIL import Image

    rng = np.random.default_rng(start)
    yy, xx = np.mgrid[0:size, 0:size]
    for i in range(start, stop):
        age, gender, race = int(rng.integers(5, 100)), int(rng.integers(0, 2)), int(rng.integers(0, 5))
        base = rng.integers(0, 256, 3)
        img = (base[None, None, :] + 0.5 * (xx + yy)[:, :, None] * rng.uniform(0.2, 1, 3)) % 256
        Image.fromarray(img.astype(np.uint8)).save(folder / f"{age}_{gender}_{race}_2017{i:013d}.jpg.chip.jpg",
                                                   quality=90)


def utkface(args) -> dict:
    from concurrent.futures import ProcessPoolExecutor

    from flctl_tasks import utkface as utk

    # paper-code split, no age <= 4: n_train = ceil(floor(0.8 N) / 4), so N = 22,190 gives the paper's 4,438.
    n = 400 if args.small else 22_190
    folder = args.work / f"utkface-{n}"
    if not folder.exists():
        folder.mkdir(parents=True)
        t0 = time.perf_counter()
        parts = np.linspace(0, n, 17).astype(int)
        with ProcessPoolExecutor(16) as pool:
            list(pool.map(_write_faces, [folder] * 16, [200] * 16, parts[:-1], parts[1:]))
        print(f"wrote {n} 200x200 JPEGs in {time.perf_counter() - t0:.1f} s", flush=True)
    opts = {"width": 8, "size": 32} if args.small else {}
    t0 = time.perf_counter()
    data = utk.load({**get_task("utkface").options, **opts}, str(folder))
    out = {"images": n, "n_train": len(data.train), "n_test": len(data.test),
           "decode_and_cache_s": time.perf_counter() - t0, "size": get_task("utkface").options["size"], "methods": {}}
    for m in ("erm", "rfl"):
        cfg = config("utkface", m, args.device, data_dir=str(folder), eval_every=args.epochs, options=opts)
        t = timed_epochs(cfg, args.work / "utk", args.epochs)
        out["methods"][m] = t
        args.partial(out)
        if "epoch_s" in t:
            t["minutes_paper_run"] = whole_run_s(t, cfg.epochs, 1) / 60
            print(f"utkface {m}: {t['epoch_s']:.2f} s/epoch ({t['epoch_times_s']})", flush=True)
    return out


def dpo(args) -> dict:
    """A ~1B-parameter Llama (random weights, built from transformers' config classes, saved as a local model
    folder), loaded by the task in 4-bit NF4 with LoRA; pairs long enough to fill the paper's max length 1024."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from flctl_tasks import orca_dpo

    rows = orca_rows(16) * (2 if args.small else 8)     # 11 kept per 16 rows
    filler = " ".join(f"step {j}: consider the facts given and reason with care." for j in range(16))
    for i, r in enumerate(rows):                          # byte-level tokens: ~1 per character
        r["input"] = f"{r['input']} (question {i}) {filler}"
        r["chosen"] = f"{r['chosen']} {filler}"
        r["rejected"] = f"{r['rejected']} {filler}"
    data = write_orca_dpo(args.work / "orca", rows=rows)
    tok = orca_dpo.load_tokenizer({"model": "tiny"})
    folder = args.work / ("lm-small" if args.small else "lm-1b")
    shape = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2) if args.small else \
        dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=16,
             num_key_value_heads=4)                     # TinyLlama's shape: ~1.0B parameters with this vocabulary
    lm_cfg = LlamaConfig(vocab_size=len(tok), max_position_embeddings=4096, pad_token_id=tok.pad_token_id,
                         eos_token_id=tok.eos_token_id, bos_token_id=None, tie_word_embeddings=False, **shape)
    if not folder.exists():
        t0 = time.perf_counter()
        torch.manual_seed(0)
        with torch.device(args.device):
            lm = LlamaForCausalLM(lm_cfg).to(torch.bfloat16)
        params = sum(p.numel() for p in lm.parameters())
        lm.save_pretrained(folder)
        tok.save_pretrained(folder)
        (folder / "flctl-params.txt").write_text(str(params))
        del lm
        torch.cuda.empty_cache() if cuda(args.device) else None
        print(f"built and saved a {params / 1e9:.2f}B Llama in {time.perf_counter() - t0:.0f} s", flush=True)
    params = int((folder / "flctl-params.txt").read_text())
    out: dict = {"params": params, "shape": shape, "quantized": cuda(args.device)}
    cfg = config("orca-dpo", "fl", args.device, data_dir=str(data), epochs=20, warmup_steps=0, lr=1e-4,
                 eval_every=args.epochs, options={"model": str(folder)})
    t = timed_epochs(cfg, args.work / "dpo", args.epochs)
    n_train = len(orca_dpo.load(cfg.opts, cfg.data_dir).train)
    out.update(t, n_train=n_train, max_length=cfg.opts["max_length"], micro_batch=cfg.micro_batch,
               batch_size=cfg.batch_size)
    if "epoch_s" in t:
        out["pairs_per_s"] = n_train / t["epoch_s"]
        print(f"orca-dpo 1B fl: {out['pairs_per_s']:.2f} pairs/s, peak {t['peak_mem_gb']} GB", flush=True)
    return out


SECTIONS = {"suite": suite, "diagnose": diagnose, "cifar": cifar, "profile": profile, "share": share, "moons": moons,
            "utkface": utkface, "dpo": dpo, "precision": precision}


# ------------------------------------------------------------------------------------------------ collect

def _completed(row: dict) -> bool:
    """Whether a sweep trained every one of its cells: only then do its seconds price them (a sweep whose cells
    failed measured how fast they fail as much as how fast they train)."""
    return bool(row.get("seconds")) and row.get("ledger", {}).get("completed") == row.get("cells")


def default_engine(on_cuda: bool) -> str:
    """The engine ``--engine auto`` (the default) steps a CIFAR-10 or UTKFace cell on, on a GPU or not: what a
    researcher gets without a flag, and so what the programme's hours are priced with (flctl.step.step_engine)."""
    from types import SimpleNamespace

    from flctl.step import step_engine

    return step_engine(SimpleNamespace(engine="auto", prune_after=0), get_task("cifar10"),  # type: ignore[arg-type]
                       torch.device("cuda" if on_cuda else "cpu"))


def _programme(sections: dict, on_cuda: bool = True) -> dict:
    """Device-hours of every spec in sweeps/ (and the paper's full CIFAR robustness grid): cells x hours per cell
    from the measured figures. ``default``: the defaults (``--engine auto``, bf16, one cell per process per GPU); a
    cell's whole run is its first epoch (build, warm-up, capture), the others, and one evaluation per its
    eval_every. ``best``: the fastest measured engine and precision, times the best measured gain of cells together
    (share). A task without a measured figure has no hours, and the totals say which specs they leave out."""
    from flctl.sweep import load_spec, plan

    cif, utk, moon, share_, dpo_ = (sections.get(k, {}) for k in ("cifar", "utkface", "moons", "share", "dpo"))
    runs = {k: v for k, v in cif.get("runs", {}).items() if "epoch_s" in v}
    engine = default_engine(on_cuda)
    rates = [v["images_per_s"] for way in _together(share_).values() for v in way.values() if v.get("images_per_s")]
    one = _together(share_).get("grouped", {}).get("1", {}).get("images_per_s")
    gain = max(1.0, max(rates) / one) if one and rates else 1.0
    hours: dict[str, dict] = {}

    def per_cell(task: str, method: str, epochs: int, eval_every: int, model: str | None
                 ) -> tuple[float, float] | None:
        """(default, best) hours of one cell, or None where nothing was measured for the task."""
        m = "erm" if method in ("erm", "cserm") else "fl"
        if task == "cifar10" and f"{engine}/auto/{m}" in runs:
            whole = {k: whole_run_s(v, epochs, eval_every) / 3600 for k, v in runs.items() if k.endswith(f"/{m}")}
            return whole[f"{engine}/auto/{m}"], min(whole.values()) / gain
        utk_m = utk.get("methods", {}).get("rfl" if m == "fl" else "erm", {})
        if task == "utkface" and "epoch_s" in utk_m:
            h = whole_run_s(utk_m, epochs, eval_every) / 3600 if "first_epoch_s" in utk_m else \
                epochs * utk_m["epoch_s"] / 3600
            return h, h / gain
        done = {name: row["cells_per_s"] for name, row in moon.items() if isinstance(row, dict) and _completed(row)}
        if task == "two-moons" and done:
            default = done.get("per_gpu_8_k8", done.get("stacked", max(done.values())))  # what the defaults ran
            return epochs / 250 / default / 3600, epochs / 250 / max(done.values()) / 3600
        if task == "orca-dpo" and dpo_.get("pairs_per_s"):
            # compute per pair grows with the parameters: the measured ~1B model scaled to the named one
            size = 8.0e9 if "8B" in (model or "") else 3.0e9 if "3b" in (model or "").lower() else 8.0e9
            pairs = 12_859          # the paper's training-set size (its dataset table)
            h = epochs * pairs / (dpo_["pairs_per_s"] * dpo_["params"] / size) / 3600
            return h, h
        return None

    specs = sorted((ROOT / "sweeps").glob("*.toml"))
    extra = {"cifar10-robustness-full (paper: 11 primal x 6 dual lrs x 4 methods x 5 seeds)":
             ("cifar10", [(m, 200, PAPER_EVAL_EVERY, None) for m in ("erm", "fl", "rfl", "cserm")
                          for _ in range(11 * 6 * 5)])}
    for path in specs:
        spec = load_spec(path)
        cfgs = plan(spec, check_data=False, allow_large=True)
        extra[path.name] = (spec.task, [(c.method, c.epochs, c.eval_every, c.opts.get("model")) for c in cfgs])
    for name, (task, cells) in extra.items():
        per = [per_cell(task, m, e, ev, model) for m, e, ev, model in cells]
        if any(p is None for p in per):
            hours[name] = {"cells": len(cells), "default": None, "best": None, "why": f"no GPU figure for {task}"}
            continue
        hours[name] = {"cells": len(cells), "default": sum(p[0] for p in per), "best": sum(p[1] for p in per)}
    total = {k: sum(h[k] for h in hours.values() if h[k] is not None) for k in ("default", "best")}
    unpriced = sorted(name for name, h in hours.items() if h["default"] is None)
    return {"engine": engine, "specs": hours, **total, "left_out": unpriced}


def _together(share_: dict) -> dict[str, dict[str, dict]]:
    """A share section's figures as {way: {K: row}}: ``together`` (this script), or a lease's from before it
    (``stacked``: one grouped model; ``per_gpu``: K processes)."""
    if "together" in share_:
        return share_["together"]
    return {"grouped": share_.get("stacked", {}), "processes": share_.get("per_gpu", {})}


def _lease_log(path: Path) -> dict[str, str]:
    """How each section that a call of gpu_lease.sh started ended, from the call's bench.log: "exit 0", "SIGSEGV
    (exit 139)" (a signal ended its process), or "no exit status" (the call ended first)."""
    ended: dict[str, str] = {}
    name = None
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        if m := re.fullmatch(r"== (\w+): -?\d+ s of -?\d+ s left", line):
            name = m[1]
            ended[name] = "no exit status: the call ended first"
        elif name and (m := re.fullmatch(r"rc=(\d+) after \d+ s", line)):
            rc = int(m[1])
            try:
                ended[name] = f"{signal.Signals(rc - 128).name} (exit {rc})" if rc > 128 else f"exit {rc}"
            except ValueError:
                ended[name] = f"exit {rc}"
    return ended


def _lease_settings(path: Path) -> dict[str, str]:
    """The settings gpu_lease.sh wrote into a call's machine.txt (NAME=VALUE lines, the value shell-quoted)."""
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    return dict(shlex.split(line)[0].split("=", 1) for line in lines
                if re.match(r"(LEASE_S|SECTIONS|BENCH_ARGS)=", line))


def _task_costs(sections: dict, on_cuda: bool) -> dict[str, dict]:
    """Per-task figures for flctl.cost.reference_cost (the dry run's price of a task with no finished runs on this
    kind of device): a cell of E epochs takes s_per_cell + E x s_per_epoch seconds, from the tasks timed one cell
    at a time on the default engine (the first epoch's extra, data loading to capture, is the start-up; one
    evaluation every PAPER_EVAL_EVERY epochs is spread over the epochs). The two-moons sweeps are left out: they
    time many cells sharing a device, not one."""
    def figures(timed: list[dict]) -> dict | None:
        timed = [t for t in timed if t.get("epoch_s") and t.get("first_epoch_s")]
        if not timed:
            return None
        epoch = statistics.median(t["epoch_s"] + (t.get("eval_s") or 0.0) / PAPER_EVAL_EVERY for t in timed)
        start = statistics.median(max(0.0, t["first_epoch_s"] - t["epoch_s"]) for t in timed)
        return {"s_per_cell": round(start, 3), "s_per_epoch": round(epoch, 4), "from": len(timed)}

    engine = default_engine(on_cuda)
    cif = sections.get("cifar", {}).get("runs", {})
    found = {"cifar10": figures([v for k, v in cif.items() if k.startswith(f"{engine}/auto/")]),
             "utkface": figures(list(sections.get("utkface", {}).get("methods", {}).values()))}
    return {task: f for task, f in found.items() if f}


def default_engines(on_cuda: bool) -> str:
    """On a GPU the default engine (captured) and its compiled form; eager was measured (3.1x slower on an H100)."""
    return "captured,compiled-captured" if on_cuda else "eager,compiled"     # captured replays CUDA graphs


def collect(args) -> None:
    """Merge the section files of calls of gpu_lease.sh (each DIR: one call's results folder, named by its folder)
    into RESULTS/gpu-<date>-<device>.json, and copy every file of each call beside it, into
    RESULTS/gpu-<date>-<device>/<call>/. Where calls ran one section, the measured file wins over one stopped
    partway, and that over one not measured; among equals, the later call's."""
    calls: dict[str, Path] = {}
    for folder in args.dirs:
        if folder.name in calls:
            raise SystemExit(f"collect: two folders are named {folder.name!r}: a call is named by its folder")
        calls[folder.name] = folder
    if any("=" not in a for a in args.bench_args):
        raise SystemExit("collect: --bench-args takes CALL=ARGS (CALL: a folder's name)")
    given = dict(a.split("=", 1) for a in args.bench_args)
    if set(given) - set(calls):
        raise SystemExit(f"collect: --bench-args names {', '.join(sorted(set(given) - set(calls)))}, "
                         f"not one of the folders ({', '.join(calls)})")

    def rank(data: dict) -> int:          # (cifar's not_measured is a list of its configurations, not a flag)
        return 0 if data.get("not_measured") is True else 1 if data.get("partial") else 2

    sections: dict[str, dict] = {}
    source: dict[str, str] = {}                  # section -> the call its file came from
    per_call: dict[str, dict[str, dict]] = {}
    for call, folder in calls.items():
        for f in sorted(folder.glob("*.json")):
            if f.stem not in SECTIONS:
                continue
            data = per_call.setdefault(call, {})[f.stem] = json.loads(f.read_text())
            if f.stem not in sections or rank(data) >= rank(sections[f.stem]):
                sections[f.stem], source[f.stem] = data, call
    if not sections:
        raise SystemExit(f"collect: no section files (*.json) in {', '.join(str(d) for d in args.dirs)}")
    envs = [d["env"] for d in sections.values()]
    if len({e["device"] for e in envs}) > 1:
        raise SystemExit(f"collect: the folders come from different devices: {sorted({e['device'] for e in envs})}")
    env = envs[0]
    on_cuda = env["device"] != "cpu"

    cif = sections.get("cifar", {}).get("runs", {})
    engines = {}
    for engine in ("eager", "captured", "compiled"):
        erm, fl = cif.get(f"{engine}/auto/erm", {}), cif.get(f"{engine}/auto/fl", {})
        engines[engine] = {"erm_s_per_epoch": erm.get("epoch_s"), "fl_s_per_epoch": fl.get("epoch_s"),
                           "minutes_200_epochs": {"erm": erm.get("minutes_200_epochs"),
                                                  "fl": fl.get("minutes_200_epochs")}}
        errors = {k.partition("/")[2]: v["error"] for k, v in cif.items() if k.startswith(f"{engine}/") and "error" in v}
        if errors:
            engines[engine]["errors"] = errors
    # Which engine a section's dead process was training: the one its file names as running, else (a lease from
    # before that marker) every engine the call's arguments asked for that its files have no figure of.
    calls_out: dict[str, dict] = {}
    for call, folder in calls.items():
        bench_args = given.get(call, _lease_settings(folder / "machine.txt").get("BENCH_ARGS"))
        ended = _lease_log(folder / "bench.log")
        calls_out[call] = {"bench_args": bench_args, "sections": ended}
        for section, how in ended.items():
            if how == "exit 0" or section not in ("cifar", "profile"):
                continue
            own = per_call.get(call, {}).get(section, {})
            if own.get("running"):
                suspects = [own["running"].split("/")[0]]
            elif bench_args is not None:
                parsed, _ = parser().parse_known_args([section, *shlex.split(bench_args)])
                figures = own.get("runs", own)
                suspects = [e for e in (parsed.engines or default_engines(on_cuda)).split(",")
                            if not any(k.split("/")[0] == e and isinstance(v, dict) and ("epoch_s" in v or
                                       "wall_ms_per_step" in v) for k, v in figures.items())]
            else:
                suspects = []
            for e in suspects:
                if e in engines:
                    engines[e].setdefault("crashed", []).append(f"{call}/{section}: {how}")

    # FL's step speed against ERM's (ERM's s/epoch over FL's: 1 is as fast), on the engine a run gets by default
    default = engines[default_engine(on_cuda)]
    fl_erm = (default["erm_s_per_epoch"] / default["fl_s_per_epoch"]) if default["erm_s_per_epoch"] and \
        default["fl_s_per_epoch"] else None
    share_ = sections.get("share", {})
    moon = sections.get("moons", {})
    utk = sections.get("utkface", {}).get("methods", {})
    dpo_ = sections.get("dpo", {})
    suite_ = sections.get("suite", {})
    junit = calls[source["suite"]] / "junit.xml" if "suite" in source else None
    together = _together(share_)
    sweeps = [(f"share/{way}/{k}", row) for way, rows in together.items() for k, row in rows.items()] \
        + [(f"moons/{k}", row) for k, row in moon.items() if isinstance(row, dict) and "ledger" in row]
    moons_done = {k: row["seconds"] for k, row in moon.items() if isinstance(row, dict) and _completed(row)}
    if args.commit:
        commit = {**given_commit(args.commit), "commit_from": "collect --commit"}
        in_files = sorted({e.get("commit") or "none" for e in envs})
        if in_files != [commit["commit"]]:
            commit["commit_in_raw_files"] = in_files
    else:
        commit = {k: env.get(k) for k in ("commit", "dirty", "commit_from")}
    date = args.date or env.get("date") or datetime.datetime.now(datetime.UTC).date().isoformat()
    result = {
        "device": env["device"], "torch": env["torch"], "cuda": env["cuda"], **commit, "date": date,
        "suite": {**{k: suite_.get(k) for k in ("passed", "failed", "skipped", "errors", "failures", "command")},
                  "failures_by_message": count_errors(((f"{c}::{n}", m) for c, n, m in failed_tests(junit)),
                                                      "example_test") if junit and junit.exists() else None},
        "diagnose": {k: v for k, v in sections["diagnose"].items() if k != "env"} if "diagnose" in sections else None,
        "cifar10": {**engines, "default_engine": default_engine(on_cuda), "fl_erm_speed": fl_erm,
                    "fp32": {k: v.get("epoch_s") for k, v in cif.items() if "/fp32/" in k}},
        # images/s of K CIFAR-10 cells on one GPU, by way of training them together (share)
        "together": {way: {k: v.get("images_per_s") for k, v in rows.items()} for way, rows in together.items()},
        "mps": share_.get("mps"),
        # the whole grid's seconds only where every cell completed (cells/s below: completed cells per second)
        "two_moons_1000_cells_s": min(moons_done.values()) if moons_done else None,
        "two_moons_fastest_way": min(moons_done, key=lambda k: moons_done[k]) if moons_done else None,
        "two_moons_cells_per_s": {k: row.get("cells_per_s") for k, row in moon.items()
                                  if isinstance(row, dict) and "ledger" in row},
        # sweeps with failed cells: the ledger, and the cells' errors counted by error (None: not brought back)
        "sweep_failures": {name: {"ledger": row.get("ledger"), "errors": row.get("errors")} for name, row in sweeps
                           if row.get("ledger", {}).get("failed")},
        "utkface_s_per_epoch": {k: v.get("epoch_s") for k, v in utk.items()},
        "dpo": {"pairs_per_s": dpo_.get("pairs_per_s"), "peak_gb": dpo_.get("peak_mem_gb"),
                "params": dpo_.get("params"), "max_length": dpo_.get("max_length")},
        "profile": {k: v for k, v in sections["profile"].items() if k != "env"} if "profile" in sections else None,
        "programme_hours": _programme(sections, on_cuda),
        # what a lease's end left unmeasured: whole sections, CIFAR configurations, sweeps
        "not_measured": sorted([k for k, v in sections.items() if v.get("not_measured") is True]
                               + [f"{k} (stopped partway)" for k, v in sections.items() if v.get("partial")]
                               + [f"cifar/{k}" for k in sections.get("cifar", {}).get("not_measured", [])]
                               + [name for name, row in sweeps if row.get("not_measured")]),
        # how each section's process ended, per call (bench.log), and the arguments the call gave bench_gpu.py
        "calls": calls_out,
    }
    slug = re.sub(r"[^a-z0-9]+", "-", env["device"].lower()).strip("-")
    slug = "h100" if "h100" in slug else "h200" if "h200" in slug else slug
    dest = args.results / f"gpu-{date}-{slug}"
    result["raw"] = {k: f"{dest.name}/{source[k]}/{k}.json" for k in sorted(sections)}
    if dest.exists():                 # this collect's own copy, from an earlier run of it
        shutil.rmtree(dest)
    for call, folder in calls.items():          # the raw outputs beside the summary
        (dest / call).mkdir(parents=True)
        for f in sorted(folder.iterdir()):
            if f.is_file():
                shutil.copyfile(f, dest / call / f.name)
    dest.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {dest.with_suffix('.json')} and {dest}/")
    costs = _task_costs(sections, on_cuda)
    if costs:              # what the dry run prices these tasks with on a device of this kind (flctl.cost)
        kind = "cuda" if on_cuda else "cpu"
        path = args.results / f"task-costs-{date}-{kind}.json"
        path.write_text(json.dumps({"device": kind, "gpu": env["device"], "date": date, **commit,
                                    "engine": default_engine(on_cuda), "eval_every": PAPER_EVAL_EVERY,
                                    "tasks": costs, "from": f"{dest.name}.json"}, indent=1) + "\n")
        print(f"wrote {path}")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sections", nargs="+", help=f"{', '.join(SECTIONS)}; or collect DIR...; or commit")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, default=Path("gpu-bench"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/flctl-gpu-bench"))
    ap.add_argument("--small", action="store_true", help="tiny sizes: checks this script, measures nothing")
    ap.add_argument("--engines", help=f"default: {default_engines(True)} on CUDA; {default_engines(False)} "
                    "elsewhere (captured replays CUDA graphs)")
    ap.add_argument("--precisions", default="auto", help="auto (bf16 autocast on CUDA, the default), fp32")
    ap.add_argument("--epochs", type=int, default=4, help="epochs timed per configuration (the first is warm-up)")
    ap.add_argument("--timeout", type=float, default=240, help="seconds allowed to one subprocess")
    ap.add_argument("--budget-s", type=float, help="seconds for all the sections (a lease's device time): a "
                    "configuration or sweep not started with --min-left-s left is named as not measured")
    ap.add_argument("--min-left-s", type=float, default=30)
    ap.add_argument("--workers", type=int, default=8, help="suite: pytest-xdist processes")
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results", help="collect: where it writes")
    ap.add_argument("--commit", help="collect: the project's commit the calls measured (sha, or sha-dirty), where "
                    "their files do not name it right")
    ap.add_argument("--date", help="collect: the day the calls ran (YYYY-MM-DD), where their files do not say")
    ap.add_argument("--bench-args", action="append", default=[], metavar="CALL=ARGS",
                    help="collect: the arguments a call gave bench_gpu.py (its BENCH_ARGS), where its machine.txt "
                    "does not say; CALL is the call's folder name")
    ap.add_argument("--pytest-args", nargs=argparse.REMAINDER, default=[])
    return ap


def main(argv: list[str] | None = None) -> None:
    ap = parser()
    args = ap.parse_args(argv)
    args.deadline = None if args.budget_s is None else time.monotonic() + args.budget_s
    args.engines = args.engines or default_engines(cuda(args.device))
    if args.sections[0] == "collect":
        args.dirs = [Path(s) for s in args.sections[1:]]
        collect(args)
        return
    if args.sections == ["commit"]:
        print(json.dumps(project_commit()))
        return
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        ap.error(f"unknown section(s) {', '.join(sorted(unknown))}; choose from {', '.join(SECTIONS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    env = {"device": torch.cuda.get_device_name() if cuda(args.device) else "cpu", "torch": torch.__version__,
           "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(), **project_commit(),
           "date": datetime.datetime.now(datetime.UTC).date().isoformat(), "small": args.small}
    for name in args.sections:
        t0 = time.perf_counter()

        def partial(out: dict, name: str = name) -> None:
            """What the section measured so far, in its file: a process killed at a lease's end keeps it."""
            (args.out / f"{name}.json").write_text(json.dumps({"env": env, "ok": False, "partial": True, **out},
                                                              indent=1, default=str))
        args.partial = partial
        if left(args) < args.min_left_s:
            print(f"== {name} not measured: {left(args):.0f} s of the budget left", flush=True)
            (args.out / f"{name}.json").write_text(json.dumps({"env": env, "ok": False, "not_measured": True}))
            continue
        try:
            result = {"ok": True, **SECTIONS[name](args)}
        except Exception as exc:   # one broken section must not cost the others' numbers
            import traceback

            traceback.print_exc()
            result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        result["section_s"] = time.perf_counter() - t0
        (args.out / f"{name}.json").write_text(json.dumps({"env": env, **result}, indent=1, default=str))
        print(f"== {name} done in {result['section_s']:.0f} s (ok={result['ok']})", flush=True)


if __name__ == "__main__":
    main()
