"""Report speed at scale: a table and a CDF over 1,000 runs x 50,000 per-sample records each.

Writes synthetic runs (database rows + Parquet records in flctl's real layout) once under --dir, then times, in
one process, `flctl report --table main` with a records-computed tail column (test.cvar@0.9) and
`flctl report --plot cdf`. Prints the median of --repeat timings. Target: each <= 10 s on 2 cores.

    python benchmarks/bench_reports.py                       # 1000 runs x 50k samples (~3 GB of Parquet)
    python benchmarks/bench_reports.py --runs 100 --samples 5000
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from flctl.config import RunConfig
from flctl.db import RunQueue, Store
from flctl.db.urls import file_url
from flctl.layout import Layout
from flctl.records import writes

METHODS = ("erm", "fl", "rfl", "cserm")


def synthesize(root: Path, n_runs: int, n_samples: int) -> Store:
    """n_runs finished runs (methods x eps x seeds), each with one final epoch of records: 80 % train, 20 % test."""
    layout = Layout(root)
    fresh = not layout.db.exists()
    store = Store.open(file_url(layout.db))
    if not fresh:
        return store
    rng = np.random.default_rng(0)
    n_train = int(n_samples * 0.8)
    configs = []
    for i in range(n_runs):
        method = METHODS[i % 4]
        configs.append(RunConfig(task="synthetic", method=method, seed=i // 4, eps=None if method == "erm" else
                                 (0.1, 0.5)[(i // 4) % 2], alpha=1.0 if method in ("rfl", "cserm") else None,
                                 dual_lr=1e-2 if method in ("fl", "rfl") else None, epochs=1))
    store.add_runs(configs)
    t0 = time.perf_counter()
    for k, cfg in enumerate(configs):
        tables = []
        for split, n in (("train", n_train), ("test", n_samples - n_train)):
            loss = rng.exponential(0.3, n)
            target = rng.integers(0, 10, n).astype(np.float64)
            pred = np.where(rng.random(n) < 0.9, target, rng.integers(0, 10, n))
            lam = rng.exponential(0.1, n) if split == "train" and cfg.method in ("fl", "rfl") else None
            tables.append(writes.split_table(cfg.run_id, split, 1, loss, pred, target, pred == target, lam))
        path = writes.write_epoch(layout.records, cfg.run_id, 1, tables)
        tr, te = tables[0]["loss"].to_numpy(), tables[1]["loss"].to_numpy()
        token = RunQueue(store).claim_run(cfg.run_id)
        assert token is not None        # a new run, queued and claimed by this process alone
        RunQueue(store).finish_run(cfg.run_id, token, status="completed", epochs_done=1, duration_s=1.0, diverged_at=None,
                         lambda_capped=0, artifacts={"records": str(path.parent)},
                         metrics={"train.avg_loss": float(tr.mean()), "train.max_loss": float(tr.max()),
                                  "test.avg_loss": float(te.mean()), "test.max_loss": float(te.max()),
                                  "train.accuracy": 0.9, "test.accuracy": 0.9})
        if k % 100 == 99:
            print(f"  wrote {k + 1} runs ({time.perf_counter() - t0:.0f} s)", flush=True)
    return store


def timed(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--samples", type=int, default=50_000)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/flctl-bench-reports"))
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    root = args.dir / f"{args.runs}x{args.samples}"
    root.mkdir(parents=True, exist_ok=True)
    store = synthesize(root, args.runs, args.samples)

    from flctl.report.data import select_runs
    from flctl.report.plots import plot
    from flctl.report.tables import build, record_values, render

    runs = select_runs(store)
    cols = ["train.avg_loss", "train.max_loss", "test.avg_loss", "test.max_loss", "test.cvar@0.9"]

    def table() -> str:
        fresh = select_runs(store)
        return render(build("main", fresh, cols, record_values(fresh, root / "records", cols)), "markdown")

    t_table, text = timed(table, args.repeat)
    t_cdf, paths = timed(lambda: plot("cdf", runs, root / "records", root / "reports" / "cdf"), args.repeat)
    print(f"{len(runs)} runs x {args.samples} samples ({args.repeat} repeats, median):")
    print(f"  table main + test.cvar@0.9 : {t_table:6.2f} s   (target <= 10 s)")
    print(f"  plot cdf (PNG + PDF)        : {t_cdf:6.2f} s   (target <= 10 s)")
    print(text.splitlines()[4])


if __name__ == "__main__":
    main()
