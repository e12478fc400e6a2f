"""The paper's Table 1 claims measured on real images: Fashion-MNIST at CPU size (sweeps/fashion-mnist-cpu.toml).

Runs the spec's cells through `flctl paper --only table:1-fashion-mnist` (two local workers; the bundle with the
table beside the paper's CIFAR-10 numbers lands in WORK/paper) into --work, then writes, from the finished runs,
benchmarks/results/fashion-mnist-<date>-cpu.json and .md (--out):
  * the table, mean ± std over seeds, as `flctl report --table main` builds it (train/test CE and accuracy, and the
    tail columns train/test cvar@q computed from each run's final per-sample losses);
  * the loss distribution: CVaR at q = 0.5, 0.9, 0.99 and the share of samples under a few loss levels (the CDF);
  * one line per claim of the paper (Table 1, §4.3 and Fig. 5): holds or does not hold here, with its numbers;
  * the CDF and CVaR figures at ε = 0.51 (PNG, as `flctl report --plot cdf|cvar` draws them);
  * the wall time of `flctl paper` and the runs' seconds per epoch.
The commands' own output is kept beside them (.log). Nothing is transcribed: run it again to refresh.

    python benchmarks/bench_fashion_mnist.py                          # the spec as written (~25 min on 2 cores)
    python benchmarks/bench_fashion_mnist.py --smoke --out /tmp/fm   # flctl paper's smoke scale: the path only
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "sweeps" / "fashion-mnist-cpu.toml"
EPS = 0.5108256237659907            # the paper's ε = 0.51 (p_min = 0.6)
QS = (0.5, 0.9, 0.99)
LEVELS = (0.01, 0.1, 0.51, 2.3)     # CDF points: p_true >= 0.99, 0.90, 0.60 and 0.10
COLUMNS = ["train.avg_loss", "train.accuracy", "test.avg_loss", "test.accuracy",
           *(f"{s}.cvar@{q}" for s in ("train", "test") for q in QS)]
ITEM = "table:1-fashion-mnist"      # the spec's table in flctl paper's programme


def flctl(*args: str, log: Path | None = None) -> str:
    out = subprocess.run([sys.executable, "-m", "flctl", *args], capture_output=True, text=True, cwd=ROOT)
    if log is not None:
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"$ flctl {' '.join(args)}\n{out.stdout}{out.stderr}\n")
    if out.returncode != 0:
        sys.exit(f"flctl {' '.join(args)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return out.stdout


def row_key(method: str, eps: float | None) -> str:
    return method if eps is None else f"{method} ε={eps:.2f}"


def measure(work: Path) -> dict:
    """The table, the loss distribution and the timings of the finished runs in ``work``."""
    from flctl.api import open_store
    from flctl.layout import Layout
    from flctl.metrics import cvar
    from flctl.report.data import final_losses
    from flctl.report.tables import build, record_values, render

    store = open_store(work, create=False)
    runs = [r for r in store.list_runs(task="fashion-mnist")]
    store.close()
    records = Layout(work).records
    table = build("main", runs, COLUMNS, value=record_values(runs, records, COLUMNS))
    rows = {}
    for key, (_, cells) in zip(table.configs, table.rows):
        rows[row_key(key.method, key.eps)] = {"method": key.method, "eps": key.eps, "alpha": key.alpha,
                                              "seeds": cells[0].n,
                                              **{c: {"mean": cell.mean, "std": cell.std} for c, cell in zip(COLUMNS, cells)}}
    # the distribution of the pooled per-sample losses of each row's seeds (final epoch)
    losses = final_losses(records, [r.id for r in runs], ["train", "test"])
    distribution: dict[str, dict] = {}
    for r in runs:
        key = row_key(r.method, r.config["eps"])
        for split in ("train", "test"):
            distribution.setdefault(key, {}).setdefault(split, []).append(losses[(r.id, split)])
    for splits in distribution.values():
        for split, chunks in splits.items():
            pooled = np.concatenate(chunks)
            splits[split] = {"cvar": {str(q): cvar(pooled, q) for q in QS},
                             "share_below": {str(x): float((pooled < x).mean()) for x in LEVELS},
                             "max": float(pooled.max()), "n": int(pooled.size)}
    per_epoch = [r.duration_s / r.epochs_done for r in runs if r.duration_s and r.epochs_done]
    return {"table": rows, "table_markdown": render(table, "markdown", 3), "distribution": distribution,
            "s_per_epoch_median": float(np.median(per_epoch)) if per_epoch else None, "runs": len(runs)}


def figures(work: Path, out: Path, stem: str, log: Path) -> None:
    """The CDF and CVaR figures of each split, drawn as `flctl report --plot cdf|cvar --split S --task fashion-mnist`
    draws them (the same run selection and plot function), in this process: four more interpreters would only
    import torch again."""
    from flctl.api import open_store
    from flctl.layout import Layout
    from flctl.report.data import select_runs
    from flctl.report.plots import plot

    store = open_store(work, create=False)
    try:
        runs = select_runs(store, task="fashion-mnist")
    finally:
        store.close()
    with open(log, "a", encoding="utf-8") as f:
        for what in ("cdf", "cvar"):
            for split in ("train", "test"):
                paths = plot(what, runs, Layout(work).records, out / f"{stem}-{what}-{split}", split=split)
                f.write(f"# as flctl report --plot {what} --split {split} --task fashion-mnist: wrote "
                        + ", ".join(map(str, paths)) + "\n")


def claims(m: dict) -> list[dict]:
    """One line per claim of the paper, judged on the measured numbers (a claim that fails here is a finding)."""
    t, d, out = m["table"], m["distribution"], []

    def mean(row: str, col: str) -> float | None:
        return t.get(row, {}).get(col, {}).get("mean")

    def claim(text: str, holds: bool | None, numbers: str) -> None:
        out.append({"claim": text, "holds": holds, "numbers": numbers})

    erm_acc, erm_ce = mean("erm", "test.accuracy"), mean("erm", "test.avg_loss")
    for eps in (0.51, 0.0):
        for method in ("fl", "rfl"):
            row = row_key(method, EPS if eps else 0.0)
            acc, ce = mean(row, "test.accuracy"), mean(row, "test.avg_loss")
            if None in (acc, erm_acc, ce, erm_ce):
                continue
            claim(f"Table 1: {method.upper()} at ε = {eps:g} reaches ERM's test accuracy (within 1 point)",
                  abs(acc - erm_acc) <= 0.01, f"{acc:.4f} vs ERM {erm_acc:.4f} ({100 * (acc - erm_acc):+.2f} points)")
            claim(f"Table 1: {method.upper()} at ε = {eps:g} reaches ERM's test CE (within 0.05; paper: +0.03..+0.05)",
                  ce - erm_ce <= 0.05, f"{ce:.3f} vs ERM {erm_ce:.3f}")
    for eps in (0.51, 0.0):
        cs = row_key("cserm", EPS if eps else 0.0)
        others = {r: mean(r, "train.avg_loss") for r in ("erm", row_key("fl", EPS if eps else 0.0),
                                                          row_key("rfl", EPS if eps else 0.0))}
        ce, acc = mean(cs, "train.avg_loss"), mean(cs, "test.accuracy")
        if ce is not None and None not in others.values() and acc is not None and erm_acc is not None:
            claim(f"Table 1: CSERM at ε = {eps:g} has the highest train CE of ERM, FL, RFL and CSERM",
                  all(ce > v for v in others.values()),
                  f"CSERM {ce:.3f}; " + ", ".join(f"{k} {v:.3f}" for k, v in others.items()))
            claim(f"Table 1: CSERM at ε = {eps:g} has a lower test accuracy than ERM", acc < erm_acc,
                  f"{acc:.4f} vs ERM {erm_acc:.4f}")
    fl, erm = d.get(row_key("fl", EPS)), d.get("erm")
    if fl and erm:
        for split in ("train", "test"):
            a, b = fl[split]["cvar"], erm[split]["cvar"]
            claim(f"§4.3/Fig. 5: FL's {split} CVaR at q = 0.99 is below ERM's (ε = 0.51)", a["0.99"] < b["0.99"],
                  f"{a['0.99']:.3f} vs ERM {b['0.99']:.3f}")
            claim(f"§4.3/Fig. 5: FL's {split} CVaR is below ERM's at every q of {', '.join(map(str, QS))} (ε = 0.51)",
                  all(a[str(q)] < b[str(q)] for q in QS),
                  "; ".join(f"q={q}: {a[str(q)]:.3f} vs {b[str(q)]:.3f}" for q in QS))
        a, b = fl["train"]["share_below"]["0.01"], erm["train"]["share_below"]["0.01"]
        claim("§4.3: ERM has more very-low-loss training samples than FL (loss < 0.01, its CDF above FL's there)",
              b > a, f"ERM {b:.3f} vs FL {a:.3f} of the samples")
        a, b = fl["test"]["share_below"]["2.3"], erm["test"]["share_below"]["2.3"]
        claim("§4.3: FL has fewer test samples with very high losses (loss >= 2.3, p_true <= 0.1)", a > b,
              f"FL {1 - a:.4f} vs ERM {1 - b:.4f} of the samples")
    return out


def write(m: dict, lines: list[dict], wall_s: float, out: Path, stem: str, smoke: bool) -> None:
    import torch

    head = [f"# Table 1 on Fashion-MNIST (CPU size: {SPEC.relative_to(ROOT)})", "",
            f"{m['runs']} runs in {wall_s / 60:.1f} min of wall time (`flctl paper --only {ITEM}`, two local "
            f"workers); median {m['s_per_epoch_median']:.2f} s per epoch per run; torch {torch.__version__}"
            + (" — SMOKE scale: 1 seed, 2 epochs, 256 samples; these numbers measure nothing" if smoke else ""), "",
            m["table_markdown"], "", "## Claims of the paper, here", "",
            f"{sum(bool(c['holds']) for c in lines)} of {len(lines)} hold on this data at this size.", ""]
    head += [f"- **{'holds' if c['holds'] else 'does not hold'}** — {c['claim']}: {c['numbers']}" for c in lines]
    head += ["", "## Loss distribution (seeds pooled): share of samples under each loss level", "",
             "| row | split | " + " | ".join(f"< {x}" for x in LEVELS) + " | " +
             " | ".join(f"CVaR q={q}" for q in QS) + " |", "|---|---|" + "---|" * (len(LEVELS) + len(QS))]
    for row, splits in m["distribution"].items():
        for split, v in splits.items():
            head.append(f"| {row} | {split} | " + " | ".join(f"{v['share_below'][str(x)]:.3f}" for x in LEVELS)
                        + " | " + " | ".join(f"{v['cvar'][str(q)]:.3f}" for q in QS) + " |")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.md").write_text("\n".join(head) + "\n", encoding="utf-8")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    (out / f"{stem}.json").write_text(json.dumps({**m, "claims": lines, "wall_s": wall_s, "smoke": smoke,
                                                  "torch": torch.__version__, "commit": commit or None,
                                                  "spec": SPEC.name}, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("/tmp/flctl-bench-fashion-mnist"),
                    help="results folder of the runs and the bundle (kept: a rerun trains only what is missing)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--smoke", action="store_true", help="flctl paper's smoke scale: checks the path only")
    args = ap.parse_args()
    stem = f"fashion-mnist-{datetime.date.today().isoformat()}-cpu" + ("-smoke" if args.smoke else "")
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / f"{stem}.log"
    log.write_text("")
    t0 = time.perf_counter()
    flctl("paper", "--only", ITEM, "--results-dir", str(args.work), "--specs", str(SPEC.parent),
          *(["--scale", "smoke"] if args.smoke else []), log=log)
    wall = time.perf_counter() - t0
    m = measure(args.work)
    lines = claims(m)
    figures(args.work, args.out, stem, log)
    write(m, lines, wall, args.out, stem, args.smoke)
    print((args.out / f"{stem}.md").read_text())


if __name__ == "__main__":
    main()
