"""How far one database carries a sweep: simulated workers against SQLite and a real PostgreSQL (no torch).

A simulated worker does to the database what a sweep's worker does (flctl.launch.worker), with the cell's training
replaced by a sleep: it claims the sweep's next cell (RunQueue.claim_next), sleeps the cell's time (--cell-s, +-50 %),
beats its heartbeat every --heartbeat-s meanwhile (RunQueue.beat; about one beat a cell by default, where a real
cell of minutes beats every 30 s), and records the cell's end (RunQueue.finish_runs with an Ended). Each one has a Store of its own (its own engine and
connection); they run as threads, --procs processes of them (200 workers on 2 cores), each process under a host name
of its own ("sim-<k>"), as workers on separate nodes are: a lost worker's cells come back by the stale bound
(--stale-s, 2 s), not by this host's process table. A worker that finds nothing to claim waits and asks again
until the sweep is done (flctl's waits and its next launch do that for real workers), so the cells of killed
workers are taken back by the others.

Each run (a backend, a sweep size, a number of workers) records a fresh sweep through Store.create_sweep (rows
exactly as flctl writes them), lets the workers go until every cell is completed or --seconds is up, and kill -9s a
quarter of the worker processes half-way (half the cells done or half the time gone; not with one process). It
reports claims a second, a claim's latency p50/p99 (the call, in the worker: on 2 shared cores that is mostly
waiting for a core), claim-and-finish pairs a second, the PostgreSQL server's CPU (utime+stime of its processes
from /proc, before/after; the whole server's, so run it on a server of its own) and per pair, the most connections
to the database at once (pg_stat_activity, sampled), cells claimed twice (the database confirmed a claim, by a beat
or a finish begun after another claim of the cell was granted, or a cell finished twice) and cells lost (not
completed once the workers stopped making progress, or after the sweep drained). Both must be 0: the script exits
1 otherwise.

    python benchmarks/bench_scale.py                        # 1k/10k/100k cells x 1/8/64/200 workers x both backends
    python benchmarks/bench_scale.py --sizes 1000,10000 --workers 1,8 --backend sqlite,postgresql
    python benchmarks/bench_scale.py --quick --out /tmp/x   # a smoke run: seconds

PostgreSQL: --pg-url (FLCTL_TEST_PG), a server where a database may be created per run (dropped after); 200 workers
want max_connections above 200, e.g. a server of its own:
FLCTL_PG_PORT=55433 FLCTL_PG_MAX_CONNECTIONS=400 .ci/postgres.sh /tmp/flctl-bench-pg. Backend "pgbouncer": the same
database through --bouncer-url (FLCTL_TEST_PGBOUNCER, .ci/pgbouncer.sh).

Targets: a claim's p99 at 100,000 cells within 1.5x of its p99 at 1,000 (each backend: one worker alone on each size
in alternating rounds, so that the machine's load hits both alike; the matrix's runs print theirs too); 200 workers
on one PostgreSQL >= 500 claim-and-finish pairs a second, none claimed twice, none lost, at most one connection per
worker and the launcher's. Writes benchmarks/results/scale-<date>-cpu.json and .txt (what it printed).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_P99_RATIO, TARGET_PAIRS, BIG_WORKERS = 1.5, 500, 200
SWEEP, MAX_ATTEMPTS, IDLE_S = "scale", 3, 0.2     # IDLE_S: a worker with nothing to claim asks again after this


# ---- a worker process: simulated workers as its threads ----

def worker_process(spec: dict) -> None:
    """A worker process (``_worker``): ``spec["threads"]`` simulated workers, each with a Store of its own. Says
    "ready" once they are open, starts them on "go" and stops them on "stop" (its stdin); what each does is appended
    to ``spec["log"]`` as it happens, a line a flush, so a kill -9 loses nothing the database was told."""
    import socket

    socket.gethostname = lambda: spec["host"]    # a node of its own: its lost cells come back by the stale bound
    from flctl.db import Store

    stores = [Store.open(spec["url"], create=False) for _ in range(spec["threads"])]
    log, lock = open(spec["log"], "a", buffering=1), threading.Lock()

    def note(*fields: Any) -> None:
        with lock:
            log.write(json.dumps(fields) + "\n")

    go, stop = threading.Event(), threading.Event()
    threads = [threading.Thread(target=simulate, args=(store, spec, note, go, stop, k)) for k, store in enumerate(stores)]
    for t in threads:
        t.start()
    print("ready", flush=True)
    for command in sys.stdin:
        (go if command.strip() == "go" else stop).set()
        if stop.is_set():
            break
    go.set()
    stop.set()          # "stop", or stdin closed: the launcher is gone
    for t in threads:
        t.join()


def simulate(store: Any, spec: dict, note: Any, go: threading.Event, stop: threading.Event, k: int) -> None:
    """One simulated worker: claim a cell, sleep its time beating every heartbeat period, finish it; again until
    told to stop. Log lines: c (claimed: run, token, call start, return), b (beat: run, token, call start, held),
    f (finished: run, token, call start, return, recorded), e (nothing to claim), x (an error)."""
    from flctl.db import Ended, RunQueue

    queue, rng = RunQueue(store), random.Random(f"{spec['host']}-{k}")
    go.wait()
    while not stop.is_set():
        try:
            t0 = time.monotonic()
            got = queue.claim_next(SWEEP, max_attempts=MAX_ATTEMPTS, stale_after=spec["stale_s"])
            t1 = time.monotonic()
            if not got:
                note("e", t0, t1)
                stop.wait(IDLE_S)
                continue
            run_id, token = got[0].cfg.run_id, got[0].token
            note("c", run_id, token, t0, t1)
            cell = spec["cell_s"] * rng.uniform(0.5, 1.5)
            if not _train(queue, run_id, token, t1 + cell, spec["heartbeat_s"], note):
                continue            # the claim was lost (taken over): a real worker stops training the cell
            f0 = time.monotonic()
            lost = queue.finish_runs({run_id: Ended(token, "completed", 1, {"train.avg_loss": 0.5}, None, 0,
                                                    {"records": f"records/run_id={run_id}"}, cell)})
            note("f", run_id, token, f0, time.monotonic(), run_id not in lost)
        except Exception as exc:   # noqa: BLE001 - counted in the report; the worker goes on, as a new one would
            note("x", time.monotonic(), f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            stop.wait(IDLE_S)
    store.close()


def _train(queue: Any, run_id: str, token: str, end: float, period: float, note: Any) -> bool:
    """Sleep until ``end``, beating every ``period`` (RunQueue.beat, as a worker's heartbeat thread does for all the
    cells it holds); False when a beat finds the claim gone."""
    due = time.monotonic() + period
    while (now := time.monotonic()) < end:
        time.sleep(max(0.0, min(end, due) - now))
        if due <= (b0 := time.monotonic()) < end:
            held = run_id in queue.beat({run_id: token})
            note("b", run_id, token, b0, held)
            if not held:
                return False
            due += period
    return True


# ---- the launcher: a run's workers, watched ----

class Watcher:
    """The launcher's look at the database while workers run: cells completed (a connection kept: the launcher's),
    the most connections to the database at once (PostgreSQL: pg_stat_activity sampled every 0.1 s on a connection
    of its own, not counted), and the server's CPU seconds (its processes' utime+stime from /proc, exited backends'
    in the postmaster's cutime+cstime)."""

    def __init__(self, url: str) -> None:
        import sqlalchemy as sa

        from flctl.db import normalize_url

        self.engine = sa.create_engine(normalize_url(url), pool_size=2, max_overflow=0)
        self.pg = self.engine.dialect.name == "postgresql"
        self.most, self.postmaster, self.done = 0, None, threading.Event()
        if self.pg:
            with self.engine.connect() as conn:
                backend = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
            self.postmaster = _stat(backend)[1] if _stat(backend) else None
            self.sampler = threading.Thread(target=self._sample, daemon=True)
            self.sampler.start()

    def _sample(self) -> None:
        with self.engine.connect() as conn:
            while not self.done.wait(0.1):
                n = conn.exec_driver_sql("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                         "AND backend_type = 'client backend' AND pid <> pg_backend_pid()").scalar()
                conn.rollback()
                self.most = max(self.most, int(n or 0))

    def completed(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.exec_driver_sql("SELECT count(*) FROM runs WHERE status = 'completed'").scalar() or 0)

    def cpu_s(self) -> float | None:
        """The server's CPU seconds so far (None: not PostgreSQL, or its processes not readable here)."""
        if self.postmaster is None or (own := _stat(self.postmaster, children=True)) is None:
            return None
        total = own[0]
        for entry in os.scandir("/proc"):
            if entry.name.isdigit() and (st := _stat(int(entry.name))) is not None and st[1] == self.postmaster:
                total += st[0]
        return total

    def close(self) -> None:
        self.done.set()
        if self.pg:
            self.sampler.join()
        self.engine.dispose()


def _cpu_of(processes: list) -> float:
    """The CPU seconds the ``processes`` (Popen objects or pids) have used so far (those still there)."""
    return sum(st[0] for p in processes if (st := _stat(getattr(p, "pid", p))) is not None)


def _stat(pid: int, children: bool = False) -> tuple[float, int] | None:
    """(utime+stime seconds, with its reaped children's where ``children``; parent pid) of a process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if children else 0)
    return ticks / os.sysconf("SC_CLK_TCK"), int(fields[1])


def run_workers(url: str, direct: str | None, size: int, workers: int, args: argparse.Namespace,
                logs: Path) -> dict:
    """Start the workers (processes of threads), let them go until the sweep is done, the time is up or no cell has
    been completed for a while (stalled), kill -9 a quarter of the processes half-way; what the launcher saw."""
    procs = min(args.procs, workers)
    split = [workers // procs + (1 if i < workers % procs else 0) for i in range(procs)]
    children = []
    for i, threads in enumerate(split):
        spec = {"url": url, "threads": threads, "host": f"sim-{i}", "log": str(logs / f"w{i}.jsonl"),
                "cell_s": args.cell_s, "heartbeat_s": args.heartbeat_s, "stale_s": args.stale_s}
        children.append(subprocess.Popen([sys.executable, __file__, "_worker", json.dumps(spec)], text=True,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE))
    for child in children:
        if child.stdout.readline().strip() != "ready":     # its traceback is on stderr
            raise SystemExit(f"a worker process did not start (exit {child.wait()})")
    watcher = Watcher(direct or url)
    cpu0, workers0 = watcher.cpu_s(), _cpu_of(children)
    for child in children:
        child.stdin.write("go\n")
        child.stdin.flush()
    start = time.monotonic()
    state, killed, killed_cpu = _watch(watcher, children, size, start, args)
    end, cpu1, workers1 = time.monotonic(), watcher.cpu_s(), _cpu_of(children) + killed_cpu
    for i, child in enumerate(children):
        if i not in killed:
            child.stdin.write("stop\n")
            child.stdin.close()
    for child in children:
        child.wait(timeout=120)
    watcher.close()
    return {"start": start, "end": end, "state": state, "killed": [f"w{i}" for i in killed],
            "workers_cpu_s": workers1 - workers0,
            "cpu_s": None if cpu0 is None or cpu1 is None else cpu1 - cpu0,
            "max_connections": watcher.most if watcher.pg else None}


def _watch(watcher: Watcher, children: list, size: int, start: float,
           args: argparse.Namespace) -> tuple[str, list[int], float]:
    """Until drained, out of time or stalled (no cell completed for 3 stale bounds and 2 s): how it ended, the
    processes killed and the CPU seconds they had used by then."""
    killed: list[int] = []
    done, progress, killed_cpu = 0, start, 0.0
    while True:
        time.sleep(0.25)
        now, was = time.monotonic(), done
        done = watcher.completed()
        progress = now if done != was else progress
        if not killed and not args.no_kill and len(children) > 1 and (done >= size / 2
                                                                       or now - start >= args.seconds / 2):
            killed = random.Random(size).sample(range(len(children)), max(1, len(children) // 4))
            for i in killed:
                killed_cpu += _cpu_of([children[i]])
                children[i].kill()
                children[i].wait()
        if done >= size:
            return "drained", killed, killed_cpu
        if now - start >= args.seconds:
            return "time", killed, killed_cpu
        if now - progress > 3 * args.stale_s + 2:
            return "stalled", killed, killed_cpu


# ---- what the logs and the database say ----

def judge(logs: Path, seen: dict, url: str, stale_s: float) -> dict:
    """The run's numbers from the workers' logs and the database's end state."""
    claims, latencies, finished, counts = _read(logs, seen["start"], seen["end"])
    twice, held = _twice(claims, finished, set(seen["killed"]))
    seconds = seen["end"] - seen["start"]
    q = statistics.quantiles(latencies, n=100, method="inclusive") if len(latencies) > 1 else [0.0] * 99
    return {"seconds": round(seconds, 2), "state": seen["state"], "drained": seen["state"] == "drained",
            "claims_per_s": counts["claims"] / seconds, "claim_p50_ms": q[49], "claim_p99_ms": q[98],
            "pairs_per_s": counts["pairs"] / seconds, "server_cpu_s": seen["cpu_s"], "server_core_ms_per_pair":
                None if seen["cpu_s"] is None else 1000 * seen["cpu_s"] / max(1, counts["pairs"]),
            "workers_cpu_s": round(seen["workers_cpu_s"], 2),
            "workers_core_ms_per_pair": 1000 * seen["workers_cpu_s"] / max(1, counts["pairs"]),
            "max_connections": seen["max_connections"], "claimed_twice": twice,
            "killed_processes": len(seen["killed"]), **_left(url, seen["state"], stale_s, held),
            "empty_claims": counts["e"], "beats": counts["b"], "errors": counts["x"],
            "taken_from_live": counts["taken_from_live"]}


def _read(logs: Path, start: float, end: float) -> tuple[dict, list[float], Counter, Counter]:
    """The workers' logs read (a line cut by kill -9 skipped): each claim (run id, token) -> when it was granted,
    when the database last confirmed it (the start of its last beat or finish that found its token), whether it
    finished, its process; the latencies (ms) of the claims granted in [start, end]; the cells' recorded finishes;
    counts of each kind of line, and of claims and pairs in [start, end]."""
    claims: dict[tuple[str, str], dict] = {}
    latencies: list[float] = []
    finished: Counter = Counter()
    counts: Counter = Counter()
    for path in sorted(logs.glob("w*.jsonl")):
        for text in path.read_text().splitlines():
            try:
                kind, *ev = json.loads(text)
            except ValueError:
                continue
            counts[kind] += 1
            if kind == "c":
                claims[(ev[0], ev[1])] = {"granted": ev[3], "confirmed": None, "ok": False, "proc": path.stem}
                if start <= ev[3] <= end:
                    counts["claims"] += 1
                    latencies.append(1000 * (ev[3] - ev[2]))
            elif kind in ("b", "f") and ev[-1]:
                c = claims[(ev[0], ev[1])]
                c["confirmed"] = max(c["confirmed"] or 0.0, ev[2])
                if kind == "f":
                    c["ok"] = True
                    finished[ev[0]] += 1
                    counts["pairs"] += start <= ev[3] <= end
            elif kind in ("b", "f"):
                counts["taken_from_live"] += 1
    return claims, latencies, finished, counts


def _twice(claims: dict, finished: Counter, killed: set[str]) -> tuple[int, dict[str, int]]:
    """(cells claimed twice, the cells a killed process held when it died: run id -> which of the cell's logged
    claims that was, 1 the first). Twice: a cell finished twice, or whose claim the database confirmed (a beat or a
    finish that found its token, begun after) while a later claim of it had been granted (its call returned): two
    live claims at once."""
    by_run: dict[str, list[dict]] = {}
    for (run_id, _), c in claims.items():
        by_run.setdefault(run_id, []).append(c)
    twice = {run_id for run_id, n in finished.items() if n > 1}
    held: dict[str, int] = {}
    for run_id, cs in by_run.items():
        cs.sort(key=lambda c: c["granted"])
        if any(a["confirmed"] is not None and a["confirmed"] > b["granted"] for a, b in zip(cs, cs[1:])):
            twice.add(run_id)
        held.update((run_id, k) for k, c in enumerate(cs, 1) if c["proc"] in killed and not c["ok"])
    return len(twice), held


def _left(url: str, state: str, stale_s: float, held: dict[str, int]) -> dict[str, int]:
    """What the database says at the end, a stale bound after every worker stopped (each killed worker's heartbeat is
    stale by then): cells not completed; lost: not completed though the workers had time (drained or stalled), or,
    when the time ran out, that no claim could take any more (failed, out of attempts, or running under a fresh
    heartbeat); of the cells killed workers held (``held``), those another claim took back (more attempts than the
    killed one's) and those the killed worker had finished as it died (its log line lost with it)."""
    from datetime import UTC

    from sqlalchemy import select

    from flctl.db import Store
    from flctl.db.liveness import db_now
    from flctl.db.schema import Run
    from flctl.status import TO_DO, Status

    time.sleep(stale_s + 0.5)
    store = Store.open(url, readonly=True)
    with store.session() as s:
        rows = s.execute(select(Run.status, Run.attempts, Run.heartbeat_at).where(Run.status != Status.COMPLETED)).all()
        killed = {run_id: (status, attempts) for run_id, status, attempts in s.execute(
            select(Run.id, Run.status, Run.attempts).where(Run.id.in_(list(held))))}
        at = db_now(s)
    store.close()

    def claimable(status: str, attempts: int, beat: Any) -> bool:
        stale = beat is None or (at - (beat if beat.tzinfo else beat.replace(tzinfo=UTC))).total_seconds() > stale_s
        return attempts < MAX_ATTEMPTS and (status in TO_DO or status == Status.RUNNING and stale)
    back = sum(killed[run_id][1] > k for run_id, k in held.items())
    finished = sum(killed[run_id] == (Status.COMPLETED, k) for run_id, k in held.items())
    return {"unfinished": len(rows), "lost": len(rows) if state != "time" else sum(not claimable(*r) for r in rows),
            "killed_cells": len(held) - finished, "taken_back": back, "finished_as_killed": finished}


def configs(n: int) -> list:
    """``n`` distinct two-moons ERM cells (lr x seed), resolved as flctl resolves a sweep's."""
    from flctl.config import resolve
    from flctl.tasks import get_task

    task = get_task("two-moons")
    return [resolve(task, "erm", {"lr": round(1e-4 * (1 + i % 1000), 6), "seed": i // 1000}) for i in range(n)]


class Databases:
    """A fresh database per run: a SQLite file, or one created on the PostgreSQL server (reached directly or through
    PgBouncer), dropped after."""

    def __init__(self, tmp: Path, pg_url: str | None, bouncer_url: str | None) -> None:
        self.tmp, self.pg_url, self.bouncer_url, self.made = tmp, pg_url, bouncer_url, 0

    def make(self, backend: str) -> tuple[str, str | None]:
        """The new database's URL, and the direct URL of the server's database (None: SQLite)."""
        self.made += 1
        if backend == "sqlite":
            return f"sqlite:///{self.tmp / f'scale{self.made}.db'}", None
        base = self.pg_url if backend == "postgresql" else self.bouncer_url
        if not base or not self.pg_url:
            raise SystemExit(f"backend {backend}: give --pg-url" + (" and --bouncer-url" if backend == "pgbouncer"
                                                                    else "") + " (FLCTL_TEST_PG, FLCTL_TEST_PGBOUNCER)")
        name = f"flctl_scale_{os.getpid()}_{self.made}"
        self._admin(f"CREATE DATABASE {name}")
        return base.rsplit("/", 1)[0] + "/" + name, self.pg_url.rsplit("/", 1)[0] + "/" + name

    def drop(self, direct: str | None) -> None:
        if direct is not None:
            self._admin(f"DROP DATABASE {direct.rsplit('/', 1)[1]} WITH (FORCE)")

    def max_connections(self) -> int:
        return int(self._admin("SHOW max_connections"))

    def _admin(self, sql: str) -> str | None:
        import sqlalchemy as sa

        from flctl.db import normalize_url

        engine = sa.create_engine(normalize_url(self.pg_url or ""), isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                res = conn.exec_driver_sql(sql)
                return str(res.scalar()) if res.returns_rows else None
        finally:
            engine.dispose()


def run_one(dbs: Databases, backend: str, size: int, workers: int, args: argparse.Namespace) -> dict:
    """One run: a fresh sweep of ``size`` cells, ``workers`` simulated workers until it is done or time is up."""
    from flctl.db import Store

    url, direct = dbs.make(backend)
    try:
        cells = configs(size)
        store = Store.open(url)
        began = time.perf_counter()
        store.create_sweep(SWEEP, SWEEP, "two-moons", {}, cells)
        created_s = time.perf_counter() - began
        store.close()
        with tempfile.TemporaryDirectory(prefix="scale-logs-") as logs:
            seen = run_workers(url, direct, size, workers, args, Path(logs))
            row = judge(Path(logs), seen, url, args.stale_s)
    finally:
        dbs.drop(direct)
    return {"backend": backend, "cells": size, "workers": workers, "create_sweep_s": round(created_s, 2), **row}


def call_costs(dbs: Databases, n: int) -> dict:
    """What one claim, one beat, one fence read (RunQueue.held) and one finish cost the PostgreSQL server (its backend's CPU from /proc) and the
    worker (its process's CPU), one worker alone on a sweep of ``n`` cells: with flctl's engine arguments (no
    statement prepared on the server, for PgBouncer) and with psycopg's default (prepared after 5 runs)."""
    import sqlalchemy as sa

    from flctl.db import Ended, RunQueue, Store, normalize_url
    from flctl.db.postgres import PostgreSQL

    out = {}
    for name, threshold in (("flctl", None), ("prepared", 5)):
        url, direct = dbs.make("postgresql")
        try:
            Store.open(url).create_sweep(SWEEP, SWEEP, "two-moons", {}, configs(n))
            args = PostgreSQL().engine_args(readonly=False)
            args["connect_args"] = {**args["connect_args"], "prepare_threshold": threshold}
            store = Store(sa.create_engine(normalize_url(url), pool_pre_ping=True, **args))
            queue = RunQueue(store)
            with store.engine.connect() as conn:
                backend = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
            calls = {"claim": lambda _: queue.claim_next(SWEEP, max_attempts=MAX_ATTEMPTS)[0],
                     "beat": lambda c: queue.beat({c.cfg.run_id: c.token}),
                     "held": lambda c: queue.held({c.cfg.run_id: c.token}),     # the fence: a write's check
                     "finish": lambda c: queue.finish_runs({c.cfg.run_id: Ended(c.token, "completed", 1, {}, None, 0,
                                                                                 {"records": "r"}, 0.1)})}
            claims: list[Any] = list(range(n))
            out[name] = {}
            for what, call in calls.items():
                server, client = _cpu_of([backend]), time.process_time()
                got = [call(c) for c in claims]
                out[name][what] = {"server_ms": 1000 * (_cpu_of([backend]) - server) / n,
                                   "worker_ms": 1000 * (time.process_time() - client) / n}
                claims = got if what == "claim" else claims
            store.close()
        finally:
            dbs.drop(direct)
    return out


def claim_latency(dbs: Databases, backend: str, small: int, big: int, rounds: int = 8, each: int = 100) -> dict:
    """A claim's latency on a sweep of ``small`` cells and on one of ``big``, one worker alone on each, in rounds
    that alternate between them (``each`` claims, each finished, a round), so that the machine's load hits both
    alike: the matrix's runs measure each size in a window of its own, minutes apart, and on a shared machine the
    p99 of one window is a few slow claims of its own. Latency in ms; the ratio of the p99s."""
    from flctl.db import Ended, RunQueue, Store

    each = min(each, small // rounds)          # the small sweep is not drained: a claim of its last cells differs
    made, queues, took = [], {}, {small: [], big: []}
    try:
        for n in (small, big):
            url, direct = dbs.make(backend)
            made.append(direct)
            Store.open(url).create_sweep(SWEEP, SWEEP, "two-moons", {}, configs(n))
            queues[n] = RunQueue(Store.open(url))
        for _ in range(rounds):
            for n, queue in queues.items():
                for _ in range(each):
                    began = time.perf_counter()
                    c = queue.claim_next(SWEEP, max_attempts=MAX_ATTEMPTS)[0]
                    took[n].append(1000 * (time.perf_counter() - began))
                    queue.finish_runs({c.cfg.run_id: Ended(c.token, "completed", 1, {}, None, 0, {}, 0.0)})
    finally:
        for queue in queues.values():
            queue.store.close()
        for direct in made:
            dbs.drop(direct)
    q = {n: statistics.quantiles(t, n=100, method="inclusive") for n, t in took.items()}
    return {"backend": backend, "small": small, "big": big, "claims_each": rounds * each,
            "p50_ms": {n: v[49] for n, v in q.items()}, "p99_ms": {n: v[98] for n, v in q.items()},
            "p99_ratio": q[big][98] / q[small][98]}


def line(r: dict) -> str:
    """A run's row of the table (HEADER)."""
    server = "-" if r["server_cpu_s"] is None else f"{r['server_core_ms_per_pair']:.2f}"
    conns = "-" if r["max_connections"] is None else str(r["max_connections"])
    state = "drained" if r["drained"] else f"{r['state']}, {r['unfinished']:,} left"
    return (f"{r['backend']:10s} {r['cells']:>7,} {r['workers']:>4} {r['create_sweep_s']:>7.1f} {r['seconds']:>6.1f} "
            f"{state:>18s} {r['claims_per_s']:>8.1f} {r['claim_p50_ms']:>7.1f} {r['claim_p99_ms']:>8.1f} "
            f"{r['pairs_per_s']:>8.1f} {server:>7s} {r['workers_core_ms_per_pair']:>7.2f} {conns:>5s} "
            f"{r['claimed_twice']:>5} {r['lost']:>4} {r['killed_processes']:>2}/{r['killed_cells']}/{r['taken_back']}")


HEADER = (f"{'backend':10s} {'cells':>7} {'wkrs':>4} {'create':>7} {'secs':>6} {'state':>18} {'claims/s':>8} "
          f"{'p50 ms':>7} {'p99 ms':>8} {'pairs/s':>8} {'server':>7} {'workers':>7} {'conns':>5} {'twice':>5} "
          f"{'lost':>4} killed\n"
          f"{'':10s} {'':>7} {'':>4} {'sweep s':>7} {'':>6} {'':>18} {'':>8} {'claim':>7} {'claim':>8} {'':>8} "
          f"{'CPU ms/pair':>15} {'most':>5} {'':>5} {'':>4} procs/cells/back")


def targets(rows: list[dict], latency: list[dict]) -> list[str]:
    """The targets' verdicts, one line each, for what was measured: the p99 of a claim by size from the alternating
    rounds (claim_latency), each worker count's of the runs beside them (in windows of their own: informative)."""
    out = []
    for r in latency:
        small, big = r["small"], r["big"]
        out.append(f"{r['backend']}, one worker, alternating rounds: claim p99 at {big:,} cells {r['p99_ms'][big]:.1f} "
                   f"ms vs {r['p99_ms'][small]:.1f} ms at {small:,}: {r['p99_ratio']:.2f}x (target <= "
                   f"{TARGET_P99_RATIO}x) " + ("MET" if r["p99_ratio"] <= TARGET_P99_RATIO else "MISSED"))
    by = {(r["backend"], r["cells"], r["workers"]): r for r in rows}
    for (backend, cells, workers), r in sorted(by.items()):
        small = by.get((backend, 1000, workers))
        if cells == 100_000 and small is not None:
            out.append(f"{backend}, {workers} workers, runs of their own: claim p99 at 100,000 cells "
                       f"{r['claim_p99_ms']:.1f} ms vs {small['claim_p99_ms']:.1f} ms at 1,000: "
                       f"{r['claim_p99_ms'] / small['claim_p99_ms']:.2f}x")
        if backend == "postgresql" and workers == BIG_WORKERS:
            ok = (r["pairs_per_s"] >= TARGET_PAIRS and r["claimed_twice"] == 0 and r["lost"] == 0
                  and r["max_connections"] <= workers + 1)
            out.append(f"postgresql, {workers} workers, {cells:,} cells: {r['pairs_per_s']:.0f} pairs/s (target >= "
                       f"{TARGET_PAIRS}), {r['claimed_twice']} twice, {r['lost']} lost, {r['max_connections']} "
                       f"connections (target <= {workers + 1}) " + ("MET" if ok else "MISSED"))
    return out


def _commit() -> str:
    return subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers separated by commas") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: each must be at least 1")
    return values


def _backends(text: str) -> list[str]:
    names = text.split(",")
    if not set(names) <= {"sqlite", "postgresql", "pgbouncer"}:
        raise argparse.ArgumentTypeError(f"{text!r}: choose among sqlite, postgresql, pgbouncer")
    return names


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=_ints, default=[1000, 10_000, 100_000], help="sweep sizes (cells)")
    ap.add_argument("--workers", type=_ints, default=[1, 8, 64, BIG_WORKERS], help="simulated workers")
    ap.add_argument("--backend", type=_backends, default=["sqlite", "postgresql"])
    ap.add_argument("--seconds", type=float, default=60.0, help="the most a run lasts (workers go)")
    ap.add_argument("--cell-s", type=float, default=0.1, help="a cell's mean time (+-50 %%)")
    ap.add_argument("--heartbeat-s", type=float, default=0.05)
    ap.add_argument("--stale-s", type=float, default=2.0, help="the stale bound the claims are made with")
    ap.add_argument("--procs", type=int, default=8, help="worker processes at most (workers are their threads)")
    ap.add_argument("--no-kill", action="store_true", help="kill no worker process half-way")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 300 cells, 6 workers, 3 processes")
    ap.add_argument("--pg-url", default=os.environ.get("FLCTL_TEST_PG"))
    ap.add_argument("--bouncer-url", default=os.environ.get("FLCTL_TEST_PGBOUNCER"))
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    if args.quick:
        args.sizes, args.workers, args.procs, args.seconds, args.cell_s = [300], [6], 3, 30.0, 0.05
    if not (args.heartbeat_s < args.stale_s and args.cell_s > 0 and args.seconds > 0 and args.procs > 0):
        ap.error("--heartbeat-s must be below --stale-s, and --cell-s, --seconds, --procs above 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    out: dict = {"date": datetime.date.today().isoformat(), "commit": _commit(), "cores": len(os.sched_getaffinity(0)),
                 "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                              if k not in ("pg_url", "bouncer_url")}, "runs": []}
    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        dbs = Databases(Path(tmp), args.pg_url, args.bouncer_url)
        if {"postgresql", "pgbouncer"} & set(args.backend) and dbs.pg_url:
            out["server"] = {k: dbs._admin(f"SHOW {k}") for k in ("server_version", "max_connections", "fsync",
                                                                    "synchronous_commit")}
            say("PostgreSQL " + ", ".join(f"{k} {v}" for k, v in out["server"].items()))
            if "postgresql" in args.backend and int(out["server"]["max_connections"]) < max(args.workers) + 5:
                raise SystemExit(f"the server allows {out['server']['max_connections']} connections; "
                                 f"{max(args.workers)} workers want {max(args.workers) + 5} (see --help)")
        if "postgresql" in args.backend:
            out["call_costs"] = costs = call_costs(dbs, 300 if args.quick else 2000)
            for name, calls in costs.items():
                say(f"one worker alone, {name:8s}: " + ", ".join(
                    f"{what} {c['server_ms']:.2f} ms server / {c['worker_ms']:.2f} ms worker CPU"
                    for what, c in calls.items()))
        if len(args.sizes) > 1 and not args.quick:
            out["claim_latency"] = [claim_latency(dbs, backend, min(args.sizes), max(args.sizes))
                                    for backend in args.backend]
        say(HEADER)
        for backend in args.backend:
            for size in args.sizes:
                for workers in args.workers:
                    out["runs"].append(r := run_one(dbs, backend, size, workers, args))
                    say(line(r))
    for verdict in targets(out["runs"], out.get("claim_latency", [])):
        say(verdict)
    bad = [r for r in out["runs"] if r["claimed_twice"] or r["lost"]]
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"scale-{out['date']}-cpu"
    stem.with_suffix(".json").write_text(json.dumps(out, indent=1) + "\n")
    stem.with_suffix(".txt").write_text("\n".join(lines) + "\n")
    print(f"wrote {stem}.json")
    if bad:
        print(f"{len(bad)} run(s) claimed a cell twice or lost one", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["_worker"]:
        worker_process(json.loads(sys.argv[2]))
    else:
        sys.exit(main())
