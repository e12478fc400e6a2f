"""How close `flctl sweep --dry-run`'s cost comes to the time the sweep then takes: a series of sweeps of the CPU
tasks, of several sizes, epoch counts and subsets, each planned (its `cost: about X (expected within L to H)` line
read as a person reads it) and then run with `--wait` in one results folder, so that each estimate is fitted to what
the earlier sweeps left, as a researcher's first week goes (the first sweep of a task from the committed benchmark,
benchmarks/results/task-costs-*-cpu.json). Prints each ratio took / estimate and how many fall within 1.5x and
within the printed interval; writes benchmarks/results/estimates-<date>-cpu.json.

    python benchmarks/bench_estimates.py        # ~9 min on 2 cores
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
# Each task first from the committed benchmark, then fitted to the sweeps before it: other epochs, seeds, subsets.
SWEEPS = [
    "two-moons -m fl --seeds 2 --epochs 50",
    "two-moons -m erm,fl --seeds 3 --epochs 150",
    "two-moons -m fl --lr 1e-3,1e-2 --seeds 2 --epochs 400",
    "two-moons -m fl --seeds 4 --epochs 300 --subset 250",
    "digits -m fl --seeds 2 --epochs 3",
    "digits -m erm,fl --seeds 2 --epochs 8",
    "digits -m fl --seeds 3 --epochs 10 --subset 400",
    "diabetes -m erm,fl --seeds 2 --epochs 100",
    "diabetes -m rfl --alpha 0.1,1 --seeds 2 --epochs 300",
    "polyfit -m fl,erm --seeds 3",
    # The paper's CPU table (table:1-fashion-mnist: 21 cells, --subset 5000, 60 epochs) at a few epochs: its first
    # sweep priced from the full-data benchmark scaled to the subset, the second fitted to the first.
    "fashion-mnist -m erm,fl --subset 5000 --epochs 3",
    "fashion-mnist -m fl --eps 0.3,0.51 --subset 5000 --epochs 6",
]
UNITS = {"s": 1.0, "min": 60.0, "cpu-hours": 3600.0}


def seconds(text: str) -> float:
    """A cost as flctl.cost.format_cost writes it (``0.4 s``, ``3.7 min``, ``1.4 cpu-hours``), in seconds."""
    number, unit = text.replace(",", "").split(" ", 1)
    return float(number.lstrip("<")) * UNITS[unit.strip()]


def flctl(*args: str, folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flctl", *args, "--results-dir", str(folder)], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "COLUMNS": "400"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--sweeps", type=int, default=len(SWEEPS), help="the first N of the series (a quick check)")
    parser.add_argument("--executor", default="local", help="how the sweeps launch (debug: in one process, a check)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "results"
        for line in SWEEPS[:args.sweeps]:
            words = [*line.split(), "--executor", args.executor]
            plan = flctl("sweep", *words, "--dry-run", folder=folder)
            said = re.search(r"cost: about (.+?) \(expected within (.+?) to (.+?)\): (.*)", plan.stdout)
            if plan.returncode != 0 or said is None:
                print(f"{line}: no estimate ({(plan.stdout + plan.stderr).strip().splitlines()[-1:]})", flush=True)
                rows.append({"sweep": line, "estimate_s": None})
                continue
            estimate, low, high = (seconds(said.group(i)) for i in (1, 2, 3))
            start = time.perf_counter()
            done = flctl("sweep", *words, "--wait", folder=folder)
            took = time.perf_counter() - start
            ratio = took / estimate if estimate else None
            rows.append({"sweep": line, "estimate_s": estimate, "low_s": low, "high_s": high, "took_s": round(took, 2),
                         "ratio": None if ratio is None else round(ratio, 3), "rc": done.returncode,
                         "how": said.group(4)})
            print(f"{line}: estimate {estimate:.1f} s ({low:.1f}-{high:.1f}), took {took:.1f} s, ratio "
                  f"{'-' if ratio is None else f'{ratio:.2f}'} [{said.group(4)[:200]}]", flush=True)
    ratios = [r["ratio"] for r in rows if r.get("ratio")]
    within = sum(1 / 1.5 <= r <= 1.5 for r in ratios)
    inside = sum(r["low_s"] <= r["took_s"] <= r["high_s"] for r in rows if r.get("ratio"))
    print(f"within 1.5x: {within} of {len(rows)}; within the printed interval: {inside} of {len(rows)}; median "
          f"ratio took/estimate {statistics.median(ratios):.2f}" if ratios else "no estimate to compare")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    out = {"device": "cpu", "cores": len(os.sched_getaffinity(0)), "date": str(datetime.date.today()),
           "commit": commit.stdout.strip() or None, "within_1_5x": within, "within_interval": inside,
           "sweeps": len(rows), "median_ratio": statistics.median(ratios) if ratios else None, "rows": rows}
    path = args.out / f"estimates-{datetime.date.today()}-cpu.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
