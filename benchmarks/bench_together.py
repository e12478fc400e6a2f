"""K cells of one task in one process: which way of training them together is faster, measured side by side.

For each task, K cells (mixed methods and seeds) train E epochs three ways, through the real ``train_together``:

- alone: one ``train`` call per cell, one after the other (what K=1 workers do);
- interleaved: one ``train_together`` call, cells stepping in turn (every task with a model);
- grouped: one ``train_together`` call with one grouped model for all cells (flctl.grouped; on the CPU for
  ``Task.batched`` tasks, on CUDA for every groupable model).

Rounds alternate the ways, so drift of the machine hits all alike; printed are the median wall seconds over rounds
and each way's ratio to alone. The ``batched`` flag of a task (grouped or interleaved on the CPU) is chosen from these numbers.
Writes benchmarks/results/together-<date>-<device>.json (or under --out; the printed table as .txt beside it).

    python benchmarks/bench_together.py                          # two-moons, digits, cifar10 (fake, narrow)
    python benchmarks/bench_together.py --device cuda --tasks cifar10 --k 1,2,4,8
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import flctl.train as train_mod  # noqa: E402
from flctl.tasks import get_task  # noqa: E402
from tests.data_writers import write_cifar10  # noqa: E402
from tests.helpers import config  # noqa: E402

METHODS = ("erm", "fl", "rfl", "cserm")


def cells(task: str, k: int, epochs: int, device: str, data_dir: str | None) -> list:
    extra = dict(options={"width": 8}, batch_size=32) if task == "cifar10" else {}
    return [config(task, METHODS[i % 4], seed=i, epochs=epochs, eval_every=epochs, device=device,
                   data_dir=data_dir, **extra) for i in range(k)]


def timed(fn) -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def measure(task: str, k: int, epochs: int, rounds: int, device: str, data_dir: str | None) -> dict:
    original = get_task(task)
    cfgs = cells(task, k, epochs, device, data_dir)
    ways = {"alone": None, "interleaved": dataclasses.replace(original, batched=False)}
    if original.build_model is not None:
        ways["grouped"] = dataclasses.replace(original, batched=True)
    times: dict[str, list[float]] = {w: [] for w in ways}
    for r in range(rounds):
        order = list(ways)[r % len(ways):] + list(ways)[:r % len(ways)]
        for way in order:
            with tempfile.TemporaryDirectory() as tmp:
                root = Path(tmp)
                if way == "alone":
                    times[way].append(timed(lambda: [train_mod.train(c, root / "rec", root / c.run_id) for c in cfgs]))
                    continue
                train_mod.get_task = lambda name, t=ways[way]: t          # this way's path for the task
                try:
                    times[way].append(timed(lambda: train_mod.train_together(
                        cfgs, root / "rec", [root / c.run_id for c in cfgs])))
                finally:
                    train_mod.get_task = get_task
    med = {w: statistics.median(v) for w, v in times.items()}
    return {"task": task, "k": k, "epochs": epochs, "rounds": rounds, "median_s": med,
            "ratio_to_alone": {w: med["alone"] / med[w] for w in med}, "raw_s": times}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default="two-moons,digits,cifar10")
    p.add_argument("--k", default="4")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="folder of the results files")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    epochs = {"two-moons": 20, "digits": 3, "cifar10": 2, "diabetes": 20}
    rows = []
    with tempfile.TemporaryDirectory() as data:
        cifar = str(write_cifar10(Path(data), per_batch=100))
        for task in args.tasks.split(","):
            for k in (int(v) for v in args.k.split(",")):
                row = measure(task, k, epochs.get(task, 2), args.rounds, args.device,
                              cifar if task == "cifar10" else None)
                rows.append(row)
                print(f"{task:10s} K={k}: " + ", ".join(
                    f"{w} {row['median_s'][w]:.2f} s ({row['ratio_to_alone'][w]:.2f}x)" for w in row["median_s"]),
                    flush=True)
    device = torch.cuda.get_device_name().replace(" ", "-") if args.device.startswith("cuda") else "cpu"
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"together-{datetime.date.today()}-{device.lower()}.json"
    meta = {"device": device, "torch": torch.__version__, "threads": args.threads,
            "command": "python benchmarks/bench_together.py " + " ".join(sys.argv[1:])}
    out.write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    out.with_suffix(".txt").write_text("\n".join(
        f"{r['task']} K={r['k']} epochs={r['epochs']} rounds={r['rounds']}: " + ", ".join(
            f"{w} {r['median_s'][w]:.2f} s ({r['ratio_to_alone'][w]:.2f}x alone)" for w in r["median_s"])
        for r in rows) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
