"""The paper's open directions, measured on CPU tasks: does pruning satisfied samples pay, and does nuPI overshoot
less than gradient ascent?

pruning: each task x method x seed trains twice at the paper's defaults, unpruned and with --prune-after
(interleaved, so drift of the machine hits both alike), through the real ``flctl.train.train``. Printed: the
median ratios pruned/unpruned of ``train.samples_seen`` and wall time, and the median change of test accuracy and
test max loss (pruned minus unpruned).

nupi: two-moons FL at ε = 0.1, gd against nupi for a few kp (ki = 1, nu = 0), records every epoch. Overshoot is
read off the train records after the first epoch at which the violation rate is at most ``--feasible`` (5 %):
how far the violation rate and the mean loss then fall below what ε asks for (the lowest violation rate, and the
mean loss's largest margin below ε as a share of ε), with the final violation rate and max loss.

Run from the repository root with the project's virtualenv::

    python benchmarks/bench_open_directions.py                       # both, 3 seeds: ~6 min on 2 cores
    python benchmarks/bench_open_directions.py pruning --seeds 1
    python benchmarks/bench_open_directions.py nupi --kp 1,5,20

The figure of the same comparison comes from a recorded sweep: `flctl sweep --spec sweeps/two-moons-nupi.toml`,
then `flctl report --plot dynamics --sweep two-moons-nupi`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flctl import records  # noqa: E402
from flctl.config import resolve  # noqa: E402
from flctl.tasks import get_task  # noqa: E402
from flctl.train import train  # noqa: E402

PRUNE_AFTER = {"two-moons": 50, "digits": 5}      # a fifth of the paper's epochs (250, 30)


def config(task: str, method: str, **overrides):
    return resolve(get_task(task), method, overrides)


def pruning(seeds: int, work: Path) -> None:
    print("pruning: pruned / unpruned at the paper's defaults (median over seeds)")
    print(f"{'task':10} {'method':6} {'after':>5} {'samples_seen':>12} {'wall':>6} {'Δ test acc':>10} "
          f"{'Δ test max':>10} {'pruned share':>12}")
    for task in ("two-moons", "digits"):
        for method in ("fl", "rfl"):
            seen, wall, acc, worst, share = [], [], [], [], []
            for seed in range(seeds):
                out = {}
                for after in (0, PRUNE_AFTER[task]):
                    cfg = config(task, method, seed=seed, prune_after=after)
                    start = time.perf_counter()
                    result = train(cfg, work / "records", work / "runs" / cfg.run_id)
                    out[after] = (result.metrics, time.perf_counter() - start)
                (base, t0), (pruned, t1) = out[0], out[PRUNE_AFTER[task]]
                seen.append(pruned["train.samples_seen"] / base["train.samples_seen"])
                wall.append(t1 / t0)
                acc.append(pruned["test.accuracy"] - base["test.accuracy"])
                worst.append(pruned["test.max_loss"] - base["test.max_loss"])
                share.append(pruned["train.pruned_share"])
            med = statistics.median
            print(f"{task:10} {method:6} {PRUNE_AFTER[task]:>5} {med(seen):>12.3f} {med(wall):>6.3f} "
                  f"{med(acc):>+10.4f} {med(worst):>+10.4f} {med(share):>12.3f}")


def overshoot(cfg, work: Path, feasible: float) -> dict[str, float | None]:
    eps = float(cfg.eps)
    table = records.read(work / "records", [cfg.run_id], split="train")
    epochs = np.asarray(table["epoch"].to_numpy())
    loss = np.asarray(table["loss"].to_numpy())
    per_epoch = sorted(set(epochs.tolist()))
    rate = np.array([np.mean(loss[epochs == e] > eps) for e in per_epoch])
    mean = np.array([loss[epochs == e].mean() for e in per_epoch])
    reached = np.flatnonzero(rate <= feasible)
    after = slice(int(reached[0]), None) if len(reached) else slice(len(per_epoch), None)
    return {"feasible at epoch": float(per_epoch[after.start]) if len(reached) else None,
            "min viol. rate after": float(rate[after].min()) if len(reached) else None,
            "(ε - mean loss)/ε max": float((eps - mean[after]).max() / eps) if len(reached) else None,
            "final viol. rate": float(rate[-1]), "final max loss": float(loss[epochs == per_epoch[-1]].max())}


def nupi(kps: list[float], seeds: int, feasible: float, work: Path, epochs: int | None = None) -> None:
    print(f"\nnupi: two-moons FL, eps 0.1, records every epoch; overshoot after the violation rate first reaches "
          f"<= {feasible:.0%} (median over seeds)")
    rows = [("gd", {"dual_optimizer": "gd"})] + [(f"nupi kp={kp:g}", {"dual_optimizer": "nupi", "kp": kp})
                                                 for kp in kps]
    header = None
    for label, extra in rows:
        stats = []
        for seed in range(seeds):
            cfg = config("two-moons", "fl", seed=seed, eval_every=1, **extra,
                         **({"epochs": epochs} if epochs is not None else {}))
            train(cfg, work / "records", work / "runs" / cfg.run_id)
            stats.append(overshoot(cfg, work, feasible))
        if header is None:
            header = list(stats[0])
            print(f"{'':14}" + "".join(f"{h:>22}" for h in header))
        cells = []
        for h in header:
            values = [s[h] for s in stats if s[h] is not None]
            cells.append(f"{statistics.median(values):>22.4g}" if values else f"{'never':>22}")
        print(f"{label:14}" + "".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", nargs="?", choices=("pruning", "nupi", "both"), default="both")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--kp", default="1,5,20", help="nupi gains to compare with gd")
    parser.add_argument("--feasible", type=float, default=0.05)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=None, help="nupi: epochs of each run [the paper's, 250]")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        if args.what in ("pruning", "both"):
            pruning(args.seeds, Path(tmp) / "pruning")
        if args.what in ("nupi", "both"):
            nupi([float(k) for k in args.kp.split(",")], args.seeds, args.feasible, Path(tmp) / "nupi", args.epochs)


if __name__ == "__main__":
    main()
