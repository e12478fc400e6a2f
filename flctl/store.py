"""The run database (SQLAlchemy 2): SQLite under ``results/`` by default, PostgreSQL by URL.

One row per run, keyed by the run id (a prefix of the canonical config hash), with the resolved config,
status, timings, host, git revision, summary metrics and artifact paths. The schema is versioned in the
``flctl_meta`` table; opening a database written by another schema version fails with a clear message.
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
import socket
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import (
    JSON,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    create_engine,
    delete,
    event,
    func,
    insert,
    inspect,
    select,
    update,
)
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DBAPIError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship, sessionmaker

from flctl.config import ConfigError, RunConfig
from flctl.status import TO_DO

# 2: managed by Alembic revisions (flctl.migrations); 1: the schema before them, which the baseline revision is.
# A flctl that expects 1 refuses a database at 2 with its own message, instead of missing newer columns.
SCHEMA_VERSION = 2
# A running run whose heartbeat is older than this is presumed lost (killed, node gone) and may be re-claimed.
STALE_AFTER_S = float(os.environ.get("FLCTL_STALE_AFTER", "300"))
HEARTBEAT_S = float(os.environ.get("FLCTL_HEARTBEAT", "30"))
T = TypeVar("T")


class StoreError(RuntimeError):
    """The database cannot be used (unreachable, corrupt, other schema); the message is one line."""


class _Unopenable(StoreError):
    """SQLite could not open the file at all (e.g. a read-only folder for a read-only open)."""


class Base(DeclarativeBase):
    pass


class Meta(Base):
    __tablename__ = "flctl_meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(256))


class Run(Base):
    __tablename__ = "runs"
    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    config_hash: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    task: Mapped[str] = mapped_column(String(64), index=True)
    method: Mapped[str] = mapped_column(String(16), index=True)
    seed: Mapped[int] = mapped_column(Integer)
    config: Mapped[dict] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), index=True, default="queued")
    epochs_done: Mapped[int] = mapped_column(Integer, default=0)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    host: Mapped[str | None] = mapped_column(String(255))
    pid: Mapped[int | None] = mapped_column(Integer)
    job_id: Mapped[str | None] = mapped_column(String(64))   # submitit/Slurm job running it, if any
    git_sha: Mapped[str | None] = mapped_column(String(64))
    device: Mapped[str | None] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    duration_s: Mapped[float | None] = mapped_column(Float)
    metrics: Mapped[dict | None] = mapped_column(JSON)
    diverged_at: Mapped[dict | None] = mapped_column(JSON)
    lambda_capped: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    # {"engine": eager | captured | compiled | vmap, "cells_together": K, "device": the device's name}
    trained_with: Mapped[dict | None] = mapped_column(JSON)
    artifacts: Mapped[list[Artifact]] = relationship(back_populates="run", cascade="all, delete-orphan",
                                                       lazy="selectin")

    def record(self) -> RunRecord:
        d = {c.key: getattr(self, c.key) for c in inspect(Run).column_attrs}
        for k in ("created_at", "started_at", "finished_at", "heartbeat_at"):
            d[k] = d[k].isoformat() if d[k] else None
        d["metrics"] = d["metrics"] or {}
        d["artifacts"] = {a.kind: a.path for a in self.artifacts}
        return RunRecord(**d)


@dataclass(frozen=True)
class RunRecord:
    """One run as the database holds it: what reports and commands read. Its fields are the ``runs`` table's
    columns (times as ISO strings) plus ``artifacts``; ``cfg`` is its configuration as a RunConfig."""

    id: str
    config_hash: str
    task: str
    method: str
    seed: int
    config: dict[str, Any]            # the RunConfig as stored (JSON)
    status: str
    epochs_done: int
    attempts: int
    host: str | None
    pid: int | None
    job_id: str | None
    git_sha: str | None
    device: str | None
    created_at: str
    started_at: str | None
    finished_at: str | None
    heartbeat_at: str | None
    duration_s: float | None
    metrics: dict[str, float]          # summary metrics, "train.avg_loss", ...; {} until the run ends
    diverged_at: dict | None
    lambda_capped: int | None
    error: str | None
    trained_with: dict[str, Any] | None   # engine, cells_together, device (flctl.cell.RunResult)
    artifacts: dict[str, str]          # kind (records, model, extras) -> path

    @property
    def cfg(self) -> RunConfig:
        return RunConfig.from_json(self.config)

    def to_json(self) -> dict[str, Any]:
        """A plain dict for --json output."""
        return dataclasses.asdict(self)


class Artifact(Base):
    __tablename__ = "artifacts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(32))      # records | model | extras | ...
    path: Mapped[str] = mapped_column(Text)
    run: Mapped[Run] = relationship(back_populates="artifacts")


class Sweep(Base):
    __tablename__ = "sweeps"
    id: Mapped[str] = mapped_column(String(12), primary_key=True)
    name: Mapped[str | None] = mapped_column(String(128), index=True)
    task: Mapped[str] = mapped_column(String(64))
    spec: Mapped[dict] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    submissions: Mapped[int] = mapped_column(Integer, default=0)


class SweepCell(Base):
    """Membership of a run in a sweep; a run may belong to several sweeps (dedup by config hash)."""

    __tablename__ = "sweep_cells"
    sweep_id: Mapped[str] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True, index=True)


def now() -> datetime:
    return datetime.now(UTC)


def normalize_url(url: str) -> str:
    # psycopg 3 is the driver we ship; plain postgresql:// would ask SQLAlchemy for psycopg2.
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    # WAL lets readers run beside one writer; busy_timeout makes a locked writer wait instead of failing.
    # The driver's own transaction handling is turned off so that _sqlite_begin decides how to begin.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def _sqlite_pragmas_readonly(dbapi_conn, _record) -> None:
    # As _sqlite_pragmas, without switching the journal mode (a write) on a database opened read-only.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


def _sqlite_begin_readonly(conn) -> None:
    conn.exec_driver_sql("BEGIN")


def _sqlite_begin(conn) -> None:
    # BEGIN IMMEDIATE takes the write lock up front (waiting up to busy_timeout). A deferred transaction that
    # reads and then writes can instead fail at once with SQLITE_BUSY when another process wrote in between.
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by its parent) still answers kill(0); it is dead for us.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _is_stale(run: Any, stale_after: float) -> bool:
    """A running run's worker is gone: its heartbeat is old, or it ran here and its process has exited."""
    if run.host == socket.gethostname() and run.pid is not None and not pid_alive(run.pid):
        return True
    beat = run.heartbeat_at
    if beat is None:
        return True
    if beat.tzinfo is None:  # SQLite returns naive datetimes; we store UTC
        beat = beat.replace(tzinfo=UTC)
    return (now() - beat).total_seconds() > stale_after


ID_PREFIX = re.compile(r"[0-9a-fA-F]{4,64}")


def is_id_prefix(text: str) -> bool:
    """Run and sweep ids are hex; a reference to one gives at least 4 and at most 64 of its digits."""
    return ID_PREFIX.fullmatch(text) is not None


def shown(text: str, limit: int = 24) -> str:
    """``text`` quoted for a one-line message, cut to ``limit`` characters."""
    return repr(text if len(text) <= limit else text[:limit - 3] + "...")


def _ambiguous(what: str, prefix: str, ids: list[str]) -> str:
    more = ", ..." if len(ids) > 5 else ""
    return f"{what} id prefix {prefix!r} matches several {what}s ({', '.join(ids[:5])}{more}); give more digits"


def _one_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    return str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__


class Store:
    """A handle on the run database. ``Store.open(url)`` checks it is reachable and of our schema."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.readonly = False
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @classmethod
    def open(cls, url: str, *, readonly: bool = False) -> Store:
        """Open (creating or upgrading as needed) the run database at ``url``. ``readonly``: for commands that
        only read (reports, listings): nothing is created, upgraded or written; SQLite opens the file read-only
        (and immutable when its folder cannot take the lock files), PostgreSQL in read-only transactions."""
        url = normalize_url(url)
        try:
            parsed = make_url(url)
        except Exception:
            raise StoreError(f"not a database URL: {url!r} (e.g. sqlite:///results/flctl.db, "
                             "postgresql://user@host/db)") from None
        shown_url = parsed.render_as_string(hide_password=True)
        sqlite = parsed.get_backend_name() == "sqlite"
        attempts = [url]
        if readonly and sqlite and parsed.database:
            target = f"sqlite:///file:{Path(parsed.database).resolve()}?uri=true&mode=ro"
            attempts = [target, target + "&immutable=1"]
        for target in attempts[:-1]:
            try:
                return cls._open(target, sqlite, shown_url, readonly)
            except _Unopenable:   # a read-only folder cannot take SQLite's lock files: read it as immutable
                pass
        return cls._open(attempts[-1], sqlite, shown_url, readonly)

    @classmethod
    def _open(cls, url: str, sqlite: bool, shown_url: str, readonly: bool) -> Store:
        kwargs: dict[str, Any] = {"pool_pre_ping": True}
        if sqlite:
            kwargs["connect_args"] = {"timeout": 30}
        elif url.startswith("postgresql"):
            kwargs["connect_args"] = {"connect_timeout": 10}
            if readonly:
                kwargs["connect_args"]["options"] = "-c default_transaction_read_only=on"
        try:
            engine = create_engine(url, **kwargs)
        except Exception as exc:  # unknown dialect or driver
            raise StoreError(f"cannot use database {shown_url}: {_one_line(exc)}") from None
        if sqlite:
            event.listen(engine, "connect", _sqlite_pragmas_readonly if readonly else _sqlite_pragmas)
            event.listen(engine, "begin", _sqlite_begin_readonly if readonly else _sqlite_begin)
        store = cls(engine)
        store.readonly = readonly
        try:
            store._check_schema()
        except StoreError:
            engine.dispose()
            raise
        except (SQLAlchemyError, DBAPIError) as exc:
            engine.dispose()
            error = _Unopenable if readonly and "unable to open database file" in str(exc) else StoreError
            raise error(f"cannot open database {shown_url}: {_one_line(exc)} "
                        "(check --db / FLCTL_DB, or move a corrupt file aside)") from None
        return store

    def _check_schema(self, scripts: Path | None = None) -> None:
        """Create a new database, or upgrade an flctl one in place (flctl.migrations); refuse anything else."""
        from flctl import migrations

        scripts = scripts or migrations.SCRIPTS
        with self.engine.connect() as conn:
            tables = set(inspect(conn).get_table_names())
            row = conn.execute(select(Meta.value).where(Meta.key == "schema_version")).scalar() \
                if "flctl_meta" in tables else None
        if row is not None and (not str(row).isdigit() or int(row) > SCHEMA_VERSION):
            raise StoreError(f"database schema v{row} is newer than this flctl (v{SCHEMA_VERSION}): "
                             "upgrade flctl (pip install -U flctl) to open it")
        try:
            older = "flctl_meta" in tables and migrations.needs_upgrade(self.engine, scripts)
        except migrations.NewerSchema as exc:
            raise StoreError(f"database schema revision {exc} is newer than this flctl knows: upgrade flctl "
                             "(pip install -U flctl) to open it") from None
        if self.readonly and ("flctl_meta" not in tables or row != str(SCHEMA_VERSION) or older):
            raise StoreError("the database is " + ("empty: not an flctl database yet" if not tables else
                             "not an flctl database" if "flctl_meta" not in tables else
                             "from an older flctl: a command that writes (flctl run, flctl sweep) upgrades it")
                             + "; this command only reads")
        if "flctl_meta" not in tables:
            if tables:
                raise StoreError(f"database holds tables ({', '.join(sorted(tables))}) but is not an flctl "
                                 "database; point --db at an empty or flctl database")
            with self.engine.begin() as conn:        # one transaction: a database is created whole or not at all
                Base.metadata.create_all(conn)
                conn.execute(delete(Meta).where(Meta.key == "schema_version"))
                conn.execute(insert(Meta).values(key="schema_version", value=str(SCHEMA_VERSION)))
                migrations.stamp_new(conn, scripts)
            return
        version = int(row) if row is not None and str(row).isdigit() else None
        if version is None or version > SCHEMA_VERSION:
            raise StoreError(f"database schema v{row} is newer than this flctl (v{SCHEMA_VERSION}): "
                             "upgrade flctl (pip install -U flctl) to open it")
        try:
            migrations.upgrade(self.engine, scripts)
        except migrations.NewerSchema as exc:
            raise StoreError(f"database schema revision {exc} is newer than this flctl knows: upgrade flctl "
                             "(pip install -U flctl) to open it") from None
        if version < SCHEMA_VERSION:
            with self.session() as s:
                s.merge(Meta(key="schema_version", value=str(SCHEMA_VERSION)))

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self._sessions() as s, s.begin():
            yield s

    def write(self, fn: Callable[[Session], T], attempts: int = 8) -> T:
        """Run ``fn`` in a transaction, retrying lock/serialization conflicts with jittered backoff."""
        for attempt in range(attempts):
            try:
                with self.session() as s:
                    return fn(s)
            except OperationalError:
                if attempt == attempts - 1:
                    raise
                time.sleep(min(2.0, 0.05 * 2**attempt) * (0.5 + random.random()))
        raise AssertionError("unreachable")

    # ---- runs ----

    def add_runs(self, configs: Iterable[Any]) -> int:
        """Insert the configs (RunConfig objects) not yet in the database as queued runs; returns how many."""
        configs = list({c.run_id: c for c in configs}.values())   # one row per distinct run

        def fn(s: Session) -> int:
            have: set[str] = set()
            ids = [c.run_id for c in configs]
            for chunk in range(0, len(ids), 500):
                have.update(s.scalars(select(Run.id).where(Run.id.in_(ids[chunk:chunk + 500]))).all())
            new = [c for c in configs if c.run_id not in have]
            stamp = now()
            s.add_all(Run(id=c.run_id, config_hash=c.config_hash, task=c.task, method=c.method, seed=c.seed,
                          config=c.identity() | {"device": c.device, "data_dir": c.data_dir}, status="queued",
                          created_at=stamp, attempts=0) for c in new)
            return len(new)
        return self.write(fn)

    def claim_run(self, run_id: str, *, stale_after: float = STALE_AFTER_S, max_attempts: int | None = None,
                  allow: Iterable[str] = (*TO_DO, "failed"), job_id: str | None = None,
                  git_sha: str | None = None, device: str | None = None) -> bool:
        """Atomically take a run for this process; False if someone else holds it or it is not claimable.

        Claimable: status in ``allow``, or running with a stale heartbeat (or a dead pid on this host).
        The update is a compare-and-swap on (status, attempts), so two workers never both win.
        """
        allow = set(allow)

        def fn(s: Session) -> bool:
            run = s.get(Run, run_id)
            if run is None:
                return False
            if not (run.status in allow or (run.status == "running" and _is_stale(run, stale_after))):
                return False
            if max_attempts is not None and run.attempts >= max_attempts:
                return False
            stamp = now()
            res = s.execute(
                update(Run).where(Run.id == run_id, Run.status == run.status, Run.attempts == run.attempts)
                .values(status="running", attempts=run.attempts + 1, error=None, host=socket.gethostname(),
                        pid=os.getpid(), job_id=job_id, git_sha=git_sha, device=device, started_at=stamp,
                        heartbeat_at=stamp, finished_at=None)
                .execution_options(synchronize_session=False))
            return res.rowcount == 1  # type: ignore[attr-defined]  # an UPDATE's CursorResult
        return self.write(fn)

    def claim_next(self, sweep_id: str, *, max_attempts: int, stale_after: float = STALE_AFTER_S,
                   job_id: str | None = None, git_sha: str | None = None,
                   accept: Callable[[dict], bool] | None = None) -> str | None:
        """Claim the sweep's next cell still to do, for a pull worker; None when none is left. With ``accept``,
        only a cell whose stored config it accepts (e.g. one that can train together with cells already held).

        To do: queued, failed with attempts left, or running with a lost worker. Candidates are tried in id
        order through ``claim_run``'s compare-and-swap, so workers racing for the same cell never both win.
        """
        cols = (Run.id, Run.status, Run.attempts, Run.host, Run.pid, Run.heartbeat_at, Run.config)
        with self.session() as s:
            rows = s.execute(select(*cols).join(SweepCell, SweepCell.run_id == Run.id)
                             .where(SweepCell.sweep_id == sweep_id, Run.attempts < max_attempts,
                                    Run.status.in_((*TO_DO, "failed", "running")))
                             .order_by(Run.id)).all()
        for r in rows:
            if (r.status == "running" and not _is_stale(r, stale_after)) or (accept and not accept(r.config)):
                continue
            if self.claim_run(r.id, stale_after=stale_after, max_attempts=max_attempts, job_id=job_id,
                              git_sha=git_sha, device=r.config.get("device")):
                return r.id
        return None

    def hand_back(self, sweep_id: str, reason: str, *, pids: Collection[int] = frozenset(),
                  job_prefixes: Collection[str] = frozenset(), stale_after: float = STALE_AFTER_S) -> list[str]:
        """Hand back the sweep's running cells held by the given local pids or Slurm jobs (by array id), or by
        any lost worker: interrupted, the attempt not counted. Returns their ids."""
        host = socket.gethostname()

        def fn(s: Session) -> list[str]:
            q = (select(Run).join(SweepCell, SweepCell.run_id == Run.id)
                 .where(SweepCell.sweep_id == sweep_id, Run.status == "running"))
            ids = []
            for run in s.scalars(q).all():
                ours = ((run.host == host and run.pid in pids)
                        or (run.job_id is not None and run.job_id.split("_")[0] in job_prefixes))
                if not (ours or _is_stale(run, stale_after)):
                    continue
                res = s.execute(update(Run).where(Run.id == run.id, Run.status == "running",
                                                  Run.attempts == run.attempts)
                                .values(status="interrupted", error=reason, attempts=max(run.attempts - 1, 0))
                                .execution_options(synchronize_session=False))
                if res.rowcount == 1:  # type: ignore[attr-defined]  # an UPDATE's CursorResult
                    ids.append(run.id)
            return ids
        return self.write(fn)

    def reap(self, *, stale_after: float = STALE_AFTER_S, max_attempts: int | None = None,
             run_ids: Iterable[str] | None = None) -> tuple[list[str], list[str]]:
        """Re-queue running runs whose worker is gone (stale heartbeat, or dead pid on this host).

        Runs that already used ``max_attempts`` are marked failed instead. Returns (requeued, failed).
        """
        def fn(s: Session) -> tuple[list[str], list[str]]:
            q = select(Run).where(Run.status == "running")
            if run_ids is not None:
                q = q.where(Run.id.in_(list(run_ids)))
            requeued: list[str] = []
            failed: list[str] = []
            for run in s.scalars(q).all():
                if not _is_stale(run, stale_after):
                    continue
                give_up = max_attempts is not None and run.attempts >= max_attempts
                res = s.execute(
                    update(Run).where(Run.id == run.id, Run.status == "running", Run.attempts == run.attempts)
                    .values(status="failed" if give_up else "queued",
                            error=(f"worker lost (heartbeat stale); gave up after {run.attempts} attempts"
                                   if give_up else "worker lost (heartbeat stale); re-queued"))
                    .execution_options(synchronize_session=False))
                if res.rowcount == 1:  # type: ignore[attr-defined]  # an UPDATE's CursorResult
                    (failed if give_up else requeued).append(run.id)
            return requeued, failed
        return self.write(fn)

    def requeue(self, run_id: str, reason: str, duration_s: float = 0.0, epochs_done: int | None = None) -> None:
        """Hand a running run back (stopped, preempted, timed out): interrupted, and the next claim resumes it
        from its checkpoint. The time it trained counts towards its duration.

        A handed-back attempt is not a failed one, so it is given back too; otherwise a cell preempted
        ``max_attempts`` times would stay queued with no attempt left to claim it.
        """
        values: dict[str, Any] = {"status": "interrupted", "error": reason, "attempts": Run.attempts - 1,
                                  "duration_s": func.coalesce(Run.duration_s, 0.0) + duration_s}
        if epochs_done is not None:
            values["epochs_done"] = epochs_done
        self.write(lambda s: s.execute(update(Run).where(Run.id == run_id, Run.status == "running")
                                       .values(**values).execution_options(synchronize_session=False)))

    def heartbeat(self, run_id: str, epochs_done: int | None = None) -> None:
        values: dict[str, Any] = {"heartbeat_at": now()}
        if epochs_done is not None:
            values["epochs_done"] = epochs_done
        self.write(lambda s: s.execute(update(Run).where(Run.id == run_id).values(**values)
                                       .execution_options(synchronize_session=False)))

    def finish_run(self, run_id: str, *, status: str, epochs_done: int, metrics: dict[str, float],
                   diverged_at: dict | None, lambda_capped: int, artifacts: dict[str, str],
                   duration_s: float, trained_with: dict[str, Any] | None = None) -> None:
        def fn(s: Session) -> None:
            run = s.get(Run, run_id)
            assert run is not None, run_id     # a claimed run is never deleted
            run.status, run.epochs_done, run.metrics = status, epochs_done, metrics
            run.trained_with = trained_with or None
            run.diverged_at, run.lambda_capped = diverged_at, lambda_capped
            run.finished_at = run.heartbeat_at = now()
            run.duration_s = (run.duration_s or 0.0) + duration_s
            run.artifacts = [Artifact(kind=k, path=p) for k, p in sorted(artifacts.items())]
        self.write(fn)

    def fail_run(self, run_id: str, error: str, duration_s: float) -> None:
        # Only a run still marked running fails: one handed back by a preempted job stays interrupted.
        self.write(lambda s: s.execute(
            update(Run).where(Run.id == run_id, Run.status == "running")
            .values(status="failed", error=error, finished_at=now(),
                    duration_s=func.coalesce(Run.duration_s, 0.0) + duration_s)
            .execution_options(synchronize_session=False)))

    # ---- sweeps ----

    def create_sweep(self, sweep_id: str, name: str | None, task: str, spec: dict[str, Any],
                     configs: list[Any]) -> int:
        """Record the sweep and its cells (runs inserted as queued when new). Idempotent; returns new runs."""
        added = self.add_runs(configs)

        def fn(s: Session) -> None:
            if s.get(Sweep, sweep_id) is None:
                s.add(Sweep(id=sweep_id, name=name, task=task, spec=spec, created_at=now(), submissions=0))
            have = set(s.scalars(select(SweepCell.run_id).where(SweepCell.sweep_id == sweep_id)).all())
            s.add_all(SweepCell(sweep_id=sweep_id, run_id=c.run_id) for c in configs if c.run_id not in have)
        self.write(fn)
        return added

    def count_submission(self, sweep_id: str) -> None:
        self.write(lambda s: s.execute(update(Sweep).where(Sweep.id == sweep_id)
                                       .values(submissions=Sweep.submissions + 1)))

    def get_sweep(self, sweep_id_or_name: str) -> dict[str, Any] | None:
        """A sweep by its id, its name (the latest of that name) or a unique hex prefix of its id (4 digits or
        more, matched literally); None when nothing matches. ConfigError for an ambiguous prefix."""
        with self.session() as s:
            sweep = s.get(Sweep, sweep_id_or_name) or s.scalars(
                select(Sweep).where(Sweep.name == sweep_id_or_name).order_by(Sweep.created_at.desc())).first()
            if sweep is None and is_id_prefix(sweep_id_or_name):
                prefix = sweep_id_or_name.lower()
                matches = s.scalars(select(Sweep).where(Sweep.id.startswith(prefix, autoescape=True))
                                    .order_by(Sweep.id).limit(6)).all()
                if len(matches) > 1:
                    raise ConfigError(_ambiguous("sweep", prefix, [m.id for m in matches]))
                sweep = matches[0] if matches else None
            if sweep is None:
                return None
            return {"id": sweep.id, "name": sweep.name, "task": sweep.task, "spec": sweep.spec,
                    "created_at": sweep.created_at.isoformat(), "submissions": sweep.submissions}

    def list_sweeps(self) -> list[dict[str, Any]]:
        with self.session() as s:
            sweeps = s.scalars(select(Sweep).order_by(Sweep.created_at.desc())).all()
            counts = dict(s.execute(select(SweepCell.sweep_id, func.count()).group_by(SweepCell.sweep_id)).all())
            done = dict(s.execute(select(SweepCell.sweep_id, func.count()).join(Run, Run.id == SweepCell.run_id)
                                  .where(Run.status == "completed").group_by(SweepCell.sweep_id)).all())
            return [{"id": w.id, "name": w.name, "task": w.task, "created_at": w.created_at.isoformat(),
                     "cells": counts.get(w.id, 0), "completed": done.get(w.id, 0), "submissions": w.submissions}
                    for w in sweeps]

    def sweep_runs(self, sweep_id: str, stale_after: float = STALE_AFTER_S) -> list[dict[str, Any]]:
        """The runs of a sweep's cells (status, attempts, heartbeat, metrics), without their artifacts;
        ``stale`` marks running runs whose worker is gone."""
        cols = (Run.id, Run.method, Run.seed, Run.status, Run.attempts, Run.epochs_done, Run.heartbeat_at,
                Run.host, Run.pid, Run.metrics, Run.config, Run.error, Run.finished_at, Run.duration_s)
        with self.session() as s:
            rows = s.execute(select(*cols).join(SweepCell, SweepCell.run_id == Run.id)
                             .where(SweepCell.sweep_id == sweep_id).order_by(Run.id)).all()
            return [dict(r._mapping, stale=r.status == "running" and _is_stale(r, stale_after)) for r in rows]

    def get_run(self, run_id_or_prefix: str) -> RunRecord | None:
        """A run by its id or a unique hex prefix of it (4 to 64 digits, matched literally: no wildcards); None
        when none matches. ConfigError for anything that is not such a prefix, or one several runs share."""
        if not is_id_prefix(run_id_or_prefix):
            raise ConfigError(f"run id {shown(run_id_or_prefix)}: give 4 to 64 hex digits of it (see `flctl runs`)")
        prefix = run_id_or_prefix.lower()
        with self.session() as s:
            run = s.get(Run, prefix)
            if run is None:
                matches = s.scalars(select(Run).where(Run.id.startswith(prefix, autoescape=True))
                                    .order_by(Run.id).limit(6)).all()
                if len(matches) > 1:
                    raise ConfigError(_ambiguous("run", prefix, [m.id for m in matches]))
                run = matches[0] if matches else None
            return None if run is None else run.record()

    def list_runs(self, *, task: str | None = None, method: str | None = None, status: str | None = None,
                  seed: int | None = None, limit: int | None = None) -> list[RunRecord]:
        q = select(Run).order_by(Run.created_at.desc())
        for col, val in ((Run.task, task), (Run.method, method), (Run.status, status), (Run.seed, seed)):
            if val is not None:
                q = q.where(col == val)
        if limit:
            q = q.limit(limit)
        with self.session() as s:
            return [r.record() for r in s.scalars(q).all()]

