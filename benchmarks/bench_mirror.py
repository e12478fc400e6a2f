"""What the Optuna mirror costs a worker as it exits, before and after the mirror read only what is new (0a758e6).

A grid sweep of --cells finished cells, all mirrored into its study, then --new more finish; on copies of that one
SQLite database, in this one process, a worker's exit sync is timed:

- before: the sync as it was at 0a758e6^ (kept below as ``sync_before``): under the blocking lock, every run of the
  sweep with its config, every config parsed, and every trial of the study read to find which cells are mirrored;
- after: flctl.study.sync_sweep(..., wait=False), as a worker calls it now: the finished cells not mirrored, a page
  at a time, under a lock it does not wait for.

Each is timed adding the --new trials, then again with nothing new, and the after sync once more while another
mirror holds the lock (a worker that finds one running). Medians of --repeats, each round on a fresh copy.

    python benchmarks/bench_mirror.py                              # 20,000 cells + 200, ~10 min on 2 busy cores
    python benchmarks/bench_mirror.py --cells 2000 --new 20 --repeats 1

Writes benchmarks/results/mirror-<date>-cpu.json and .txt (what it printed).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import io
import json
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"


def sync_before(store: Any, url: str, sweep_id: str) -> int:
    """flctl.study.sync_sweep as it was before 0a758e6 (a worker's call: the spec's objective, direction min)."""
    import optuna

    from flctl.config import RunConfig
    from flctl.db import existing_storage
    from flctl.status import REPORTABLE, Status
    from flctl.study import DEFAULT_OBJECTIVE, GRID_SEED, OPTUNA_LOCK, add_trials, params_of, varying
    from flctl.study_rdb import optuna_time as _optuna_time

    with store.exclusive(OPTUNA_LOCK):
        sweep_row = store.get_sweep(sweep_id)
        rows = store.sweep_runs(sweep_id)
        configs = [RunConfig.from_json(r["config"]) for r in rows]
        runs = {r["id"]: r for r in rows}
        objective = sweep_row["spec"].get("objective") or DEFAULT_OBJECTIVE
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        space = varying(configs) or {"seed": [configs[0].seed]}
        storage = existing_storage(url)
        try:
            study = optuna.create_study(storage=storage, study_name=f"flctl-{sweep_id}", load_if_exists=True,
                                        direction="minimize", sampler=optuna.samplers.GridSampler(space, seed=GRID_SEED))
            study.set_user_attr("objective", objective)
            known = {t.user_attrs.get("run_id") for t in study.get_trials(deepcopy=False)}
            dists = {k: optuna.distributions.CategoricalDistribution(v) for k, v in space.items()}
            trials = []
            for cfg in configs:
                run = runs.get(cfg.run_id)
                if run is None or cfg.run_id in known or run["status"] not in REPORTABLE:
                    continue
                value = (run.get("metrics") or {}).get(objective)
                ok = run["status"] == Status.COMPLETED and value is not None
                trial = optuna.trial.create_trial(
                    params=params_of(cfg, list(space)), distributions=dists, value=value if ok else None,
                    state=optuna.trial.TrialState.COMPLETE if ok else optuna.trial.TrialState.FAIL,
                    user_attrs={"run_id": cfg.run_id, "status": run["status"]})
                if run.get("finished_at") is not None:
                    trial.datetime_complete = _optuna_time(run["finished_at"])
                    trial.datetime_start = trial.datetime_complete - datetime.timedelta(seconds=run["duration_s"] or 0)
                trials.append(trial)
            add_trials(storage, study, trials)
            return len(trials)
        finally:
            storage.engine.dispose()


def grid_configs(n: int) -> list[Any]:
    """``n`` two-moons FL cells: seeds x learning rates x eps values (a grid of 20 x 10 x n/200 for the default)."""
    from flctl.config import resolve
    from flctl.tasks import get_task

    base = resolve(get_task("two-moons"), "fl", {"epochs": 1})
    lrs = [round(1e-3 * (i + 1), 6) for i in range(10)]
    eps_values = [round(0.01 * (i + 1), 6) for i in range(max(1, -(-n // 200)))]
    cells = [dataclasses.replace(base, seed=s, lr=lr, eps=eps) for eps in eps_values for lr in lrs for s in range(20)]
    return cells[:n]


def finish(store: Any, run_ids: list[str]) -> None:
    """The runs finished as a worker finishes them (status, metrics, end time, duration), in one write."""
    from sqlalchemy import bindparam, update

    from flctl.db.schema import Run, now

    stamp = now()
    rows = [{"rid": rid, "metrics": {"train.avg_loss": (i % 997) / 997}} for i, rid in enumerate(run_ids)]
    stmt = (update(Run.__table__).where(Run.__table__.c.id == bindparam("rid"))
            .values(status="completed", metrics=bindparam("metrics"), finished_at=stamp, duration_s=1.5, epochs_done=1))
    store.write(lambda s: s.execute(stmt, rows))


def copy_db(src: Path, dst: Path) -> None:
    for p in dst.parent.glob(f"{dst.name}*"):
        p.unlink()
    a, b = sqlite3.connect(src), sqlite3.connect(dst)
    try:
        a.backup(b)
    finally:
        a.close()
        b.close()


def timed(fn: Any) -> tuple[float, Any]:
    began = time.perf_counter()
    out = fn()
    return (time.perf_counter() - began) * 1000, out


def one_round(pristine: Path, work: Path, new: int) -> dict[str, float]:
    from flctl.db import Store
    from flctl.study import MIRROR_LOCK, sync_sweep

    ms: dict[str, float] = {}
    for side in ("before", "after"):
        db = work / f"{side}.db"
        copy_db(pristine, db)
        url = f"sqlite:///{db}"
        store = Store.open(url)
        sync = (lambda: sync_before(store, url, "grid")) if side == "before" else \
            (lambda: sync_sweep(store, url, "grid", wait=False))
        ms[f"{side}: {new} new"], added = timed(sync)
        assert added == new, (side, added)
        ms[f"{side}: nothing new"], added = timed(sync)
        assert added == 0, (side, added)
        if side == "after":
            holder = Store.open(url)
            with holder.exclusive(MIRROR_LOCK):           # another worker's mirror running
                ms["after: another mirror running"], added = timed(sync)
            holder.close()
        store.close()
    return ms


def build(path: Path, cells: int, new: int) -> dict[str, float]:
    """The database: a sweep of cells + new cells, ``cells`` of them finished and mirrored; then ``new`` finish."""
    from flctl.db import Store
    from flctl.study import sync_sweep

    configs = grid_configs(cells + new)
    url = f"sqlite:///{path}"
    store = Store.open(url)
    store.create_sweep("grid", "grid", "two-moons", {"objective": "train.avg_loss"}, configs)
    finish(store, [c.run_id for c in configs[:cells]])
    ms_first, added = timed(lambda: sync_sweep(store, url, "grid"))
    assert added == cells, added
    finish(store, [c.run_id for c in configs[cells:]])
    store.close()
    return {f"first mirror of {cells} cells (after)": ms_first}


def at_least_1(text: str) -> int:
    """A count of cells or rounds (argparse's type): a whole number of at least 1; a sweep of none has nothing to
    mirror, and no round has no median."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=at_least_1, default=20_000, help="finished and mirrored cells (20,000)")
    parser.add_argument("--new", type=at_least_1, default=200, help="cells that finish after (200)")
    parser.add_argument("--repeats", type=at_least_1, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    text = io.StringIO()
    with tempfile.TemporaryDirectory() as tmp:
        pristine = Path(tmp) / "pristine.db"
        once = build(pristine, args.cells, args.new)
        rounds = [one_round(pristine, Path(tmp), args.new) for _ in range(args.repeats)]
    medians = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    with redirect_stdout(text):
        print(f"Optuna mirror, SQLite: a sweep of {args.cells + args.new} cells, {args.cells} mirrored, {args.new} "
              f"more finished; a worker's exit sync, median of {args.repeats} (ms)")
        for key, value in {**once, **medians}.items():
            print(f"  {key:<40} {value:10.1f}")
        for what in (f"{args.new} new", "nothing new"):
            print(f"  {what}: {medians[f'before: {what}'] / medians[f'after: {what}']:.0f}x faster")
    print(text.getvalue(), end="")
    stamp = datetime.date.today().isoformat()
    args.out.mkdir(parents=True, exist_ok=True)
    record = {"cells": args.cells, "new": args.new, "repeats": args.repeats, "ms": {**once, **medians},
              "rounds": rounds, "python": platform.python_version(), "machine": platform.machine()}
    (args.out / f"mirror-{stamp}-cpu.json").write_text(json.dumps(record, indent=2) + "\n")
    (args.out / f"mirror-{stamp}-cpu.txt").write_text(text.getvalue())


if __name__ == "__main__":
    main()
