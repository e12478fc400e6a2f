"""Training-step throughput of FL, RFL and CSERM relative to ERM, measured side by side in one process.

For each model, one model + AdamW optimizer + method object is built per method from the same seed, and
every method walks the same epoch orders (``flctl.data.epoch_order``) through the real
``flctl.step.train_step``, exactly like the loop in ``flctl/train.py``::

    x, y = x_train[ids], y_train[ids]
    epoch_losses[ids] = train_step(task, model, method, optimizer, x, y, ids)

Timing is done in blocks of K consecutive steps. A round times one block per method, in a round-robin
order rotated every round (ERM, FL, RFL, CSERM / FL, RFL, CSERM, ERM / ...) so that slow drift of the
machine (thermal, other processes) hits every method alike. The per-round ratio steps/s(method) /
steps/s(ERM) uses the ERM block of the same round; the table reports its median, interquartile range and
a distribution-free 95% CI of the median over rounds, plus each method's median steps/s and the per-step
time it adds over ERM. torch.set_num_threads is fixed (--threads, default 1); Python's garbage collector
is paused during the timed rounds.

Run from the repository root with the project's virtualenv::

    python benchmarks/bench_methods.py                    # both models, 1 thread, ~75 s
    python benchmarks/bench_methods.py --threads 2
    python benchmarks/bench_methods.py --models two-moons --rounds 200 --steps-per-block 50
    python benchmarks/bench_methods.py --models orca-dpo-tiny --rounds 40   # DPO, tiny Llama + LoRA (llm extra)
    python benchmarks/bench_methods.py --models orca-dpo-tiny --device cuda

The orca-dpo model trains on synthetic preference pairs written as JSONL in the dataset's columns; its
reference margins come from the task's own ``prepare`` (adapter disabled), as in a run.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from flctl.cell import build_optimizer
from flctl.config import resolve
from flctl.data import batches, epoch_order
from flctl.methods import get_method
from flctl.step import train_step
from flctl.tasks import get_task

METHODS = ("erm", "fl", "rfl", "cserm")


@dataclass(frozen=True)
class ModelSpec:
    task: str
    batch_size: int
    steps_per_block: int     # default K: a block of roughly 50 ms on one CPU thread
    label: str
    options: dict = field(default_factory=dict)
    needs_data: bool = False


MODELS = {
    "two-moons": ModelSpec("two-moons", 512, 50, "two-moons MLP 2-70-70-2, batch 512, AdamW"),
    "digits": ModelSpec("digits", 64, 8, "digits small CNN, batch 64, AdamW"),
    "orca-dpo-tiny": ModelSpec("orca-dpo", 16, 2, "orca-dpo tiny Llama + LoRA r8, batch 16 (4 x 4), AdamW",
                               {"model": "tiny"}, needs_data=True),
}


def synthetic_pairs(folder: Path, n: int = 64) -> str:
    """Preference pairs in the columns of argilla/distilabel-intel-orca-dpo-pairs, ~100-300 bytes each."""
    import random

    rng = random.Random(0)
    words = "the a of to and in is it that for on with as was at by an be this from or".split()
    text = lambda k: " ".join(rng.choice(words) for _ in range(k)).capitalize() + "."  # noqa: E731
    rows = [{"system": "", "input": text(20), "chosen": text(rng.randint(15, 40)), "rejected": text(rng.randint(15, 40)),
             "status": "unchanged", "chosen_score": 9.0, "in_gsm8k_train": False} for _ in range(n)]
    path = folder / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


class Runner:
    """One method's full training state; ``run(k)`` takes k steps through consecutive epochs."""

    def __init__(self, spec: ModelSpec, method_name: str, data, seed: int) -> None:
        self.task = get_task(spec.task)
        options, defaults = {**self.task.options, **spec.options}, self.task.defaults
        self.batch_size = spec.batch_size
        self.seed = seed
        self.x_train, self.y_train = data.train.x, data.train.y
        self.n = len(data.train)
        torch.manual_seed(seed)                              # same initial weights for every method
        self.model = self.task.build_model(options, data).to(data.train.x.device)
        if self.task.prepare is not None:
            self.task.prepare(self.model, data, options)
        self.model.train()
        # The optimizer exactly as flctl.train builds it for this task's paper defaults.
        cfg = resolve(self.task, method_name, {"batch_size": spec.batch_size, "options": spec.options})
        self.micro_batch = cfg.micro_batch
        self.optimizer = build_optimizer(cfg, [p for p in self.model.parameters() if p.requires_grad])
        device = data.train.x.device
        self.method = get_method(method_name)(self.n, eps=defaults["eps"], alpha=defaults["alpha"],
                                              dual_lr=defaults["dual_lr"], device=device)
        self.epoch_losses = torch.empty(self.n, device=device)
        self.epoch = 0
        self._batches = iter(batches(epoch_order(self.n, seed, 0), self.batch_size))

    def _next_ids(self) -> torch.Tensor:
        ids = next(self._batches, None)
        if ids is None:                                      # epoch boundary: next seeded permutation
            self.epoch += 1
            self._batches = iter(batches(epoch_order(self.n, self.seed, self.epoch), self.batch_size))
            ids = next(self._batches)
        return ids

    def run(self, k: int) -> float:
        """Take k training steps; return elapsed wall seconds."""
        task, model, method, optimizer = self.task, self.model, self.method, self.optimizer
        x_train, y_train, epoch_losses = self.x_train, self.y_train, self.epoch_losses
        t0 = time.perf_counter()
        for _ in range(k):
            ids = self._next_ids().to(x_train.device)
            x, y = x_train[ids], y_train[ids]
            epoch_losses[ids] = train_step(task, model, method, optimizer, x, y, ids, self.micro_batch)
        if x_train.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0


@dataclass
class ModelResult:
    spec: ModelSpec
    steps_per_block: int
    rounds: int
    rates: dict[str, list[float]] = field(default_factory=dict)    # steps/s per round
    seconds: float = 0.0

    def ratios(self, method: str) -> list[float]:
        return [m / e for m, e in zip(self.rates[method], self.rates["erm"])]


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def median_ci95(values: list[float]) -> tuple[float, float]:
    """Distribution-free 95% confidence interval of the median (order statistics n/2 -+ 0.98 sqrt(n))."""
    v, n = sorted(values), len(values)
    half = 0.98 * n ** 0.5
    lo, hi = max(0, int(n / 2 - half)), min(n - 1, int(n / 2 + half + 0.999))
    return v[lo], v[hi]


def bench_model(spec: ModelSpec, rounds: int, steps_per_block: int, warmup_rounds: int, seed: int,
                methods: tuple[str, ...], device: str = "cpu") -> ModelResult:
    task = get_task(spec.task)
    with tempfile.TemporaryDirectory() as tmp:
        data = task.load({**task.options, **spec.options}, synthetic_pairs(Path(tmp)) if spec.needs_data else None)
    data = data.to(device)
    runners = {m: Runner(spec, m, data, seed) for m in methods}
    result = ModelResult(spec, steps_per_block, rounds, {m: [] for m in methods})
    t_start = time.perf_counter()
    for _ in range(warmup_rounds):                          # allocator, autograd, AdamW state warm-up
        for m in methods:
            runners[m].run(steps_per_block)
    gc.collect()
    gc.disable()                                             # no collector pauses inside timed blocks
    try:
        for r in range(rounds):
            shift = r % len(methods)
            for m in methods[shift:] + methods[:shift]:      # rotated round robin cancels drift
                result.rates[m].append(steps_per_block / runners[m].run(steps_per_block))
    finally:
        gc.enable()
    result.seconds = time.perf_counter() - t_start
    return result


def summarize(result: ModelResult) -> list[dict]:
    rows = []
    erm_rate = statistics.median(result.rates["erm"])
    for m, rates in result.rates.items():
        rate = statistics.median(rates)
        q1, med, q3 = quartiles(result.ratios(m))
        lo, hi = median_ci95(result.ratios(m))
        # per-round extra time per step over ERM (us), from the same rounds as the ratio
        extra = [1e6 * (1 / a - 1 / b) for a, b in zip(rates, result.rates["erm"])]
        rows.append({"method": m, "steps_per_s": rate, "ms_per_step": 1e3 / rate,
                     "ratio_median": med, "ratio_q1": q1, "ratio_q3": q3, "ratio_ci95": (lo, hi),
                     "extra_us_per_step": statistics.median(extra),
                     "erm_steps_per_s": erm_rate})
    return rows


def print_table(result: ModelResult, rows: list[dict], threads: int, target: float, plain: bool = False) -> None:
    title = (f"{result.spec.label} — torch threads {threads}, {result.rounds} rounds × "
             f"{result.steps_per_block} steps/block ({result.seconds:.0f} s)")
    cells = [(row["method"].upper(), f"{row['steps_per_s']:.1f}", f"{row['ms_per_step']:.3f}",
              f"{row['ratio_median']:.3f}", f"{row['ratio_q1']:.3f}–{row['ratio_q3']:.3f}",
              f"{row['ratio_ci95'][0]:.3f}–{row['ratio_ci95'][1]:.3f}", f"{row['extra_us_per_step']:+.1f}")
             for row in rows]
    header = ("method", "steps/s", "ms/step", "ratio", "ratio IQR", "median 95% CI", "+µs/step")
    caption = ("ratio = per-round steps/s(method) / steps/s(ERM of the same round): median, IQR and a 95% CI "
               "of the median over rounds; +µs/step = median extra time per step over ERM")
    try:
        if plain:
            raise ImportError
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(header)]
        print(title)
        print("  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths))))
        for c in cells:
            print("  ".join(x.ljust(w) if i == 0 else x.rjust(w) for i, (x, w) in enumerate(zip(c, widths))))
        print(caption + "\n")
        return
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    for h in header:
        table.add_column(h, justify="left" if h == "method" else "right", no_wrap=True)
    for row, c in zip(rows, cells):
        if row["method"] != "erm":
            c = (*c[:3], f"[{'green' if row['ratio_median'] >= target else 'red'}]{c[3]}[/]", *c[4:])
        table.add_row(*c)
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 100))
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["two-moons", "digits"],
                   help="models to benchmark (default: two-moons digits)")
    p.add_argument("--rounds", type=int, default=150, help="timed rounds per model (default 150)")
    p.add_argument("--steps-per-block", type=int, default=None,
                   help="steps per timed block (default per model: two-moons 50, digits 8; ~50 ms each)")
    p.add_argument("--warmup-rounds", type=int, default=3, help="untimed rounds first (default 3)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch.set_num_threads value (default 1: least noisy; try 2 too)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--target", type=float, default=0.95, help="ratio colored green at or above (0.95)")
    p.add_argument("--plain", action="store_true", help="plain-text table instead of rich")
    p.add_argument("--json", metavar="PATH", help="also write the summary rows and raw rates as JSON")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, num_threads={torch.get_num_threads()}, python {sys.version.split()[0]}")
    out = {"threads": args.threads, "torch": torch.__version__, "models": {}}
    for name in args.models:
        spec = MODELS[name]
        k = args.steps_per_block or spec.steps_per_block
        result = bench_model(spec, args.rounds, k, args.warmup_rounds, args.seed, METHODS, args.device)
        rows = summarize(result)
        print_table(result, rows, args.threads, args.target, args.plain)
        out["models"][name] = {"steps_per_block": k, "rounds": args.rounds, "rows": rows,
                               "rates": result.rates}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
