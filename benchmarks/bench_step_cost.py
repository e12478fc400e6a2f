"""What one training step costs the host, counted on a CPU: dispatched ops, host-device syncs, host µs.

A GPU step of a small batch is bound by the host (docs/design.md, "What a step costs the host"): the GPU waits while
Python, autograd and the dispatcher queue ~340 kernels one by one. Neither the op count nor the syncs depend on the
device, so a CPU counts them for the GPU:

- ``ops_per_step``: aten ops dispatched by one step (a TorchDispatchMode counter under autograd and functorch, so a
  vmapped op counts once for all its cells). For K = 4 cells together, one step of each of the four.
- ``syncs_per_epoch``: ops that make the host wait for the device (`.item()`, `nonzero`, ...) in one epoch's batch
  set-up and steps, before the epoch-end read of its statistics (one, by design).
- ``host_us_per_step``: median wall µs of a step at a size where the arithmetic is negligible (a batch of 2
  images, width 4; two-moons' batch as it is): the host's own cost of the step.

Each task: ERM and FL, one cell and K = 4 together (K = 4 mixes seeds, learning rates and ε), through the loop's own
``flctl.stepper.Stepper``. Rounds alternate the configurations, so the machine's drift hits all alike. Writes
benchmarks/results/step-cost-<date>-cpu.json (or --out).

    python benchmarks/bench_step_cost.py            # about a minute on 2 cores
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import importlib.util
import inspect
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# flctl's own tasks are installed as flctl_tasks (an editable install maps it to the checkout it was made from): this
# checkout's, so that --before measures that commit's tasks too.
_spec = importlib.util.spec_from_file_location("flctl_tasks", ROOT / "tasks" / "__init__.py",
                                               submodule_search_locations=[str(ROOT / "tasks")])
assert _spec is not None and _spec.loader is not None
sys.modules["flctl_tasks"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sys.modules["flctl_tasks"])

import flctl.cell as cell_module  # noqa: E402
from flctl.cell import Cell  # noqa: E402
from flctl.tasks import get_task  # noqa: E402

try:
    from flctl.stepper import Stepper  # noqa: E402
except ImportError:                    # commits before flctl/stepper.py (--before)
    from flctl.train import _Stepper as Stepper  # type: ignore[no-redef]  # noqa: E402
try:
    from tests.data_writers import write_cifar10  # noqa: E402
except ImportError:                    # commits before tests/data_writers.py was named so (--before)
    from tests.fixtures import write_cifar10  # type: ignore[no-redef]  # noqa: E402
from tests.helpers import config  # noqa: E402

# Commits before flctl/stack.py (--before), which became flctl/grouped/, stepped cells of a model with buffers in turn
# on CUDA too.
GROUPS_ON_CUDA = (ROOT / "flctl" / "grouped").is_dir() or (ROOT / "flctl" / "stack.py").exists()
aten = torch.ops.aten
# Ops whose result the host must read (or whose output size depends on data): on CUDA each one waits for the device.
SYNC_OPS = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default,
            aten.is_nonzero.default, aten.equal.default, aten.item.default,
            aten.repeat_interleave.Tensor, aten._unique2.default, aten.unique_consecutive.default}
CONFIGS = {"erm": ("erm", 1), "fl": ("fl", 1), "erm_k4": ("erm", 4), "fl_k4": ("fl", 4)}
# a sweep's small cells, 64 to a worker (two-moons only: 64 ResNets would measure the CPU's memory, not the host)
MANY = {"erm_k64": ("erm", 64), "fl_k64": ("fl", 64)}
# two-moons shrunk until its arithmetic is negligible (4 hidden units, batches of 8): the host's own µs of a step
TINY = dict(options={"hidden": 4, "n_train": 64, "n_test": 8}, batch_size=8)


class Count(TorchDispatchMode):
    """Counts every aten op dispatched under it, and those that sync with the host."""

    def __init__(self, host_scalars: set[int] = frozenset()) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.syncs = 0
        # Tensors that live on the host on CUDA too: an optimizer's step counts, which torch's CPU optimizers read
        # with `.item()` (CUDA's fused ones take them on the device).
        self.host_scalars = host_scalars

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        if func is aten._local_scalar_dense.default and id(args[0]) in self.host_scalars:
            pass
        elif func in SYNC_OPS or (func is aten.index.Tensor and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1])):
            self.syncs += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.ops.values())


def build(task: str, method: str, k: int, folder: Path, data_dir: str | None, tiny: bool = False) -> Stepper:
    """K cells of ``task`` (seeds, learning rates and ε differ) in the loop's own stepper, their first epoch begun,
    set up as on CUDA where flctl lets a CPU do it: fused optimizers, cells of a groupable model grouped. ``tiny``:
    two-moons at TINY's size."""
    extra = dict(options={"width": 4}, batch_size=2) if task == "cifar10" else TINY if tiny else {}
    cfgs = [config(task, method, seed=i, epochs=1000, data_dir=data_dir, **extra,
                   lr=config(task, method).lr * (1 + i / 10), **({"eps": 0.5 + i / 100} if method == "fl" else {}))
            for i in range(k)]
    spec = get_task(task)
    if GROUPS_ON_CUDA:                    # on CUDA cells of every groupable model are grouped (batched: so on a CPU too)
        spec = dataclasses.replace(spec, batched=True)
    data = spec.load(cfgs[0].opts, data_dir)
    with as_on_cuda():
        cells = [Cell.build(cfg, spec, data, folder / cfg.run_id, torch.device("cpu")) for cfg in cfgs]
    if k > 1:
        for c in cells:
            c.swap_rng_out()
    stepper = Stepper(cells, spec, data)
    begin(stepper)
    return stepper


@contextlib.contextmanager
def as_on_cuda():
    """Cells built with CUDA's optimizers (fused, a tensor learning rate), which a CPU runs too."""
    build_optimizer = cell_module.build_optimizer
    if "fused" in inspect.signature(build_optimizer).parameters:     # older commits (--before) build theirs
        cell_module.build_optimizer = functools.partial(build_optimizer, fused=True)
    try:
        yield
    finally:
        cell_module.build_optimizer = build_optimizer


def begin(stepper: Stepper) -> None:
    for c in stepper.cells:
        with stepper.own(c):
            stepper.begin_epoch(c)


def step(stepper: Stepper, count: Count | None = None) -> None:
    """One full-batch step of every cell (under ``count``), a new epoch first when this one's full batches are used
    up (the stepper's step counter: one full batch of each cell per step)."""
    stepper.taken = getattr(stepper, "taken", 0)
    if stepper.taken == sum(not last for last in stepper.shapes(stepper.cells)):
        begin(stepper)
        stepper.taken = 0
    with count or contextlib.nullcontext():
        stepper.step(stepper.cells, False)
    stepper.taken += 1


def host_scalars(stepper: Stepper) -> set[int]:
    return {id(s["step"]) for c in stepper.cells for s in c.optimizer.state.values() if "step" in s}


def epoch_syncs(stepper: Stepper) -> int:
    """Syncs in one epoch's set-up and steps (every shape)."""
    with Count(host_scalars(stepper)) as count:
        begin(stepper)
        for last in stepper.shapes(stepper.cells):
            stepper.step(stepper.cells, last)
    begin(stepper)
    stepper.taken = 0
    return count.syncs


def timed(steppers: dict[str, Stepper], rounds: int, steps: int) -> dict[str, float]:
    """Median host µs per step of each stepper, rounds alternating them."""
    times: dict[str, list[float]] = {name: [] for name in steppers}
    for _ in range(rounds):
        for name, stepper in steppers.items():
            start = time.perf_counter()
            for _ in range(steps):
                step(stepper)
            times[name].append((time.perf_counter() - start) / steps * 1e6)
    return {name: round(statistics.median(v), 1) for name, v in times.items()}


def measure(task: str, rounds: int, steps: int, data_dir: str | None) -> dict:
    configs = {**CONFIGS, **(MANY if task == "two-moons" else {})}
    with tempfile.TemporaryDirectory() as tmp:
        steppers = {name: build(task, method, k, Path(tmp) / name, data_dir) for name, (method, k) in configs.items()}
        ops, syncs, top = {}, {}, {}
        for name, stepper in steppers.items():
            step(stepper)                               # lazily made state (optimizer moments) exists from here on
            count = Count(host_scalars(stepper))
            step(stepper, count)
            ops[name], top[name] = count.total, dict(count.ops.most_common(8))
            syncs[name] = epoch_syncs(stepper)
        host_us = timed({name: steppers[name] for name in CONFIGS}, rounds, steps)
        del steppers
        out = {"ops_per_step": ops, "host_us_per_step": host_us, "syncs_per_epoch": syncs,
               "ratios": {"fl/erm ops": round(ops["fl"] / ops["erm"], 3),
                          "erm_k4/erm ops": round(ops["erm_k4"] / ops["erm"], 3),
                          "fl_k4/fl ops": round(ops["fl_k4"] / ops["fl"], 3),
                          "fl/erm host": round(host_us["fl"] / host_us["erm"], 3),
                          "erm_k4/erm host": round(host_us["erm_k4"] / host_us["erm"], 3)},
               "top_ops": top}
        if task == "two-moons":
            # 64 cells against one at a size whose arithmetic is negligible: what grouping leaves to the host
            small = {name: build(task, method, k, Path(tmp) / f"tiny-{name}", data_dir, tiny=True)
                     for name, (method, k) in {"erm": ("erm", 1), "fl": ("fl", 1), **MANY}.items()}
            tiny_us = timed(small, rounds, steps)
            out["host_us_per_step_tiny"] = tiny_us
            out["ratios"].update({f"{name}/{name[:-4]} {what}": round(values[name] / values[name[:-4]], 3)
                                  for name in MANY for what, values in (("ops", ops), ("host tiny", tiny_us))})
    return out


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def measure_at(rev: str, args: argparse.Namespace) -> dict:
    """This script's numbers for commit ``rev``: run in a temporary worktree of it (this copy of the script, that commit's
    flctl, tasks and tests), in a process of its own."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        git("worktree", "add", "--detach", str(tree), rev)
        try:
            (tree / "benchmarks").mkdir(exist_ok=True)
            (tree / "benchmarks" / Path(__file__).name).write_text(Path(__file__).read_text())
            result = Path(tmp) / "before.json"
            subprocess.run([sys.executable, str(tree / "benchmarks" / Path(__file__).name), "--rounds",
                            str(args.rounds), "--steps", str(args.steps), "--json", str(result)], check=True,
                           cwd=tree)
            return json.loads(result.read_text())
        finally:
            git("worktree", "remove", "--force", str(tree))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20, help="steps timed per configuration and round")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results)")
    parser.add_argument("--before", metavar="REV", default=None,
                        help="also measure commit REV (this script run in a worktree of it, on this machine now) and "
                             "keep its numbers under 'before'")
    parser.add_argument("--json", type=Path, default=None, help=argparse.SUPPRESS)   # where --before's child writes
    args = parser.parse_args()
    before = measure_at(args.before, args) if args.before else None
    torch.set_num_threads(1)          # the host's cost, not the arithmetic's parallelism
    import flctl

    assert Path(flctl.__file__).parents[1] == ROOT, f"flctl comes from {flctl.__file__}, not {ROOT}"
    with tempfile.TemporaryDirectory() as tmp:
        cifar = write_cifar10(Path(tmp), per_batch=16)
        out = {"commit": git("describe", "--always", "--dirty", "--abbrev=7"), "torch": torch.__version__,
               "what": "dispatched aten ops per step, syncs per epoch, median host µs per step (1 thread); "
                       "cifar10: ResNet-18 at width 4, batch 2; two_moons: the paper's MLP and batch",
               "cifar10": measure("cifar10", args.rounds, args.steps, str(cifar)),
               "two_moons": measure("two-moons", args.rounds, args.steps * 5, None)}
    if args.json:
        args.json.write_text(json.dumps(out))
        return
    if before is not None:
        out["before"] = before
    folder = args.out or ROOT / "benchmarks" / "results"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step-cost-{datetime.date.today().isoformat()}-cpu.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    for when, numbers in (("before", before), ("now", out)):
        for task in ("cifar10", "two_moons"):
            if numbers is None:
                continue
            r = numbers[task]
            print(f"{when} ({numbers['commit']}) {task:10s} ops/step {r['ops_per_step']}  "
                  f"host µs/step {r['host_us_per_step']}  syncs/epoch {r['syncs_per_epoch']}")
            print(f"{'':20s} {r['ratios']}")
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


if __name__ == "__main__":
    main()
