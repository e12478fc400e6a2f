"""Reference records of the CPU tasks, written down by the training code of 2026-11-23 before the engine rework.

``python -m tests.reference`` rewrites tests/data/reference_records.json (do that only when a change of the numbers
is intended and said so); ``python -m tests.reference together`` rewrites the cells trained together only (their
step changed on 2026-11-26: one grouped model, flctl.grouped, where a vmapped one rounded otherwise). tests/test_reference.py trains every case again and checks run ids, metrics and a digest
of every Parquet value against the file: records must stay bit-identical across refactors of the loop.

Bit-identity holds on requirements.lock's versions of the libraries that compute a task's numbers (``ARITHMETIC``),
which the reference was written with; on other versions the test compares within stated tolerances and says so.
Bit-identity holds where the arithmetic does not depend on the processor. Two tasks' arithmetic does: the digits
CNN's convolutions (oneDNN picks kernels by CPU model and thread count: on an AMD EPYC, 1 and 2 threads give train
losses 5e-6 apart and two test predictions flipped) and polyfit's least squares (LAPACK's dgelsd through OpenBLAS,
whose kernels follow the CPU: with AVX-512 the metrics move by 1e-13). For ``KERNEL_DEPENDENT`` tasks the test checks
run ids and the records' layout (sample ids and targets, which no kernel touches) exactly, and the metrics within the
task's tolerance.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import sys
from pathlib import Path

from flctl import records
from tests.helpers import config, lock_pins

REFERENCE = Path(__file__).parent / "data" / "reference_records.json"
# Tasks whose numbers depend on the CPU's kernels -> absolute tolerance on every metric.
KERNEL_DEPENDENT = {
    "digits": 5e-3,     # two flipped predictions of 1347 are 1.5e-3
    "polyfit": 1e-9,    # a least-squares solve in another kernel: rounding only, far below the fit's 0.05 loss
}
LAYOUT = ("sample_id", "target")
COLUMNS = ("sample_id", "loss", "multiplier", "prediction", "target", "correct", "confidence", "pruned")

# (name, task, method, overrides): short runs that together reach every branch of the step and the loop.
CASES: list[tuple[str, str, str, dict]] = [
    ("two-moons-erm", "two-moons", "erm", dict(epochs=6, eval_every=3)),
    ("two-moons-fl", "two-moons", "fl", dict(epochs=6, eval_every=3)),
    ("two-moons-rfl", "two-moons", "rfl", dict(epochs=6, eval_every=3, alpha=0.5)),
    ("two-moons-cserm", "two-moons", "cserm", dict(epochs=6, eval_every=3, alpha=2.0)),
    ("two-moons-fl-nupi", "two-moons", "fl", dict(epochs=6, eval_every=3, dual_optimizer="nupi", kp=0.5, ki=0.8,
                                                  nu=0.3)),
    ("two-moons-rfl-nupi", "two-moons", "rfl", dict(epochs=6, eval_every=3, alpha=0.5, dual_optimizer="nupi",
                                                    kp=1.0, ki=1.0, nu=0.0)),
    ("two-moons-fl-prune", "two-moons", "fl", dict(epochs=8, eval_every=4, prune_after=2, prune_patience=1,
                                                   eps=0.7, batch_size=64)),
    ("two-moons-fl-micro", "two-moons", "fl", dict(epochs=3, eval_every=3, micro_batch=100, batch_size=300)),
    ("two-moons-fl-sgd-warmup", "two-moons", "fl", dict(epochs=3, eval_every=3, optimizer="sgd", lr=0.05,
                                                        momentum=0.9, weight_decay=1e-3, warmup_steps=2,
                                                        scheduler="cosine")),
    ("digits-erm", "digits", "erm", dict(epochs=2, eval_every=1)),
    ("digits-fl", "digits", "fl", dict(epochs=2, eval_every=1)),
    ("digits-rfl", "digits", "rfl", dict(epochs=2, eval_every=1)),
    ("digits-cserm", "digits", "cserm", dict(epochs=2, eval_every=1)),
    ("diabetes-erm", "diabetes", "erm", dict(epochs=4, eval_every=2)),
    ("diabetes-fl", "diabetes", "fl", dict(epochs=4, eval_every=2)),
    ("diabetes-rfl", "diabetes", "rfl", dict(epochs=4, eval_every=2)),
    ("diabetes-cserm", "diabetes", "cserm", dict(epochs=4, eval_every=2)),
    ("polyfit-erm", "polyfit", "erm", {}),
    ("polyfit-fl", "polyfit", "fl", {}),
]


def digest(records_root: Path, run_id: str, columns: tuple[str, ...] = COLUMNS) -> dict[str, str]:
    """{"<split>/<epoch>": sha256 of the columns' values (all of them by default), rows by sample id}."""
    table = records.read(records_root, [run_id])
    out = {}
    for split in ("train", "test"):
        for epoch in sorted(set(table["epoch"].to_pylist())):
            part = table.filter(_mask(table, split, epoch)).sort_by("sample_id")
            h = hashlib.sha256()
            for column in columns:
                values = part[column].to_numpy(zero_copy_only=False)
                h.update(column.encode())
                h.update(repr(values.tolist()).encode() if values.dtype == object else values.tobytes())
            out[f"{split}/{epoch}"] = h.hexdigest()
    return out


def _mask(table, split: str, epoch: int):
    import pyarrow.compute as pc

    return pc.and_(pc.equal(table["split"], split), pc.equal(table["epoch"], epoch))


# ---- exact on requirements.lock's versions, within tolerances on others ----
# The libraries whose versions decide a task's numbers; the reference was written with requirements.lock's. The H200
# image (2026-11-26) had torch 2.11.0 and scs 3.2.7 (benchmarks/gpu_wheels.sh): 13 cases differed.
ARITHMETIC = {"polyfit": ("numpy", "cvxpy", "scs")}    # no torch: numpy's least squares, CVXPY's SCS
TRAINED = ("torch",)                                    # every other task
# Off the lock's versions float32 kernels round differently, and a few epochs carry it on: torch 2.11.0 moved these
# cases' metrics by 7e-8 relative at most (of the differences its log shows). 1e-4 leaves 1,000 times that for other
# versions and processors, and stays far below what a change of the training moves: a learning rate or dual step 1%
# off moves some metric of a case by 7e-3 to 1.3e-2 (two-moons erm and fl, diabetes fl).
OFF_LOCK_REL = 1e-4
# A share of a split's samples (accuracy, violation rate, ...) moves by whole samples: one whose loss or margin lies
# within rounding of its threshold flips. Off the lock's versions, two samples of the split (of each epoch, for
# samples_seen, which pruning decides).
RATES = ("accuracy", "violation_rate", "zero_multiplier_share", "pruned_share")
FLIPS = 2
# polyfit's FL is a feasibility problem (any a with |p_a(x_i) - y_i| <= eps): many solutions, and which one SCS
# returns depends on its version (3.2.7's test.avg_loss is 0.294, 3.3.1's 0.222). Off the lock's versions only what
# every solution shares is compared, each metric with its tolerance: no violated sample, zero multipliers (the
# objective is 0; the solver leaves them at ~1e-18).
EVERY_SOLUTION = {("polyfit", "fl"): {"train.violation_rate": 0.0, "train.max_multiplier": 1e-9}}


# The processor's vector instructions decide how float32 sums are split, as the versions do. The reference was written
# where torch's CPU kernels ran AVX2; on a machine whose torch runs AVX-512 the same versions differ by about 1e-8
# relative (two-moons, diabetes: 2026-11-29, torch 2.14.1), well inside OFF_LOCK_REL. Such a machine compares within
# the tolerances and says why.
REFERENCE_CPU = "AVX2"


def cpu_capability() -> str:
    """torch's CPU kernels' instruction set (AVX2, AVX512, DEFAULT); the reference's where torch is not installed."""
    try:
        import torch
    except ImportError:
        return REFERENCE_CPU
    return torch.backends.cpu.get_cpu_capability()


def comparison(task: str) -> tuple[bool, str]:
    """(exact, the sentence that says which comparison ``task`` gets on this machine and why): exact where each library
    of its arithmetic is requirements.lock's version. A local label (2.14.1+cu130, +cpu) is the lock's release, as
    pip reads `torch==2.14.1`."""
    from packaging.specifiers import SpecifierSet

    pins = lock_pins()
    have = {lib: importlib.metadata.version(lib) for lib in ARITHMETIC.get(task, TRAINED)}
    other = [f"{lib} {v} (the lock's {pins[lib]})" for lib, v in have.items()
             if not SpecifierSet(f"=={pins[lib]}").contains(v, prereleases=True)]
    if (cpu := cpu_capability()) != REFERENCE_CPU:
        other.append(f"torch's CPU kernels {cpu} (the reference's {REFERENCE_CPU})")
    if other:
        return False, f"{task}: compared within tolerances, not exactly: {', '.join(other)}"
    return True, f"{task}: compared exactly: {', '.join(f'{lib} {v}' for lib, v in have.items())} as in requirements.lock"


def split_sizes(records_root: Path, run_id: str) -> dict[str, int]:
    """Samples per split (rows of the split's last recorded epoch)."""
    table = records.read(records_root, [run_id])
    last = max(table["epoch"].to_pylist())
    return {split: table.filter(_mask(table, split, last)).num_rows for split in ("train", "test")}


def metric_mismatches(task: str, method: str, got: dict, want: dict, *, exact: bool, sizes: dict[str, int],
                      epochs: int) -> list[str]:
    """Each metric outside its tolerance around the reference's, as 'name: got vs want (± tol)'. ``exact``: this
    machine has the lock's versions of the task's libraries (then only KERNEL_DEPENDENT tasks have a tolerance)."""
    if set(got) != set(want):
        return [f"metrics on one side only: {sorted(set(got) ^ set(want))}"]
    kernel = KERNEL_DEPENDENT.get(task, 0.0)
    shared = None if exact else EVERY_SOLUTION.get((task, method))
    out = []
    for name in sorted(want):
        split, _, metric = name.partition(".")
        if shared is not None:
            if name not in shared:
                continue
            tol = shared[name]
        elif exact:
            tol = kernel
        elif metric in RATES:
            tol = max(kernel, FLIPS / sizes[split])
        elif metric == "samples_seen":
            tol = FLIPS * epochs
        else:
            tol = max(kernel, OFF_LOCK_REL * abs(want[name]))
        if not abs(got[name] - want[name]) <= tol:
            out.append(f"{name}: {got[name]!r} vs {want[name]!r} (± {tol:.3g})")
    return out


def train_case(root: Path, task: str, method: str, overrides: dict) -> tuple:
    from flctl.train import train

    cfg = config(task, method, **overrides)
    result = train(cfg, root / "records", root / "runs" / cfg.run_id)
    return cfg, result


# Cells trained in one process (train_together): a two-moons group of mixed methods, seeds and lrs.
TOGETHER = [("two-moons", "erm", dict(seed=0, lr=1e-3)), ("two-moons", "fl", dict(seed=1, lr=5e-4, dual_lr=2e-2)),
            ("two-moons", "rfl", dict(seed=2, lr=2e-3, alpha=0.5, dual_lr=1e-2))]
TOGETHER_SHARED = dict(epochs=4, eval_every=2)
# An old checkpoint (tests/data/checkpoint-2026-11-23.pt): this case stopped after epoch 2 by today's code.
OLD_CHECKPOINT = REFERENCE.parent / "checkpoint-2026-11-23.pt"
OLD_CHECKPOINT_CASE = "two-moons-fl-nupi"


def together_configs() -> list:
    return [config(task, method, **overrides, **TOGETHER_SHARED) for task, method, overrides in TOGETHER]


def main() -> None:
    import shutil
    import tempfile

    from flctl.train import train, train_together

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        cfgs = together_configs()
        results = train_together(cfgs, Path(tmp) / "together", [Path(tmp) / "t" / c.run_id for c in cfgs])
        out["together"] = [{"run_id": c.run_id, "metrics": r.metrics, "records": digest(Path(tmp) / "together",
                                                                                       c.run_id)}
                           for c, r in zip(cfgs, results)]
        if sys.argv[1:] == ["together"]:
            REFERENCE.write_text(json.dumps(json.loads(REFERENCE.read_text()) | out, indent=1, sort_keys=True) + "\n")
            return
        name, task, method, overrides = next(c for c in CASES if c[0] == OLD_CHECKPOINT_CASE)
        cfg = config(task, method, **overrides)
        stopped = train(cfg, Path(tmp) / "old", Path(tmp) / "old" / "run", stop=lambda: True)
        assert stopped.status == "stopped" and stopped.epochs_done == 1, stopped
        shutil.copy(Path(tmp) / "old" / "run" / "checkpoint.pt", OLD_CHECKPOINT)
        for name, task, method, overrides in CASES:
            cfg, result = train_case(Path(tmp), task, method, overrides)
            out[name] = {"task": task, "method": method, "overrides": overrides, "run_id": cfg.run_id,
                         "status": result.status, "metrics": result.metrics,
                         "records": digest(Path(tmp) / "records", cfg.run_id),
                         "layout": digest(Path(tmp) / "records", cfg.run_id, LAYOUT)}
            print(name, cfg.run_id, file=sys.stderr)
    REFERENCE.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
