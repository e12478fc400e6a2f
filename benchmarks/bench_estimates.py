"""How close a dry run's cost comes to the time the work then takes: a series of steps on the CPU tasks (five of them),
of several sizes, epoch counts and subsets, each planned (its `cost: about X (expected within L to H)` line read as a
person reads it) and then run with `--wait` in one results folder, so that each estimate is fitted to what the earlier
steps left, as a researcher's first week goes (a task's first sweep from the committed benchmark,
benchmarks/results/task-costs-*-cpu.json). Besides sweeps: `flctl paper --scale smoke` for one table or figure after
larger runs of its task, and a resume (a sweep stopped by SIGINT part-way, planned and run again: priced from the
epochs its cells have left). Prints each ratio took / estimate, how many fall within 1.5x and inside the printed
interval (its coverage), the worst ratio and the widest interval; writes benchmarks/results/estimates-<date>-cpu.json
and the printed lines beside it (.txt).

    python benchmarks/bench_estimates.py        # ~10 min on 2 cores
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
# Each task first from the committed benchmark, then fitted to the steps before it: other epochs, seeds, subsets.
# "paper ..." plans and runs `flctl paper`; "resume ..." starts the sweep, stops it with SIGINT once it has trained
# a while, then plans and runs it again.
STEPS = [
    "two-moons -m fl --seeds 2 --epochs 50",
    "two-moons -m erm,fl --seeds 3 --epochs 150",
    "two-moons -m fl --lr 1e-3,1e-2 --seeds 2 --epochs 400",
    "two-moons -m fl --seeds 4 --epochs 300 --subset 250",
    "paper --scale smoke --only figure:3",
    "resume two-moons -m erm,fl --seeds 2 --epochs 4000",
    # The paper's CPU table (table:1-fashion-mnist: 21 cells, --subset 5000, 60 epochs) at a few epochs: its first
    # sweep priced from the full-data benchmark scaled to the subset, the second fitted to the first; then the
    # table's smoke scale after them (smaller cells than any in the history)
    "fashion-mnist -m erm,fl --subset 5000 --epochs 3",
    "fashion-mnist -m fl --eps 0.3,0.51 --subset 5000 --epochs 6",
    "paper --scale smoke --only table:1-fashion-mnist",
    "digits -m fl --seeds 2 --epochs 3",
    "digits -m erm,fl --seeds 2 --epochs 8",
    "digits -m fl --seeds 3 --epochs 10 --subset 400",
    "diabetes -m erm,fl --seeds 2 --epochs 100",
    "diabetes -m rfl --alpha 0.1,1 --seeds 2 --epochs 300",
    "polyfit -m fl,erm --seeds 3",
    "polyfit -m fl,erm --seeds 6",
    "paper --scale smoke --only figure:1",
]
UNITS = {"s": 1.0, "min": 60.0, "cpu-hours": 3600.0}
COST = re.compile(r"(?:cost: |cell\(s\) to do, )about (.+?) \(expected within (.+?) to (.+?)\)(?:: (.*))?")


def seconds(text: str) -> float:
    """A cost as flctl.cost.format_cost writes it (``0.4 s``, ``3.7 min``, ``1.4 cpu-hours``), in seconds."""
    number, unit = text.replace(",", "").split(" ", 1)
    return float(number.lstrip("<")) * UNITS[unit.strip()]


def flctl(*args: str, folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flctl", *args, "--results-dir", str(folder)], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "COLUMNS": "400"})


def stop_part_way(words: list[str], folder: Path, after_s: float = 6.0) -> None:
    """Start the sweep and stop it with SIGINT after ``after_s`` seconds of training: its cells go back to the queue
    at their checkpoints, to resume."""
    proc = subprocess.Popen([sys.executable, "-m", "flctl", *words, "--wait", "--results-dir", str(folder)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT, start_new_session=True)
    time.sleep(after_s + 8.0)                # its start-up (interpreter, imports, launch) then training
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=120)


def step(line: str, folder: Path, executor: str) -> dict:
    """Plan ``line`` (its dry run's cost read), then run it and time it."""
    words = line.split()
    if words[0] == "resume":
        words = [*words[1:], "--executor", executor]
        stop_part_way(["sweep", *words], folder)
        words = ["sweep", *words]
    elif words[0] == "paper":
        words = [*words, "--executor", executor]
    else:
        words = ["sweep", *words, "--executor", executor]
    plan = flctl(*words, "--dry-run", folder=folder)
    said = COST.search(plan.stdout.replace("\n", " ") if words[0] == "sweep" else plan.stdout)
    if plan.returncode != 0 or said is None:
        print(f"{line}: no estimate ({(plan.stdout + plan.stderr).strip().splitlines()[-1:]})", flush=True)
        return {"step": line, "estimate_s": None}
    estimate, low, high = (seconds(said.group(i)) for i in (1, 2, 3))
    start = time.perf_counter()
    done = flctl(*words, *(["--wait"] if words[0] == "sweep" else []), folder=folder)
    took = time.perf_counter() - start
    ratio = took / estimate if estimate else None
    row = {"step": line, "estimate_s": estimate, "low_s": low, "high_s": high, "took_s": round(took, 2),
           "ratio": None if ratio is None else round(ratio, 3), "rc": done.returncode, "how": said.group(4) or ""}
    print(f"{line}: estimate {estimate:.1f} s ({low:.1f}-{high:.1f}), took {took:.1f} s, ratio "
          f"{'-' if ratio is None else f'{ratio:.2f}'} [{row['how'][:220]}]", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--steps", type=int, default=len(STEPS), help="the first N of the series (a quick check)")
    parser.add_argument("--executor", default="local", help="how the sweeps launch (debug: in one process, a check)")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        rows = [step(line, Path(tmp) / "results", args.executor) for line in STEPS[:args.steps]]
    timed = [r for r in rows if r.get("ratio")]
    ratios = [r["ratio"] for r in timed]
    within = sum(1 / 1.5 <= r <= 1.5 for r in ratios)
    inside = sum(r["low_s"] <= r["took_s"] <= r["high_s"] for r in timed)
    worst = max(timed, key=lambda r: max(r["ratio"], 1 / r["ratio"]), default=None)
    widest = max((r["high_s"] / r["low_s"] for r in timed if r["low_s"]), default=None)
    summary = (f"within 1.5x: {within} of {len(rows)}; inside the printed interval: {inside} of {len(rows)}; median "
               f"ratio took/estimate {statistics.median(ratios):.2f}; worst {worst['ratio']:.2f} ({worst['step']}); "
               f"widest interval {widest:.2f}x end to end; load average {load:.1f} at the start, "
               f"{os.getloadavg()[0]:.1f} at the end") if worst else "no estimate to compare"
    print(summary)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    out = {"device": "cpu", "cores": len(os.sched_getaffinity(0)), "date": str(datetime.date.today()),
           "commit": commit.stdout.strip() or None, "within_1_5x": within, "within_interval": inside,
           "steps": len(rows), "median_ratio": statistics.median(ratios) if ratios else None,
           "worst_ratio": worst["ratio"] if worst else None, "widest_interval": widest,
           "load_start": load, "load_end": os.getloadavg()[0], "rows": rows}
    path = args.out / f"estimates-{datetime.date.today()}-cpu.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    lines = [f"{r['step']}: estimate {r['estimate_s']} s ({r.get('low_s')}-{r.get('high_s')}), took {r.get('took_s')} s, "
             f"ratio {r.get('ratio')} [{r.get('how', '')}]" for r in rows]
    path.with_suffix(".txt").write_text("\n".join([*lines, summary]) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
