"""flctl's own cost: what a run waits for before and after its math, and what one more cell of a sweep costs the host.

Two sections, each printed beside its floor measured in the same rounds (alternated, so the machine's drift hits
both alike; medians of --repeats):

1. start: ``flctl run two-moons -m fl --epochs 1`` in a fresh interpreter, from the command to its summary, against
   ``python -c "import torch"``; target ratio <= 2.5 (1.5: a tool out of the way). The run's time is cut into phases
   at the first call of flctl's own functions (a child interpreter wraps them; nothing in flctl knows): interpreter
   start, flctl's CLI import, torch's import, torch._dynamo's (torch.optim's first optimizer imports it, compiled or
   not), configuration, database, claim and provenance, data, model, first step, the rest of the epoch with its
   evaluation, records, the summary until the command returns, and the interpreter's exit.
2. cells: sweeps of 1-epoch two-moons cells (``--wait --workers 1``, in fresh results folders) at --cells sizes; the
   CPU seconds of the whole command (its workers included) fitted against the number of cells give the marginal
   cost of one more cell in core-ms, beside its math (the same epoch of steps and evaluations in plain torch, timed
   in this process). One sweep of the smallest size is profiled in process to say what the marginal cost is spent
   on (shares of the profiled worker's time per cell; the profile's own overhead is in its numbers, the shares are
   what it is good for). Target: marginal cost <= 15 core-ms beyond the math.
3. status: ``flctl status SWEEP`` over a sweep of 10,000 cells (queued two-moons cells written through flctl's store)
   beside ``flctl --version``; with --before REV the same commands of commit REV too (a worktree of it, its flctl
   on PYTHONPATH), on the same database and in the same rounds. Target: no slower than before.

    python benchmarks/bench_overhead.py                      # both, ~6 min on 2 cores
    python benchmarks/bench_overhead.py start --repeats 5
    python benchmarks/bench_overhead.py cells --cells 200 400 1000
    python benchmarks/bench_overhead.py status --before c09fab8

Writes benchmarks/results/overhead-<date>-cpu.json (and .txt: what it printed).
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import io
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = ["run", "two-moons", "--method", "fl", "--epochs", "1"]
# (module, qualified name, phase that ends when its first call starts or ends): the child wraps these.
MARKS = [("flctl.db.store", "Store.open", "configuration", "database"),
         ("flctl.train", "train_together", "claim and provenance", None),
         ("flctl.cell", "Cell.build", "data", "model"),
         ("flctl.stepper", "Stepper.step", None, "first step"),
         ("flctl.stepper", "Stepper.evaluations", None, "rest of the epoch and its evaluation"),
         ("flctl.outputs", "finish_run", None, "records")]


def _child(argv: list[str]) -> None:
    """A fresh interpreter: import, wrap MARKS' functions to note the wall time of their first call, run the command,
    print the marks as JSON on stderr's last line."""
    marks = [("interpreter start", time.time())]
    import flctl.__main__
    import flctl.cli  # noqa: F401
    marks.append(("flctl's CLI import", time.time()))
    import torch  # noqa: F401  (a run imports it anyway: here it is a phase of its own)
    marks.append(("torch import", time.time()))
    import torch._dynamo  # noqa: F401
    marks.append(("torch._dynamo import", time.time()))
    import importlib

    def wrap(fn, before: str | None, after: str | None):
        def timed(*a, **k):
            if before and before not in dict(marks):
                marks.append((before, time.time()))
            try:
                return fn(*a, **k)
            finally:
                if after and after not in dict(marks):
                    marks.append((after, time.time()))
        return timed

    for module, name, before, after in MARKS:
        mod = importlib.import_module(module)
        owner, _, attr = name.rpartition(".")
        holder = getattr(mod, owner) if owner else mod
        original = holder.__dict__[attr]
        fn = original.__func__ if isinstance(original, classmethod) else original
        timed = wrap(fn, before, after)
        setattr(holder, attr, classmethod(timed) if isinstance(original, classmethod) else timed)
        for other in list(sys.modules.values()):       # `from flctl.train import train_together` elsewhere
            if not owner and getattr(other, attr, None) is original and other is not mod:
                setattr(other, attr, timed)
    code = 0
    sys.argv = ["flctl", *argv]
    try:
        flctl.__main__.main()      # the console script: what `flctl run` runs
    except SystemExit as exc:
        code = exc.code or 0
    marks.append(("summary", time.time()))
    sys.stdout.flush()
    print(json.dumps({"marks": marks, "code": code}), file=sys.stderr)
    sys.exit(code)


def _wall(cmd: list[str], cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    start = time.time()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env={**os.environ, "COLUMNS": "120"})
    return start, out


def start(repeats: int) -> dict:
    torch_s, run_s, phases = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            began, out = _wall([sys.executable, "-c", "import torch"], Path(tmp))
            torch_s.append(time.time() - began)
            results = Path(tmp) / f"r{r}"
            began, out = _wall([sys.executable, __file__, "_child", *RUN, "--results-dir", str(results)], Path(tmp))
            ended = time.time()
            if out.returncode != 0:
                raise SystemExit(f"the run failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
            marks = json.loads(out.stderr.strip().splitlines()[-1])["marks"] + [["interpreter exit", ended]]
            run_s.append(ended - began)
            times = [began] + [t for _, t in marks]
            phases.append({name: times[i + 1] - times[i] for i, (name, _) in enumerate(marks)})
            shutil.rmtree(results)
            print(f"round {r + 1}: import torch {torch_s[-1]:.2f} s, flctl run {run_s[-1]:.2f} s", flush=True)
    names = list(phases[0])
    median = {n: round(statistics.median(p.get(n, 0.0) for p in phases), 3) for n in names}
    ratio = statistics.median(r / t for r, t in zip(run_s, torch_s))
    return {"command": "flctl " + " ".join(RUN), "repeats": repeats, "import_torch_s": round(statistics.median(torch_s), 3),
            "run_s": round(statistics.median(run_s), 3), "ratio": round(ratio, 2), "phases_s": median,
            "raw": {"import_torch_s": torch_s, "run_s": run_s}}


def _grid(cells: int) -> list[str]:
    """A two-moons FL grid of ``cells`` 1-epoch cells: lr x dual-lr (cells = 10 x cells/10)."""
    return ["sweep", "two-moons", "-m", "fl", "--lr", f"1e-4..1e-2:{cells // 10}", "--dual-lr", "1e-3..1:10",
            "--epochs", "1", "--wait", "--workers", "1"]


def _cpu_of(cmd: list[str], cwd: Path) -> tuple[float, float]:
    """(wall s, CPU s of the command and every process under it): the command runs in a child of a child, so that
    RUSAGE_CHILDREN counts its workers and nothing of this process."""
    code = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
            "subprocess.run(sys.argv[1:], check=True, capture_output=True); "
            "u = resource.getrusage(resource.RUSAGE_CHILDREN); print(time.perf_counter() - t, u.ru_utime + u.ru_stime)")
    out = subprocess.run([sys.executable, "-c", code, *cmd], capture_output=True, text=True, cwd=cwd, check=True)
    wall, cpu = map(float, out.stdout.split())
    return wall, cpu


def _math_ms(rounds: int = 20) -> float:
    """One 1-epoch two-moons FL cell's math in plain torch (this process): the model and optimizer built, the epoch's
    steps and both splits evaluated (the decision grid is the multipliers figure's, made as it draws); the median of
    ``rounds``, in ms."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from flctl_tasks.two_moons import make_moons

    x, y = (torch.tensor(a) for a in make_moons(1000, 0.1, 0))
    x = x.float()
    took = []
    with _threads(1):
        for seed in range(rounds):
            began = time.perf_counter()
            torch.manual_seed(seed)
            model = nn.Sequential(nn.Linear(2, 70), nn.ReLU(), nn.Linear(70, 70), nn.ReLU(), nn.Linear(70, 2))
            opt = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.0)
            lam = torch.zeros(1000)
            for ids in torch.randperm(1000).split(512):
                loss = F.cross_entropy(model(x[ids]), y[ids], reduction="none")
                lam[ids] = (lam[ids] + 1e-2 * (loss.detach() - 0.1)).clamp_min(0)
                opt.zero_grad()
                ((1 + lam[ids]) * loss).mean().backward()
                opt.step()
            with torch.no_grad():
                for _ in range(2):
                    F.cross_entropy(model(x), y, reduction="none")
            took.append(1000 * (time.perf_counter() - began))
    return statistics.median(took)


class _threads:
    """torch at ``n`` intra-op threads inside the block (a sweep worker's cells train at one on 2 cores)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __enter__(self) -> None:
        import torch
        self.before = torch.get_num_threads()
        torch.set_num_threads(self.n)

    def __exit__(self, *exc) -> None:
        import torch
        torch.set_num_threads(self.before)


# What a profiled worker's time per cell is spent on: (label, module path fragment, function name); cumulative times,
# so a row includes what it calls (rows may overlap: `records` holds `task extras` and its file).
SPENT = [("claim (RunQueue.claim_next)", "flctl/db/queue.py", "claim_next"),
         ("optuna trials of the grid (study.sync_sweep)", "flctl/study.py", "sync_sweep"),
         ("model and optimizer (Cell.build)", "flctl/cell.py", "build"),
         ("optimizer steps (Stepper.step)", "flctl/stepper.py", "step"),
         ("evaluation (Stepper.evaluations)", "flctl/stepper.py", "evaluations"),
         ("records and summary of a cell (outputs.finish_run)", "flctl/outputs.py", "finish_run"),
         ("  of which task extras (the MLP's layers)", "tasks/two_moons.py", "extras"),
         ("  of which the extras file (run_folder.save_extras)", "flctl/records/run_folder.py", "save_extras"),
         ("database writes (Store.write)", "flctl/db/store.py", "write"),
         ("claimed runs' bookkeeping (ClaimedRuns: provenance, beats, logs, outcomes)", "flctl/claimed.py",
          ("__enter__", "epoch", "_record", "__exit__"))]


def _profile(cells: int, cwd: Path) -> dict[str, float]:
    """The sweep of ``cells`` in this process under cProfile (``--workers 1 --wait`` trains in the waiting process):
    each SPENT row's cumulative ms per cell."""
    from flctl.cli import main

    prof = cProfile.Profile()
    here = Path.cwd()
    os.chdir(cwd)
    try:
        sys.argv = ["flctl", *_grid(cells), "--results-dir", str(cwd / "profiled")]
        prof.enable()
        try:
            main()
        except SystemExit as exc:
            if exc.code:
                raise
        finally:
            prof.disable()
    finally:
        os.chdir(here)
    stats = pstats.Stats(prof, stream=io.StringIO()).stats    # {(file, line, name): (cc, nc, tt, ct, callers)}
    found: dict[str, float] = {}
    for label, where, names in SPENT:
        names = (names,) if isinstance(names, str) else names
        found[label] = sum(ct for (file, _, fn), (_, _, _, ct, _) in stats.items()
                           if fn in names and file.endswith(where)) * 1000 / cells
    return {k: round(v, 2) for k, v in found.items()}


def cells(sizes: list[int], repeats: int) -> dict:
    runs: dict[int, list[tuple[float, float]]] = {n: [] for n in sizes}
    math = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            math.append(_math_ms())
            for n in sizes:
                results = Path(tmp) / f"c{n}-{r}"
                runs[n].append(_cpu_of([sys.executable, "-m", "flctl", *_grid(n), "--results-dir", str(results)],
                                       Path(tmp)))
                shutil.rmtree(results)
                print(f"round {r + 1}: {n} cells: {runs[n][-1][0]:.1f} s wall, {runs[n][-1][1]:.1f} CPU s", flush=True)
        spent = _profile(min(sizes), Path(tmp))
    cpu = {n: statistics.median(c for _, c in v) for n, v in runs.items()}
    xs, ys = list(cpu), [cpu[n] for n in cpu]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    marginal, math_ms = 1000 * slope, statistics.median(math)
    return {"grid": "flctl " + " ".join(_grid(min(sizes))).replace(f":{min(sizes) // 10}", ":N/10"),
            "repeats": repeats, "cpu_s": {str(n): round(c, 2) for n, c in cpu.items()},
            "wall_s": {str(n): round(statistics.median(w for w, _ in v), 2) for n, v in runs.items()},
            "marginal_core_ms": round(marginal, 1), "math_ms": round(math_ms, 1),
            "beyond_math_core_ms": round(marginal - math_ms, 1), "profiled_ms_per_cell": spent,
            "profiled_cells": min(sizes)}


def status(repeats: int, before: str | None, cells: int = 10_000) -> dict:
    from benchmarks.bench_sweep import trees
    from flctl import api
    from flctl.db import Store

    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "results"
        results.mkdir()
        configs = [api.config("two-moons", "fl", lr=1e-4 * (1 + i % 100), dual_lr=1e-3 * (1 + i // 100 % 100),
                              seed=i // 10_000) for i in range(cells)]
        store = Store.open(f"sqlite:///{results / 'flctl.db'}")
        store.create_sweep("0ver10kcells0", "status-bench", "two-moons", {}, configs)
        store.close()
        with trees(before, Path(tmp)) as checkouts:
            took: dict[str, dict[str, list[float]]] = {t: {"status_s": [], "version_s": []} for t in checkouts}
            for r in range(repeats):
                for name, tree in checkouts.items():
                    env = {**os.environ, "PYTHONPATH": str(tree)}
                    for what, args in (("status_s", ["status", "0ver10kcells0", "--results-dir", str(results)]),
                                       ("version_s", ["--version"])):
                        began = time.perf_counter()
                        subprocess.run([sys.executable, "-m", "flctl", *args], cwd=tree, env=env, check=True,
                                       capture_output=True)
                        took[name][what].append(round(time.perf_counter() - began, 3))
                    print(f"round {r + 1}: {name}: status {took[name]['status_s'][-1]} s, --version "
                          f"{took[name]['version_s'][-1]} s", flush=True)
    out: dict = {"cells": cells, "repeats": repeats}
    for name, t in took.items():
        st, ver = statistics.median(t["status_s"]), statistics.median(t["version_s"])
        out[name] = {"commit": _commit() if name == "now" else before, "status_s": st, "version_s": ver,
                     "ratio": round(st / ver, 2), "raw": t}
    return out


def _commit() -> str:
    return subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()


def main() -> None:
    if sys.argv[1:2] == ["_child"]:
        return _child(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sections", nargs="*", help="start, cells, status (default: all)")
    ap.add_argument("--before", metavar="REV", help="status: also time commit REV's flctl, in the same rounds")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cells", type=int, nargs="+", default=[200, 400, 1000], help="sweep sizes (multiples of 10)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    args.sections = args.sections or ["start", "cells", "status"]
    if not set(args.sections) <= {"start", "cells", "status"} or any(n % 10 or n < 20 for n in args.cells):
        ap.error("sections are start, cells and status; --cells sizes are multiples of 10 from 20")
    if len(set(args.cells)) < 2 and "cells" in args.sections:
        ap.error("--cells needs two sizes at least (the marginal cost is a slope)")
    sys.path.insert(0, str(ROOT))
    out: dict = {"date": datetime.date.today().isoformat(), "commit": _commit(), "cores": len(os.sched_getaffinity(0)),
                 "python": sys.version.split()[0]}
    lines = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    if "start" in args.sections:
        out["start"] = s = start(args.repeats)
        say(f"{s['command']}: {s['run_s']} s from the command to its summary vs `python -c \"import torch\"` "
            f"{s['import_torch_s']} s: {s['ratio']}x (target <= 2.5x; medians of {args.repeats})")
        for name, took in s["phases_s"].items():
            say(f"  {name:40s} {took:7.3f} s")
    if "cells" in args.sections:
        out["cells"] = c = cells(sorted(set(args.cells)), args.repeats)
        say(f"sweeps of 1-epoch two-moons cells ({', '.join(c['cpu_s'])} cells): CPU s {list(c['cpu_s'].values())}; "
            f"one more cell costs {c['marginal_core_ms']} core-ms, its math {c['math_ms']} ms: "
            f"{c['beyond_math_core_ms']} core-ms beyond it (target <= 15; medians of {args.repeats})")
        say(f"  profiled in process ({c['profiled_cells']} cells; ms per cell, cumulative, with the profiler's own cost):")
        for label, ms in c["profiled_ms_per_cell"].items():
            say(f"  {label:70s} {ms:8.2f}")
    if "status" in args.sections:
        out["status"] = st = status(args.repeats, args.before)
        for name in ("before", "now"):
            if name in st:
                say(f"{name} ({st[name]['commit']}): flctl status over {st['cells']:,} cells {st[name]['status_s']} s, "
                    f"flctl --version {st[name]['version_s']} s: {st[name]['ratio']}x (medians of {args.repeats})")
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"overhead-{out['date']}-cpu"
    stem.with_suffix(".json").write_text(json.dumps(out, indent=1) + "\n")
    stem.with_suffix(".txt").write_text("\n".join(lines) + "\n")
    print(f"wrote {stem}.json")


if __name__ == "__main__":
    main()
