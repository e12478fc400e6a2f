"""`flctl paper` at the paper's size: the plan over every spec and the bundle over the whole programme.

Writes, once under --dir, a finished run (database row + final Parquet records in flctl's real layout, --samples
per run: 80 % train, 20 % test) for every cell of the paper-scale programme (950), plus runs of more seeds outside it
until the database holds --runs runs (fewer: only that many of the programme's cells); then times, in one process, `flctl paper --dry-run` (planning all specs against that
database) and the bundle (`flctl paper --report-only`: every table and figure, PNG + PDF, index.html, paper.json).
Prints the medians of --repeat timings and writes them to benchmarks/results/paper-<date>-cpu.json (--out).
Targets on 2 cores: dry run <= 3 s, bundle <= 60 s.

    python benchmarks/bench_paper.py                            # 2,000 runs x 50,000 samples (~6 GB of Parquet)
    python benchmarks/bench_paper.py --runs 50 --samples 500 --out /tmp/x   # a smoke run

The synthetic runs carry no extras (two-moons probability grids, polyfit curves, UTKFace images): figures 1, 3 and 4
say so in place of their drawing, which makes them cheaper than real ones; every table, CDF/CVaR figure and heatmap
is drawn from the records and metrics as for real runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from flctl.db import RunQueue, Store
from flctl.db.urls import file_url
from flctl.layout import Layout
from flctl.paper.plan import plan_programme
from flctl.paper.programme import ITEMS
from flctl.records import writes

ROOT = Path(__file__).resolve().parents[1]


def synthesize(root: Path, n_runs: int, n_samples: int) -> int:
    layout = Layout(root)
    if layout.db.exists():
        store = Store.open(file_url(layout.db), readonly=True)
        n = store.count_runs()
        store.close()
        return n
    programme = plan_programme(ROOT / "sweeps", ITEMS, scale="paper", device=None, data_dir=None, runs=[],
                               check_data=False)
    configs = {c.run_id: c for sp in programme.specs.values() for c in sp.configs}
    configs = dict(list(configs.items())[:n_runs])    # a smoke run: part of the programme
    extra_seed = 5
    while len(configs) < n_runs:      # more seeds of the programme's cells: in the database, not in the bundle
        for c in list(configs.values()):
            if len(configs) >= n_runs:
                break
            more = dataclasses.replace(c, seed=c.seed + extra_seed)
            configs.setdefault(more.run_id, more)
        extra_seed += 5
    store = Store.open(file_url(layout.db))
    store.add_runs(configs.values())
    rng = np.random.default_rng(0)
    n_train = int(n_samples * 0.8)
    t0 = time.perf_counter()
    for k, cfg in enumerate(configs.values()):
        tables, metrics = [], {}
        for split, n in (("train", n_train), ("test", n_samples - n_train)):
            loss = rng.exponential(0.3, n)
            target = rng.integers(0, 10, n).astype(np.float64)
            pred = np.where(rng.random(n) < 0.9, target, rng.integers(0, 10, n))
            lam = rng.exponential(0.1, n) if split == "train" and cfg.method in ("fl", "rfl") else None
            tables.append(writes.split_table(cfg.run_id, split, cfg.epochs, loss, pred, target, pred == target, lam))
            metrics |= {f"{split}.avg_loss": float(loss.mean()), f"{split}.max_loss": float(loss.max()),
                        f"{split}.accuracy": float((pred == target).mean())}
        path = writes.write_epoch(layout.records, cfg.run_id, cfg.epochs, tables)
        token = RunQueue(store).claim_run(cfg.run_id)
        assert token is not None
        RunQueue(store).finish_run(cfg.run_id, token, status="completed", epochs_done=cfg.epochs, duration_s=cfg.epochs * 4.0,
                         diverged_at=None, lambda_capped=0, artifacts={"records": str(path.parent)}, metrics=metrics)
        if k % 200 == 199:
            print(f"  wrote {k + 1} of {len(configs)} runs ({time.perf_counter() - t0:.0f} s)", flush=True)
    store.close()
    return len(configs)


def timed(command: list[str], repeat: int) -> float:
    """Median wall time of the command in a fresh process (as a user runs it: imports included)."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "200"})
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--samples", type=int, default=50_000)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/flctl-bench-paper"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    root = args.dir / f"{args.runs}x{args.samples}"
    root.mkdir(parents=True, exist_ok=True)
    n = synthesize(root, args.runs, args.samples)
    flctl = [sys.executable, "-m", "flctl", "paper", "--results-dir", str(root)]
    dry = timed([*flctl, "--dry-run"], args.repeat)
    bundle = timed([*flctl, "--report-only", "--out", str(root / "bundle")], args.repeat)
    result = {"runs": n, "samples": args.samples, "repeat": args.repeat, "cores": os.cpu_count(),
              "dry_run_s": round(dry, 2), "bundle_s": round(bundle, 2), "targets_s": {"dry_run": 3, "bundle": 60}}
    print(f"{n} runs x {args.samples} samples ({args.repeat} repeats, median, fresh process each):")
    print(f"  flctl paper --dry-run      : {dry:6.2f} s   (target <= 3 s)")
    print(f"  flctl paper --report-only  : {bundle:6.2f} s   (target <= 60 s)")
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"paper-{datetime.date.today().isoformat()}-cpu.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
