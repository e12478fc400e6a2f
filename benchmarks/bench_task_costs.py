"""What one cell of each task costs on this machine, for the cost estimates of `flctl sweep --dry-run` and
`flctl paper --dry-run` where the database has no finished run of a task to fit (flctl.sweep.reference_cost reads
the newest file this writes).

Each task whose data is here trains through `flctl run TASK` (its paper defaults, a fresh results folder) at two
epoch counts, alternated, --repeats times. The run's own duration (what its database row records: what flctl.cost
fits to on a user's machine) gives seconds = a cell's start-up + epochs x per-epoch, fitted to the medians; the rest of
the command's wall time is the process's start-up (interpreter, imports, database), ``s_per_start``, which a sweep
waits for once (its workers start side by side) and no run's duration holds. Of a cell's start-up, what only a
worker's first cell pays (``s_per_process``: a solver's import, data read once per process) is measured apart, by one
worker training a few one-epoch cells one at a time. A task whose data is not here (exit 2)
is left out and named. Writes benchmarks/results/task-costs-<date>-<device>.json.

    python benchmarks/bench_task_costs.py --repeats 1      # ~4 min on 2 cores
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
EPOCHS = (1, 11)      # ten epochs apart: the slope stands above the noise of a start-up
# A cell's own start-up at a tenth of the data too: what of it grows with the samples (its evaluations, the data
# moved to the model) against what does not (the data read, the model built), so a --subset cell is priced at its size.
SUBSET = 10


def _seconds(task: str, epochs: int, device: str, subset: int = 0) -> tuple[float, float, float | None] | None:
    """The seconds of one `flctl run` (None where it does not run here), the run's recorded duration, and the samples
    each of its epochs trained on (its recorded samples seen over its epochs: what flctl.cost scales a --subset cell's
    epochs by)."""
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "flctl", "run", task, "--epochs", str(epochs), "--device", device,
                               "--subset", str(subset), "--results-dir", tmp], capture_output=True, text=True, cwd=ROOT)
        took = time.perf_counter() - start
        if done.returncode != 0:
            if done.returncode != 2:      # 2: its data is not here; anything else is said
                print(f"{task}: `flctl run` exited {done.returncode}: {(done.stderr.strip().splitlines() or [''])[-1]}",
                      flush=True)
            return None
        with sqlite3.connect(Path(tmp) / "flctl.db") as db:      # the run's row, read as any SQLite reader would
            [(metrics, duration)] = db.execute("SELECT metrics, duration_s FROM runs").fetchall()
        db.close()
    seen = json.loads(metrics or "{}").get("train.samples_seen")
    return took, duration, (seen / epochs if seen else None)


def _first_cell_extra(task: str, device: str, cells: int = 4) -> float | None:
    """What a worker's first cell pays that its next ones do not (a solver's import, data read once per process):
    one worker trains ``cells`` one-epoch cells of the task one at a time (`flctl sweep --batch-runs 1`, the debug
    launcher: in one process); the first one's recorded duration over the median of the others'. None where the
    sweep does not run here."""
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([sys.executable, "-m", "flctl", "sweep", task, "--seeds", str(cells), "--epochs", "1",
                               "--batch-runs", "1", "--executor", "debug", "--device", device, "--wait",
                               "--results-dir", tmp], capture_output=True, text=True, cwd=ROOT)
        if done.returncode != 0:
            return None
        with sqlite3.connect(Path(tmp) / "flctl.db") as db:
            durations = [d for (d,) in db.execute("SELECT duration_s FROM runs ORDER BY started_at").fetchall()]
        db.close()
    if len(durations) < 2:
        return None
    return max(0.0, durations[0] - statistics.median(durations[1:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tasks", default=None, help="comma-separated (default: every task)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    listed = json.loads(subprocess.run([sys.executable, "-m", "flctl", "tasks", "--json"], capture_output=True,
                                       text=True, check=True, cwd=ROOT).stdout)
    tasks = args.tasks.split(",") if args.tasks else [t["name"] for t in listed]
    found: dict[str, dict] = {}
    left_out: list[str] = []
    for task in tasks:
        times: dict[int, list[float]] = {e: [] for e in EPOCHS}
        inside: dict[int, list[float]] = {e: [] for e in EPOCHS}
        n_train = None
        for _ in range(args.repeats):
            for epochs in EPOCHS:
                measured = _seconds(task, epochs, args.device)
                if measured is None:
                    break
                times[epochs].append(measured[0])
                inside[epochs].append(measured[1])
                n_train = measured[2] or n_train
        if not all(times.values()):
            left_out.append(task)
            print(f"{task}: left out (it does not run here: its data is missing)", flush=True)
            continue
        (e1, t1), (e2, t2) = ((e, statistics.median(v)) for e, v in inside.items())
        per_epoch = max(0.0, (t2 - t1) / (e2 - e1))
        start = statistics.median(w - d for e in EPOCHS for w, d in zip(times[e], inside[e]))
        cell = max(0.0, t1 - e1 * per_epoch)
        fixed, tenth = cell, None         # a task of under 10 x SUBSET samples: its start-up all fixed
        if n_train and n_train >= 10 * SUBSET:
            small = [m for _ in range(args.repeats)
                     if (m := _seconds(task, e1, args.device, int(n_train) // SUBSET)) is not None]
            if small:
                tenth = statistics.median(m[1] for m in small) - e1 * per_epoch * (int(n_train) // SUBSET) / n_train
                # cell = fixed + grows; tenth = fixed + grows / SUBSET
                grows = max(0.0, (cell - tenth) / (1 - 1 / SUBSET))
                fixed = max(0.0, cell - grows)
        # of a cell's fixed start-up, what only a worker's first cell pays: once a sweep, as workers start side by side
        extras = [x for _ in range(args.repeats) if (x := _first_cell_extra(task, args.device)) is not None]
        process = min(fixed, statistics.median(extras)) if extras else 0.0
        fixed -= process
        found[task] = {"s_per_start": round(max(0.0, start), 3), "s_per_process": round(process, 3),
                       "s_per_cell": round(fixed, 3),
                       "s_per_cell_full_data": round(cell - fixed, 3),
                       "s_per_epoch": round(per_epoch, 4), "n_train": n_train,
                       "seconds": {str(e): [round(x, 2) for x in v] for e, v in times.items()},
                       "run_duration_s": {str(e): [round(x, 3) for x in v] for e, v in inside.items()}}
        print(f"{task}: {found[task]['s_per_start']} s to start the process + {found[task]['s_per_process']} s more for "
              f"a worker's first cell + {found[task]['s_per_cell']} s a cell + "
              f"{found[task]['s_per_cell_full_data']} s a cell at the full data's size + {found[task]['s_per_epoch']} s "
              "an epoch", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    out = {"device": args.device, "cores": len(os.sched_getaffinity(0)), "date": str(datetime.date.today()),
           "commit": commit.stdout.strip() or None, "repeats": args.repeats, "epochs": list(EPOCHS),
           "tasks": found, "left_out": left_out}
    path = args.out / f"task-costs-{datetime.date.today()}-{args.device}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
