"""Reads as aggregates and a sweep planned in bulk, at 100,000 cells: this checkout beside --before REV (a worktree of
that commit, its flctl on PYTHONPATH), alternated round by round so that the machine's drift hits both alike; medians
of --repeats.

1. status: ``flctl status SWEEP`` over a sweep of --cells cells in every state (5/8 completed, 1/8 queued, 1/16 each
   failed with a traceback, diverged, interrupted and running, half of the running ones stale), beside ``flctl
   --version``; on SQLite and, with FLCTL_TEST_PG set, on PostgreSQL. The database is made once by the oldest tree
   and upgraded for the newer one (the same rows). Target: <= 1 s.
2. dry run: ``flctl sweep two-moons --lr 1e-4..1:1000 --seeds N --epochs 1 --yes --dry-run`` (--cells cells) over
   that SQLite database (its cost line reads the task's runs).
3. launch: the same grid launched for real into a fresh results folder (one local worker, cancelled after each
   round): the command from start to exit, with its phases (plan_sweep: the grid planned; launch_sweep: the sweep
   and its runs recorded, lost and failed cells re-queued, the worker started; sync_sweep: the Optuna mirror's
   study made). Target: <= 15 s.

A tree that refuses a grid over 40,000 cells (before 827ad09) has its cap lifted in its own process: both plan the
same grid.

    python benchmarks/bench_reads.py --before 824718e          # ~25 min on 2 shared cores
    python benchmarks/bench_reads.py status --cells 20000

Writes benchmarks/results/reads-<date>-cpu.json (and .txt: what it printed).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SWEEP = "0ver100kcell"
# The phases a launch is cut into (module, function): the child wraps them and says how long each took.
PHASES = [("flctl.launch.plan", "plan_sweep"), ("flctl.launch.plan", "launch_sweep"), ("flctl.study", "sync_sweep")]

MAKE = r"""
import sys
from datetime import datetime, timedelta, timezone
from sqlalchemy import func, text, update
from flctl.config import resolve
from flctl.db import Store
from flctl.db.schema import Run
from flctl.tasks import get_task
url, sweep, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
task = get_task("two-moons")
configs = [resolve(task, "fl", {"lr": 1e-4 * (1 + i % 1000), "seed": i // 1000, "epochs": 1}) for i in range(n)]
store = Store.open(url)
store.create_sweep(sweep, "reads-bench", "two-moons", {}, configs)
trace = "'Traceback (most recent call last):\n  File \"/x/a.py\", line 3, in f\n    g()\nValueError: bad step ' || substr(id, 2, 2)"
old, fresh = datetime.now(timezone.utc) - timedelta(hours=1), datetime.now(timezone.utc)
with store.session() as s:
    s.execute(text("UPDATE runs SET status = 'completed', attempts = 1, epochs_done = 1, duration_s = 1.0 "
                   "WHERE substr(id, 1, 1) IN ('0','1','2','3','4','5','6','7','8','9')"))
    s.execute(text(f"UPDATE runs SET status = 'failed', attempts = 3, error = {trace} WHERE substr(id, 1, 1) = 'c'"))
    s.execute(text("UPDATE runs SET status = 'diverged', attempts = 1 WHERE substr(id, 1, 1) = 'd'"))
    s.execute(text("UPDATE runs SET status = 'interrupted', attempts = 1 WHERE substr(id, 1, 1) = 'e'"))
    for half, beat in (("01234567", old), ("89abcdef", fresh)):     # half of the running cells stale
        s.execute(update(Run).where(func.substr(Run.id, 1, 1) == "f", func.substr(Run.id, 2, 1).in_(list(half)))
                  .values(status="running", attempts=1, heartbeat_at=beat, host="another-node", pid=1))
"""


def _child(argv: list[str]) -> None:
    """In a tree's interpreter: lift a grid cap under the benchmark's, wrap PHASES, run the command, and say the
    phases' wall times as JSON on stderr's last line."""
    import functools
    import importlib

    import flctl.sweep

    flctl.sweep.MAX_CELLS_ANYWAY = max(flctl.sweep.MAX_CELLS_ANYWAY, 100_000)
    took: dict[str, float] = {}
    for module, name in PHASES:
        mod = importlib.import_module(module)

        def timed(*args, __f=getattr(mod, name), __name=name, **kwargs):
            began = time.perf_counter()
            try:
                return __f(*args, **kwargs)
            finally:
                took[__name] = took.get(__name, 0.0) + time.perf_counter() - began

        setattr(mod, name, functools.wraps(getattr(mod, name))(timed))
    import flctl.launch.flow

    flctl.launch.flow.launch_sweep = importlib.import_module("flctl.launch.plan").launch_sweep
    from flctl.cli import main

    sys.argv = ["flctl", *argv]
    try:
        main()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    finally:
        print("\n" + json.dumps({k: round(v, 3) for k, v in took.items()}), file=sys.stderr, flush=True)


def _run(tree: Path, args: list[str], child: bool = False) -> tuple[float, dict]:
    """``flctl *args`` with ``tree``'s flctl: its wall time, and the phases a child said."""
    env = {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "200"}
    env.pop("FLCTL_DB", None)
    cmd = [sys.executable, __file__, "_child", *args] if child else [sys.executable, "-m", "flctl", *args]
    began = time.perf_counter()
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    took = round(time.perf_counter() - began, 3)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: flctl {' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return took, (json.loads(done.stderr.strip().splitlines()[-1]) if child else {})


def _pg_copy(base: str, template: str | None = None) -> str:
    """A new database on the server of ``base`` (a copy of ``template`` where given); its URL."""
    import sqlalchemy as sa

    name = f"bench_reads_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(base.replace("postgresql://", "postgresql+psycopg://", 1), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))
    admin.dispose()
    return base.rsplit("/", 1)[0] + "/" + name


def _pg_drop(urls: list[str]) -> None:
    import sqlalchemy as sa

    for url in urls:
        admin = sa.create_engine(url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1) + "/postgres",
                                 isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {url.rsplit('/', 1)[1]} WITH (FORCE)")
        admin.dispose()


def databases(checkouts: dict[str, Path], tmp: Path, cells: int, pg: str | None) -> tuple[dict, list[str]]:
    """{tree: {backend: url}}: one database made by the oldest tree, copied for each newer one and upgraded by it."""
    oldest = "before" if "before" in checkouts else "now"
    env = {**os.environ, "PYTHONPATH": str(checkouts[oldest])}
    made: dict[str, dict[str, str]] = {name: {} for name in checkouts}
    created: list[str] = []
    sqlite_first = tmp / f"{oldest}.db"
    # run from the tree: `python -c` puts the working folder before PYTHONPATH
    subprocess.run([sys.executable, "-c", MAKE, f"sqlite:///{sqlite_first}", SWEEP, str(cells)], env=env, check=True,
                   cwd=checkouts[oldest])
    pg_first = None
    if pg:
        pg_first = _pg_copy(pg)
        created.append(pg_first)
        subprocess.run([sys.executable, "-c", MAKE, pg_first, SWEEP, str(cells)], env=env, check=True,
                       cwd=checkouts[oldest])
    for name, tree in checkouts.items():
        sqlite = tmp / f"{name}.db"
        if name != oldest:
            shutil.copy(sqlite_first, sqlite)
        made[name]["sqlite"] = f"sqlite:///{sqlite}"
        if pg_first:
            made[name]["postgresql"] = pg_first if name == oldest else _pg_copy(pg, pg_first.rsplit("/", 1)[1])
            created.append(made[name]["postgresql"])
        upgrade = "from flctl.db import Store; import sys; [Store.open(u).close() for u in sys.argv[1:]]"
        subprocess.run([sys.executable, "-c", upgrade, *made[name].values()],
                       env={**os.environ, "PYTHONPATH": str(tree)}, check=True, cwd=tree)
        if "postgresql" in made[name]:
            _settle(made[name]["postgresql"])
    return made, created


def _settle(url: str) -> None:
    """VACUUM ANALYZE a PostgreSQL database, as autovacuum leaves it a minute later: an upgrade rewrites every run
    (revision 0008's together key) and the planner would read the table as it was, twice its size, until then."""
    import sqlalchemy as sa

    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1), isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.exec_driver_sql("VACUUM ANALYZE")
    engine.dispose()


def status(checkouts: dict[str, Path], made: dict, repeats: int) -> dict:
    took = {name: {what: [] for what in ("version_s", *(f"{b}_s" for b in made[name]))} for name in checkouts}
    for r in range(repeats):
        for name, tree in checkouts.items():
            took[name]["version_s"].append(_run(tree, ["--version"])[0])
            for backend, url in made[name].items():
                took[name][f"{backend}_s"].append(_run(tree, ["status", SWEEP, "--db", url])[0])
            print(f"round {r + 1}: {name}: {', '.join(f'{k} {v[-1]}' for k, v in took[name].items())}", flush=True)
    return {name: {k: statistics.median(v) for k, v in t.items()} | {"raw": t} for name, t in took.items()}


def grid(cells: int) -> list[str]:
    return ["sweep", "two-moons", "--lr", "1e-4..1:1000", "--seeds", str(cells // 1000), "--epochs", "1", "--yes"]


def dry_run(checkouts: dict[str, Path], made: dict, repeats: int, cells: int) -> dict:
    took: dict[str, list[float]] = {name: [] for name in checkouts}
    for r in range(repeats):
        for name, tree in checkouts.items():
            took[name].append(_run(tree, [*grid(cells), "--dry-run", "--db", made[name]["sqlite"]], child=True)[0])
            print(f"round {r + 1}: {name}: dry run {took[name][-1]} s", flush=True)
    return {name: {"dry_run_s": statistics.median(t), "raw": t} for name, t in took.items()}


def launch(checkouts: dict[str, Path], tmp: Path, repeats: int, cells: int) -> dict:
    took: dict[str, dict[str, list[float]]] = {name: {} for name in checkouts}
    for r in range(repeats):
        for name, tree in checkouts.items():
            results = tmp / f"launch-{name}-{r}"
            wall, phases = _run(tree, [*grid(cells), "--workers", "1", "--results-dir", str(results)], child=True)
            for what, seconds in {"launch_s": wall, **{f"{k}_s": v for k, v in phases.items()}}.items():
                took[name].setdefault(what, []).append(seconds)
            sweeps = json.loads(subprocess.run(
                [sys.executable, "-m", "flctl", "sweeps", "--json", "--results-dir", str(results)], cwd=tree,
                env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True, check=True).stdout)
            subprocess.run([sys.executable, "-m", "flctl", "cancel", sweeps[0]["id"], "--timeout", "5",
                            "--results-dir", str(results)], cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
                           capture_output=True, check=False)
            shutil.rmtree(results, ignore_errors=True)
            print(f"round {r + 1}: {name}: {', '.join(f'{k} {v[-1]}' for k, v in took[name].items())}", flush=True)
    return {name: {k: statistics.median(v) for k, v in t.items()} | {"raw": t} for name, t in took.items()}


def main() -> None:
    if sys.argv[1:2] == ["_child"]:
        return _child(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sections", nargs="*", help="status, dry-run, launch (default: all)")
    ap.add_argument("--before", metavar="REV", help="also time commit REV's flctl, in the same rounds")
    ap.add_argument("--cells", type=int, default=100_000, help="a multiple of 1,000")
    ap.add_argument("--repeats", type=int, default=3, help="rounds, at least 1 (each section's median)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    sections = args.sections or ["status", "dry-run", "launch"]
    if not set(sections) <= {"status", "dry-run", "launch"} or args.cells % 1000 or args.cells < 1000:
        ap.error("sections are status, dry-run and launch; --cells is a multiple of 1,000")
    if args.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {args.repeats}")
    sys.path.insert(0, str(ROOT))
    from benchmarks.bench_sweep import trees

    commit = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    out: dict = {"date": datetime.date.today().isoformat(), "commit": commit, "before": args.before,
                 "cells": args.cells, "repeats": args.repeats, "cores": len(os.sched_getaffinity(0)),
                 "load_at_start": os.getloadavg()[0]}     # the machine is shared: what else ran, as a number
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    pg = os.environ.get("FLCTL_TEST_PG")
    with tempfile.TemporaryDirectory() as tmp, trees(args.before, Path(tmp)) as checkouts:
        created: list[str] = []
        try:
            if {"status", "dry-run"} & set(sections):
                made, created = databases(checkouts, Path(tmp), args.cells, pg if "status" in sections else None)
            if "status" in sections:
                out["status"] = st = status(checkouts, made, args.repeats)
                for name, t in st.items():
                    said = ", ".join(f"{b} {t[f'{b}_s']} s" for b in ("sqlite", "postgresql") if f"{b}_s" in t)
                    say(f"{name}: flctl status over {args.cells:,} cells: {said}; flctl --version {t['version_s']} s "
                        f"(target <= 1 s; medians of {args.repeats})")
            if "dry-run" in sections:
                out["dry_run"] = dr = dry_run(checkouts, made, args.repeats, args.cells)
                for name, t in dr.items():
                    say(f"{name}: flctl sweep --dry-run of {args.cells:,} cells: {t['dry_run_s']} s "
                        f"(medians of {args.repeats})")
            if "launch" in sections:
                out["launch"] = la = launch(checkouts, Path(tmp), args.repeats, args.cells)
                for name, t in la.items():
                    phases = ", ".join(f"{k.removesuffix('_s')} {v} s" for k, v in t.items()
                                       if k not in ("raw", "launch_s"))
                    say(f"{name}: flctl sweep of {args.cells:,} cells, launched: {t['launch_s']} s ({phases}; "
                        f"target <= 15 s; medians of {args.repeats})")
        finally:
            _pg_drop(created)
    out["load_at_end"] = os.getloadavg()[0]
    say(f"1-minute load average {out['load_at_start']:.1f} at the start, {out['load_at_end']:.1f} at the end "
        f"({out['cores']} cores)")
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"reads-{out['date']}-cpu"
    stem.with_suffix(".json").write_text(json.dumps(out, indent=1) + "\n")
    stem.with_suffix(".txt").write_text("\n".join(lines) + "\n")
    print(f"wrote {stem}.json")


if __name__ == "__main__":
    main()
