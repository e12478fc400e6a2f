"""A worker's pace as its sweep grows: cells a second of one local worker on a 2,000-cell and on a 40,000-cell sweep of
1-epoch two-moons cells (`--lr 1e-4..1:N/4 --seed 0,1,2,3 --epochs 1`), grouped (the task's default, up to 16 cells a claim on a CPU)
and one cell a claim (`--batch-runs 1 --threads 1`), through the CLI as a researcher runs it.

Each measurement plans both sweeps with `flctl sweep ... --workers 1` (one background worker each, the local executor),
waits until the first cells of each are done (the worker's start-up and first claims are not the pace), then counts
the cells each completed in its database over the same --seconds, and cancels both: the two workers train at the same
time, so a shared machine's load hits both alike (measured one after the other, minutes apart, the same code gave
0.43x and 1.8x). The target (issue 68): the pace at 40,000
cells at least 0.9x the pace at 2,000, grouped and one a claim. With --before REV the same is measured with commit
REV's flctl (a worktree of it on PYTHONPATH) in the same rounds, alternated, so the machine's drift hits both alike.
Writes benchmarks/results/pace-<date>-cpu.{json,txt}.

    python benchmarks/bench_pace.py                         # ~6 min on 2 cores
    python benchmarks/bench_pace.py --before c4e18af~1 --repeats 1
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sweep import ROOT, _git, trees  # noqa: E402  (a sibling script, not a package)

FLCTL = [sys.executable, "-m", "flctl"]
MODES = {"grouped": [], "one a claim": ["--batch-runs", "1", "--threads", "1"]}


def completed(db: Path) -> int:
    """Cells completed so far, read without a lock the worker waits for (SQLite's read-only mode reads the -wal)."""
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as conn:
            return conn.execute("SELECT count(*) FROM runs WHERE status = 'completed'").fetchone()[0]
    except sqlite3.Error:
        return 0


def plan(tree: Path, cells: int, mode: list[str], folder: Path) -> tuple[dict, float]:
    """Plan the sweep with one background worker: its environment and the seconds the launch took."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("FLCTL_DB", None)
    # four seeds: an axis holds at most 10,000 points
    args = [*FLCTL, "sweep", "two-moons", "--lr", f"1e-4..1:{cells // 4}", "--seed", "0,1,2,3", "--epochs", "1",
            "--workers", "1", "--yes", "--executor", "local", *mode, "--results-dir", str(folder)]
    start = time.perf_counter()
    subprocess.run(args, check=True, cwd=tree, env=env, capture_output=True)
    return env, time.perf_counter() - start


def paces(tree: Path, sizes: list[int], mode: list[str], folder: Path, warmup: int, seconds: float) -> dict:
    """The sweeps of ``sizes`` planned, each with one worker, trained at the same time (so the machine's load, on a
    shared machine, hits them alike), counted over the same ``seconds`` once each has ``warmup`` cells done;
    cancelled after. Cells a second and planning seconds by size."""
    folders = {n: folder / str(n) for n in sizes}
    planned = {n: plan(tree, n, mode, folders[n]) for n in sizes}
    try:
        start = time.perf_counter()
        while min(completed(f / "flctl.db") for f in folders.values()) < warmup:
            if time.perf_counter() - start > 600:
                raise RuntimeError(f"no {warmup} cells done in 10 minutes: {folder}")
            time.sleep(0.2)
        first = {n: completed(f / "flctl.db") for n, f in folders.items()}
        t0 = time.perf_counter()
        time.sleep(seconds)
        done = {n: completed(f / "flctl.db") for n, f in folders.items()}
        elapsed = time.perf_counter() - t0
    finally:
        for n, f in folders.items():
            sid = next((f / "jobs").iterdir()).name
            subprocess.run([*FLCTL, "cancel", sid, "--results-dir", str(f)], cwd=tree, env=planned[n][0],
                           capture_output=True)
    return {n: {"plan_s": round(planned[n][1], 2), "cells_per_s": round((done[n] - first[n]) / elapsed, 2)}
            for n in sizes}


def at_least(low: float, kind=int):
    """An argparse type: a number of ``kind`` no smaller than ``low`` (a bad one is argparse's one line, exit 2)."""
    def parse(text: str):
        value = kind(text)
        if not value >= low:
            raise argparse.ArgumentTypeError(f"must be at least {low:g}, got {text}")
        return value
    return parse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=at_least(4), nargs=2, default=[2000, 40000], metavar=("SMALL", "LARGE"))
    ap.add_argument("--repeats", type=at_least(1), default=1)
    ap.add_argument("--seconds", type=at_least(0.1, float), default=60.0, help="how long the pace is counted")
    ap.add_argument("--warmup", type=at_least(1), default=40, help="cells done before the count starts")
    ap.add_argument("--before", metavar="REV", help="also time commit REV's flctl, in the same rounds")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    a = ap.parse_args()
    raw: dict[str, dict[str, dict[str, list[float]]]] = {}
    with tempfile.TemporaryDirectory() as tmp, trees(a.before, Path(tmp)) as checkouts:
        for r in range(a.repeats):
            for mode, flags in MODES.items():
                for name, tree in checkouts.items():
                    folder = Path(tmp) / f"{name}-{r}"
                    for cells, got in paces(tree, a.sizes, flags, folder, a.warmup, a.seconds).items():
                        raw.setdefault(name, {}).setdefault(mode, {}).setdefault(str(cells), []).append(
                            got["cells_per_s"])
                        raw[name][mode].setdefault(f"plan_s_{cells}", []).append(got["plan_s"])
                        print(f"round {r + 1}: {name}: {mode}: {cells} cells: {got['cells_per_s']} cells/s "
                              f"(planned in {got['plan_s']} s)", flush=True)
                    shutil.rmtree(folder, ignore_errors=True)
    small, large = (str(n) for n in a.sizes)
    out: dict = {"date": datetime.date.today().isoformat(), "cores": os.cpu_count(), "sizes": a.sizes,
                 "seconds": a.seconds, "warmup_cells": a.warmup, "repeats": a.repeats, "results": {}}
    lines = [f"A worker's pace (cells/s, median of {a.repeats}), 1-epoch two-moons, {small} vs {large} cells; "
             "target: the large at least 0.9x the small"]
    for name, modes in raw.items():
        commit = _git("describe", "--always", "--dirty", "--abbrev=7") if name == "now" else a.before
        for mode, got in modes.items():
            p_small, p_large = statistics.median(got[small]), statistics.median(got[large])
            ratio = round(p_large / p_small, 2) if p_small else None
            out["results"].setdefault(name, {"commit": commit})[mode] = {
                "small": p_small, "large": p_large, "ratio": ratio, "raw": got}
            lines.append(f"{name} ({commit}) {mode}: {p_small} -> {p_large} cells/s, {ratio}x "
                         f"(planning {statistics.median(got['plan_s_' + small])} s -> "
                         f"{statistics.median(got['plan_s_' + large])} s)")
    print("\n".join(lines))
    a.out.mkdir(parents=True, exist_ok=True)
    stem = a.out / f"pace-{out['date']}-cpu"
    stem.with_suffix(".json").write_text(json.dumps(out, indent=2) + "\n")
    stem.with_suffix(".txt").write_text("\n".join(lines) + "\n")
    print(f"wrote {stem}.json and .txt")


if __name__ == "__main__":
    main()
