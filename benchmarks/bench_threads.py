"""What `flctl run`'s thread choice is worth on a CPU: one two-moons run with the default (auto: one thread for a
model this small, flctl.knobs.cpu_threads) against `--threads <cores>` (torch's own default, what a run used before),
each on a quiet machine and beside a busy neighbour (a process spinning on one core, as a laptop's other work does).
Alternated, medians of --repeats; OMP_NUM_THREADS is unset for the runs (it would rule instead). Writes
benchmarks/results/threads-<date>-cpu.json.

    python benchmarks/bench_threads.py --repeats 3        # ~3 min on 2 cores
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _spin(stop) -> None:
    while not stop.is_set():
        pass


def _run(threads: str | None, folder: Path, epochs: int | None) -> float:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    cmd = [sys.executable, "-m", "flctl", "run", "two-moons", "--method", "fl", "--results-dir", str(folder)]
    cmd += [] if epochs is None else ["--epochs", str(epochs)]
    start = time.perf_counter()
    subprocess.run(cmd + ([] if threads is None else ["--threads", threads]), check=True, capture_output=True,
                   env=env, cwd=ROOT)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=None, help="instead of the paper's 250 (a smoke run)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--loads", default="quiet,busy", help="quiet, busy or both (a smoke run: quiet only, so it "
                        "spins no core beside the test suite)")
    args = parser.parse_args()
    cores = str(len(os.sched_getaffinity(0)))
    ways = {"auto": None, f"--threads {cores}": cores}
    times: dict[str, dict[str, list[float]]] = {load: {w: [] for w in ways} for load in args.loads.split(",")}
    for load in times:
        stop = multiprocessing.Event()
        neighbour = multiprocessing.Process(target=_spin, args=(stop,)) if load == "busy" else None
        if neighbour is not None:
            neighbour.start()
        try:
            for round_ in range(args.repeats):
                for way, threads in ways.items():
                    with tempfile.TemporaryDirectory() as tmp:
                        times[load][way].append(round(_run(threads, Path(tmp), args.epochs), 2))
                    print(f"{load} round {round_ + 1}: {way}: {times[load][way][-1]} s", flush=True)
        finally:
            if neighbour is not None:
                stop.set()
                neighbour.join()
    medians = {load: {w: statistics.median(v) for w, v in ways_.items()} for load, ways_ in times.items()}
    out = {"command": "flctl run two-moons --method fl", "cores": int(cores), "repeats": args.repeats,
           "median_s": medians, "raw_s": times,
           "ratio_forced_over_auto": {load: round(m[f"--threads {cores}"] / m["auto"], 2) for load, m in medians.items()}}
    for load, m in medians.items():
        print(f"{load}: auto {m['auto']:.2f} s, --threads {cores} {m[f'--threads {cores}']:.2f} s: "
              f"{out['ratio_forced_over_auto'][load]}x (medians of {args.repeats})")
    path = args.out / f"threads-{datetime.date.today()}-cpu.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
