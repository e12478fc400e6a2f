"""What logging a run live costs (flctl.loggers): one two-moons FL run on the CPU at the paper's 250 epochs with no
logger, with TensorBoard, with MLflow (a local SQLite store) and with W&B (offline), side by side in this process,
alternated, medians of --repeats. Each logger's one-time cost in a process (importing its tool, a first run's set-up)
is paid by a warm-up run before the timed rounds and said apart; each logger's runs share one results folder (one
MLflow store, made once), as a sweep's do. Writes benchmarks/results/loggers-<date>-cpu.json.

    python benchmarks/bench_loggers.py --repeats 5        # ~4 min on 2 cores
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
WAYS = {"none": (), "tensorboard": ("tensorboard",), "mlflow": ("mlflow",), "wandb": ("wandb",)}


def _run(log_to: tuple[str, ...], folder: Path, seed: int, epochs: int | None) -> float:
    from flctl import api

    fields = {} if epochs is None else {"epochs": epochs}
    start = time.perf_counter()
    run = api.run("two-moons", "fl", results_dir=folder, seed=seed, threads=1, log_to=log_to, **fields)
    assert run.status == "completed", run.status
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=None, help="instead of the paper's 250 (a smoke run)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    os.environ.pop("MLFLOW_TRACKING_URI", None)                 # MLflow: a SQLite store in each results folder
    os.environ |= {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    times: dict[str, list[float]] = {w: [] for w in WAYS}
    first: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for way, log_to in WAYS.items():                        # warm-up: imports and first set-up, said apart
            first[way] = round(_run(log_to, Path(tmp) / way, 10_000, args.epochs), 2)
            print(f"warm-up {way}: {first[way]} s", flush=True)
        for round_ in range(args.repeats):
            for way, log_to in WAYS.items():
                times[way].append(round(_run(log_to, Path(tmp) / way, round_, args.epochs), 3))
                print(f"round {round_ + 1}: {way}: {times[way][-1]} s", flush=True)
    medians = {w: statistics.median(v) for w, v in times.items()}
    ratios = {w: round(medians[w] / medians["none"], 3) for w in WAYS if w != "none"}
    out = {"command": "api.run('two-moons', 'fl', threads=1, log_to=...)", "epochs": args.epochs or 250,
           "cores": len(os.sched_getaffinity(0)), "repeats": args.repeats, "date": str(datetime.date.today()),
           "median_s": medians, "raw_s": times, "ratio_over_none": ratios, "warm_up_s": first,
           "target": "tensorboard and mlflow (local SQLite) at most 1.03x"}
    for way, ratio in ratios.items():
        print(f"{way}: {medians[way]:.3f} s against {medians['none']:.3f} s with none: {ratio}x "
              f"(medians of {args.repeats})")
    path = args.out / f"loggers-{datetime.date.today()}-cpu.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
