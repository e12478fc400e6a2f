"""How fast a sweep fills on one machine, and what one run costs beyond its optimizer steps.

Three measurements, printed side by side:

1. grid: the 25-cell two-moons grid (`-m fl --lr 1e-4..1e-2:5 --dual-lr 1e-3..1e-1:5`, paper defaults otherwise)
   filled (a) by 25 `flctl run` processes one after the other and (b) by one `flctl sweep --wait` with the default
   local executor and worker count. Prints both wall times, their ratio (target b >= 10x faster on 2 cores), and
   the peak number of live worker processes (the waiting `flctl sweep` process included: it is one of the workers)
   and their peak summed resident memory during (b) (sampled from /proc).
2. process: one `flctl run two-moons --method fl` process vs `benchmarks/plain_two_moons.py` (the same training as
   a plain torch script), alternated, median of --repeats each; target ratio <= 1.3.
3. loop: a two-moons FL run's epochs loop inside one process (through its runner, with a real SQLite database,
   records, checkpoints and heartbeats): the share of its wall time spent outside the optimizer steps (the
   cell_step calls, timed in the same run) and the part of it that is after-epoch bookkeeping (records,
   checkpoints, per-epoch numbers: _end_epoch minus its evals), target <= 10 %; and how much longer the whole
   loop takes than the plain script's loop doing the same steps and evals.

4. small: a sweep of small cells against one of them: the 100-cell two-moons grid (`-m fl --lr 1e-4..1e-2:10
   --dual-lr 1e-3..1:10`) through one `flctl sweep --wait` against one `flctl run two-moons --method fl`, each in a
   fresh results folder, alternated, medians of --repeats; target: the grid within 4x the one cell. With --before REV
   the same commands of commit REV (a worktree of it, its flctl on PYTHONPATH) are timed in the same rounds. Writes
   benchmarks/results/sweep-small-<date>-cpu.json.

    python benchmarks/bench_sweep.py                       # grid, process, loop: ~5 min on 2 cores
    python benchmarks/bench_sweep.py process loop --repeats 5
    python benchmarks/bench_sweep.py small --repeats 3 --before 4402814     # ~8 min on 2 cores
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLCTL = [sys.executable, "-m", "flctl"]
LRS = ["0.0001", "0.000316228", "0.001", "0.00316228", "0.01"]
DUAL_LRS = ["0.001", "0.00316228", "0.01", "0.0316228", "0.1"]


def _proc_table(folder: Path) -> dict[int, int]:
    """pid -> resident bytes of live submitit job processes whose job folder is under ``folder``."""
    found = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            if "submitit.core._submit" not in cmd or str(folder) not in cmd:   # job processes, not controllers
                continue
            found[int(proc.name)] = int((proc / "statm").read_text().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
    return found


def grid() -> dict:
    from flctl.layout import Layout

    with tempfile.TemporaryDirectory() as tmp:
        a_dir, b_dir = Path(tmp) / "a", Path(tmp) / "b"
        start = time.perf_counter()
        for lr in LRS:
            for dual in DUAL_LRS:
                subprocess.run([*FLCTL, "run", "two-moons", "-m", "fl", "--lr", lr, "--dual-lr", dual,
                                "--results-dir", str(a_dir)], check=True, capture_output=True)
        sequential = time.perf_counter() - start

        peak = {"procs": 0, "rss": 0}
        done = threading.Event()

        def sample(sweep_pid: int) -> None:
            page = os.sysconf("SC_PAGE_SIZE")
            while not done.is_set():
                table = _proc_table(Layout(b_dir).jobs)
                try:   # with --wait the sweep process is one of the workers
                    table[sweep_pid] = int(Path(f"/proc/{sweep_pid}/statm").read_text().split()[1]) * page
                except (OSError, IndexError):
                    pass
                peak["procs"] = max(peak["procs"], len(table))
                peak["rss"] = max(peak["rss"], sum(table.values()))
                done.wait(0.25)

        start = time.perf_counter()
        sweep = subprocess.Popen([*FLCTL, "sweep", "two-moons", "-m", "fl", "--lr", "1e-4..1e-2:5", "--dual-lr",
                                  "1e-3..1e-1:5", "--wait", "--results-dir", str(b_dir)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        sampler = threading.Thread(target=sample, args=(sweep.pid,), daemon=True)
        sampler.start()
        if sweep.wait() != 0:
            raise RuntimeError("flctl sweep failed")
        swept = time.perf_counter() - start
        done.set()
        sampler.join()
    return {"sequential_runs_s": round(sequential, 1), "sweep_wait_s": round(swept, 1),
            "speedup": round(sequential / swept, 1), "peak_live_workers": peak["procs"],
            "peak_worker_rss_mb": round(peak["rss"] / 2**20)}


SMALL_GRID = ["two-moons", "-m", "fl", "--lr", "1e-4..1e-2:10", "--dual-lr", "1e-3..1:10"]


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


@contextlib.contextmanager
def trees(before: str | None, folder: Path):
    """{"now": this checkout} and, with ``before``, {"before": a worktree of that commit in ``folder``}, removed on
    leaving: the trees whose flctl a benchmark times side by side (its flctl on PYTHONPATH, run from the tree)."""
    found = {"now": ROOT}
    if before:
        found["before"] = folder / "before"
        _git("worktree", "add", "--detach", str(found["before"]), before)
    try:
        yield found
    finally:
        if before:
            _git("worktree", "remove", "--force", str(found["before"]))


def small(repeats: int, before: str | None) -> dict:
    """One `flctl run` and the 100-cell grid through `flctl sweep --wait`, per tree (this checkout; commit
    ``before``), alternated round by round so that the machine's drift hits all alike."""
    with tempfile.TemporaryDirectory() as tmp, trees(before, Path(tmp)) as checkouts:
        times: dict[str, dict[str, list[float]]] = {t: {"run_s": [], "sweep_s": []} for t in checkouts}
        for r in range(repeats):
            for name, tree in checkouts.items():
                env = {**os.environ, "PYTHONPATH": str(tree)}
                env.pop("FLCTL_DB", None)
                for what, args in (("run_s", ["run", "two-moons", "--method", "fl"]),
                                   ("sweep_s", ["sweep", *SMALL_GRID, "--wait"])):
                    results = Path(tmp) / f"{name}-{what}-{r}"
                    start = time.perf_counter()
                    subprocess.run([*FLCTL, *args, "--results-dir", str(results)], check=True, cwd=tree,
                                   env=env, capture_output=True)
                    times[name][what].append(round(time.perf_counter() - start, 2))
                    shutil.rmtree(results)
                print(f"round {r + 1}: {name}: run {times[name]['run_s'][-1]} s, sweep of 100 "
                      f"{times[name]['sweep_s'][-1]} s", flush=True)
    out: dict = {"grid": "flctl sweep " + " ".join(SMALL_GRID) + " --wait", "cell": "flctl run two-moons --method fl",
                 "cells": 100, "repeats": repeats}
    for name, t in times.items():
        run, sweep = statistics.median(t["run_s"]), statistics.median(t["sweep_s"])
        out[name] = {"commit": _git("describe", "--always", "--dirty", "--abbrev=7") if name == "now" else before,
                     "run_s": run, "sweep_s": sweep, "ratio": round(sweep / run, 2), "raw": t}
    return out


def process(repeats: int) -> dict:
    flctl_s, plain_s = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            start = time.perf_counter()
            subprocess.run([*FLCTL, "run", "two-moons", "--method", "fl", "--seed", str(i),
                            "--results-dir", str(Path(tmp) / str(i))], check=True, capture_output=True)
            flctl_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            subprocess.run([sys.executable, str(ROOT / "benchmarks" / "plain_two_moons.py"), "--seed", str(i)],
                           check=True, capture_output=True)
            plain_s.append(time.perf_counter() - start)
    f, p = statistics.median(flctl_s), statistics.median(plain_s)
    return {"flctl_run_s": round(f, 2), "plain_torch_s": round(p, 2), "ratio": round(f / p, 2),
            "flctl_all_s": [round(v, 2) for v in flctl_s], "plain_all_s": [round(v, 2) for v in plain_s]}


def loop(repeats: int) -> dict:
    """flctl's epochs loop (first epoch's start to last epoch's end, through the runner with a real SQLite
    database) vs the plain script's loop over the same training, alternated in this process."""
    import torch

    from benchmarks.plain_two_moons import train as plain_train
    from flctl.db import Store
    from flctl.layout import Layout
    from flctl.runner import execute
    from tests.helpers import config

    torch.set_num_threads(1)
    ratios, outside, bookkeeping, flctl_s, plain_s = [], [], [], [], []
    plain_train(99)                                          # warm-up of both paths
    for i in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            store = Store.open(f"sqlite:///{tmp}/flctl.db")
            marks: list[float] = []
            starts: list[float] = []
            import flctl.stepper as stepper_mod
            import flctl.train as train_mod

            real_order = stepper_mod.epoch_order

            def first_order(*a, **k):
                if not starts:
                    starts.append(time.perf_counter())     # the loop starts with the first epoch's order
                return real_order(*a, **k)

            # the step as the loop calls it (flctl.step.cell_step, bound by flctl.stepper.Stepper when the run starts)
            home = {"cell_step": stepper_mod, "_end_epoch": train_mod, "evaluate": train_mod}
            real = {name: getattr(module, name) for name, module in home.items()}
            spent = dict.fromkeys(real, 0.0)

            def timed(name):
                def call(*a, **k):
                    start = time.perf_counter()
                    try:
                        return real[name](*a, **k)
                    finally:
                        spent[name] += time.perf_counter() - start
                return call

            stepper_mod.epoch_order = first_order
            for name in real:
                setattr(home[name], name, timed(name))
            try:
                execute(config("two-moons", "fl", seed=i), store, Layout(Path(tmp)), checkpoint_every=60.0,
                        on_epoch=lambda stats: marks.append(time.perf_counter()))
            finally:
                stepper_mod.epoch_order = real_order
                for name, fn in real.items():
                    setattr(home[name], name, fn)
            store.close()
        flctl_s.append(marks[-1] - starts[0])
        outside.append(1 - spent["cell_step"] / flctl_s[-1])
        # after-epoch bookkeeping (per-epoch numbers, records, checkpoints, progress) without the evals themselves
        bookkeeping.append((spent["_end_epoch"] - spent["evaluate"]) / flctl_s[-1])
        plain_s.append(plain_train(i)[0])
        ratios.append(flctl_s[-1] / plain_s[-1] - 1)
    return {"outside_share": round(statistics.median(outside), 3),
            "bookkeeping_share": round(statistics.median(bookkeeping), 3), "vs_plain": round(statistics.median(ratios), 3),
            "flctl_loop_s": round(statistics.median(flctl_s), 3), "plain_loop_s": round(statistics.median(plain_s), 3),
            "all_outside": [round(r, 3) for r in outside], "all_vs_plain": [round(r, 3) for r in ratios]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sections", nargs="*", help="grid, process, loop (default: all three), small")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--before", metavar="REV", help="small: also time commit REV's flctl, in the same rounds")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="small: where it writes")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    args.sections = args.sections or ["grid", "process", "loop"]
    if not set(args.sections) <= {"grid", "process", "loop", "small"}:
        ap.error(f"unknown section(s) {args.sections}; choose from grid, process, loop, small")
    sys.path.insert(0, str(ROOT))
    out: dict = {"cores": len(os.sched_getaffinity(0))}
    if "grid" in args.sections:
        out["grid"] = grid()
        g = out["grid"]
        print(f"grid of 25: {g['sequential_runs_s']} s as 25 `flctl run` vs {g['sweep_wait_s']} s as `flctl sweep "
              f"--wait`: {g['speedup']}x (target >= 10x); peak {g['peak_live_workers']} live workers, "
              f"{g['peak_worker_rss_mb']} MB resident together", flush=True)
    if "process" in args.sections:
        out["process"] = p = process(args.repeats)
        print(f"one process: flctl run {p['flctl_run_s']} s vs plain torch {p['plain_torch_s']} s (medians of "
              f"{args.repeats}): ratio {p['ratio']} (target <= 1.3)", flush=True)
    if "loop" in args.sections:
        out["loop"] = lp = loop(args.repeats)
        print(f"training loop: {100 * lp['outside_share']:.1f} % of its wall time outside the optimizer steps (epoch "
              f"orders, batch gathers, evals, records, checkpoints, heartbeats; target <= 10 %), of which "
              f"{100 * lp['bookkeeping_share']:.1f} % after-epoch bookkeeping (records, checkpoints, per-epoch numbers); "
              f"the whole loop "
              f"{lp['flctl_loop_s']} s vs the same training in plain torch {lp['plain_loop_s']} s: "
              f"{100 * lp['vs_plain']:.1f} % more (medians of {args.repeats})")
    if "small" in args.sections:
        out["small"] = sm = small(args.repeats, args.before)
        for name in ("before", "now"):
            if name in sm:
                print(f"{name} ({sm[name]['commit']}): 100-cell grid {sm[name]['sweep_s']} s vs one cell "
                      f"{sm[name]['run_s']} s: {sm[name]['ratio']}x (target <= 4x; medians of {args.repeats})")
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"sweep-small-{datetime.date.today().isoformat()}-cpu.json"
        path.write_text(json.dumps({"cores": out["cores"], **sm}, indent=1) + "\n")
        print(f"wrote {path}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
