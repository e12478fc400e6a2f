"""The run database (SQLAlchemy 2): SQLite under ``results/`` by default, PostgreSQL by URL.

One row per run, keyed by the run id (a prefix of the canonical config hash), with the resolved config,
status, timings, host, git revision, summary metrics and artifact paths. The schema is versioned in the
``flctl_meta`` table; opening a database written by another schema version fails with a clear message.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import re
import secrets
import socket
import sqlite3
import threading
import time
import zlib
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
from sqlalchemy.exc import DBAPIError, OperationalError, ProgrammingError, SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship, sessionmaker
from sqlalchemy.pool import NullPool

from flctl.config import RunConfig
from flctl.errors import ClaimLost, ConfigError, NewerSchema, OlderSchema, StoreError
from flctl.status import TRAINABLE
from flctl.text import redact

# 2: managed by Alembic revisions (flctl.migrations); 1: the schema before them, which the baseline revision is.
# A flctl that expects 1 refuses a database at 2 with its own message, instead of missing newer columns.
SCHEMA_VERSION = 2
T = TypeVar("T")
# The database-wide lock (Store.exclusive) under which schemas are created or upgraded, flctl's and Optuna's.
SCHEMA_LOCK = "schema"
_MEMORY_LOCK = threading.Lock()        # Store.exclusive for an in-memory SQLite database: this process only


def check_stale_after(seconds: float, what: str = "the stale bound") -> float:
    """A bound on heartbeat age past which a running run is presumed lost. Zero or less would make every running
    run stale at once (two workers training one run), so it must be a positive number of seconds."""
    if not (isinstance(seconds, (int, float)) and seconds > 0):      # NaN is not > 0 either
        raise StoreError(f"{what} must be a positive number of seconds, got {seconds!r}")
    return float(seconds)


def _seconds_from_env(name: str, default: str, *, finite: bool) -> float:
    """A positive number of seconds from the environment, parsed once at import; NaN when it is anything else
    (``30s``, empty, ``-5``, ``0``; ``inf`` too where ``finite``), which Store.open refuses in one line
    (_check_environment)."""
    try:
        value = float(os.environ.get(name, default))
    except ValueError:
        return math.nan
    return value if value > 0 and (math.isfinite(value) or not finite) else math.nan


# A running run whose heartbeat is older than this is presumed lost (killed, node gone) and may be re-claimed.
# Infinity is a valid, if unwise, bound: never presumed lost.
STALE_AFTER_S = _seconds_from_env("FLCTL_STALE_AFTER", "300", finite=False)
# How often a running run's worker writes its heartbeat (at most; flctl.runner). Finite: Event.wait(inf) raises
# in the heartbeat thread, which then dies; zero makes it a busy loop (thousands of fsyncs per run).
HEARTBEAT_S = _seconds_from_env("FLCTL_HEARTBEAT", "30", finite=True)
# Below this a heartbeat is a busy loop of database writes.
MIN_HEARTBEAT_S = 0.05


def _check_environment() -> None:
    """The one-line refusal of a bad FLCTL_STALE_AFTER or FLCTL_HEARTBEAT, for every command that opens a
    database (all that can train or judge a run's liveness do)."""
    for name, value in (("FLCTL_STALE_AFTER", STALE_AFTER_S), ("FLCTL_HEARTBEAT", HEARTBEAT_S)):
        if math.isnan(value):
            raise StoreError(f"{name} must be a positive number of seconds (e.g. 30), got {os.environ.get(name)!r}")
    if HEARTBEAT_S < MIN_HEARTBEAT_S:
        raise StoreError(f"FLCTL_HEARTBEAT must be at least {MIN_HEARTBEAT_S:g} s, got {HEARTBEAT_S:g}")
    if HEARTBEAT_S >= STALE_AFTER_S:     # every running run would look lost between two of its heartbeats
        raise StoreError(f"FLCTL_HEARTBEAT ({HEARTBEAT_S:g} s) must be shorter than FLCTL_STALE_AFTER "
                         f"({STALE_AFTER_S:g} s)")


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
    # Where the code that trained it came from (flctl.plugins.Source.provenance): {"task": {...}, "method": {...}}
    provenance: Mapped[dict | None] = mapped_column(JSON)
    # The fencing token of the current claim: new at every claim, so a worker that lost its claim (stale, taken
    # over) finds another token here and writes nothing (flctl.runner checks it before every write that matters).
    claim_token: Mapped[str | None] = mapped_column(String(32))
    artifacts: Mapped[list[Artifact]] = relationship(back_populates="run", cascade="all, delete-orphan",
                                                       lazy="selectin")

    def record(self) -> RunRecord:
        d = {c.key: getattr(self, c.key) for c in inspect(Run).column_attrs}
        for k in ("created_at", "started_at", "finished_at", "heartbeat_at"):
            d[k] = d[k].isoformat() if d[k] else None
        d["metrics"] = d["metrics"] or {}
        # JSON of another shape (PostgreSQL's JSON column admits any JSON) would fail later, deep in a command
        for k, kind in (("config", dict), ("metrics", dict), ("diverged_at", (dict, type(None))),
                        ("trained_with", (dict, type(None))), ("provenance", (dict, type(None)))):
            if not isinstance(d[k], kind):
                raise StoreError(f"the database is damaged: run {shown(self.id)}'s {k} is "
                                 f"{type(d[k]).__name__} JSON, not an object; restore it from a backup or delete "
                                 "that row")
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
    config: dict[str, Any]            # the RunConfig as stored (JSON): every field (RunConfig.to_dict)
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
    provenance: dict[str, Any] | None     # task and method code: origin, module, file, sha256, distribution, version
    claim_token: str | None            # the current claim's fencing token (Run.claim_token)
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
    # busy_timeout makes a locked writer wait instead of failing. The driver's own transaction handling is turned
    # off so that _sqlite_begin decides how to begin. No journal mode here: the file may not be flctl's, and
    # switching it to WAL rewrites its header (Store._use_wal does it once the schema is known to be ours).
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def _sqlite_pragmas_readonly(dbapi_conn, _record) -> None:
    # As _sqlite_pragmas, for a database opened read-only.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


# SQLite's rollback-mode locks are byte ranges of the database file (os_unix.c): a reader holds a read lock on
# these bytes, and the last connection of a WAL database must write-lock them before it checkpoints into the file.
_SQLITE_SHARED_FIRST, _SQLITE_SHARED_SIZE = 0x40000000 + 2, 510
_LOCK_WAIT_S = 30.0                      # as busy_timeout


class _LockedConnection(sqlite3.Connection):
    """A read-only connection that holds a shared lock on its file (an open descriptor) until it is closed."""

    lock_fd: int | None = None

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.lock_fd is not None:
                os.close(self.lock_fd)
                self.lock_fd = None


def _shared_lock(fd: int) -> bool:
    """A read lock on SQLite's shared byte range of the open file ``fd``, as an open-file-description lock (kept
    whatever other descriptors of the file this process opens and closes); False where there are none (not
    Linux) or a writer held the range for longer than ``_LOCK_WAIT_S``."""
    import fcntl
    import struct

    if not hasattr(fcntl, "F_OFD_SETLK"):
        return False
    request = struct.pack("hhqqi", fcntl.F_RDLCK, os.SEEK_SET, _SQLITE_SHARED_FIRST, _SQLITE_SHARED_SIZE, 0)
    deadline = time.monotonic() + _LOCK_WAIT_S
    while True:
        try:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, request)
            return True
        except (BlockingIOError, PermissionError):    # a writer holds it (checkpointing): wait a moment
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        except OSError:
            return False


def _idle_wal_lock(path: Path) -> int | None:
    """When ``path`` is a WAL database that no connection has open (no -wal file beside it: SQLite removes it as
    the last connection closes), an open descriptor holding a shared lock on it; else None. While the lock is held
    the file holds every commit and stays as it is: a writer that opens the database meanwhile commits into a new
    -wal file and cannot checkpoint into the database file (that needs the lock we share)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        # bytes 18-19 of the header: the file format versions, 2 and 2 in WAL mode, 1 and 1 with a rollback journal
        if os.pread(fd, 2, 18) == b"\x02\x02" and _shared_lock(fd) and not Path(f"{path}-wal").exists():
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _readonly_sqlite(path: Path, immutable: bool = False) -> Callable[[], sqlite3.Connection]:
    """Connections that read the SQLite database at ``path`` and create or change no file. SQLite's read-only mode
    creates the -wal and -shm files of a WAL database that has none, and leaves them behind; such a database is
    read as immutable instead, under the shared lock of _idle_wal_lock. Decided for each connection, so a reader
    that lives on (`flctl status --watch`) follows a sweep that starts meanwhile through SQLite's read-only mode,
    which reads its -wal. ``immutable``: always (a folder that cannot take SQLite's lock files)."""
    from urllib.parse import quote

    def connect() -> sqlite3.Connection:
        lock = None if immutable else _idle_wal_lock(path)
        mode = "ro&immutable=1" if immutable or lock is not None else "ro"
        try:
            conn = sqlite3.connect(f"file:{quote(str(path))}?mode={mode}", uri=True, timeout=30,
                                   check_same_thread=False, factory=_LockedConnection)
        except BaseException:
            if lock is not None:
                os.close(lock)
            raise
        conn.lock_fd = lock
        return conn
    return connect


def _sqlite_begin_readonly(conn) -> None:
    conn.exec_driver_sql("BEGIN")


# Execution option of a connection that only reads (Store.holds): see _sqlite_begin.
READ_ONLY = "flctl_read_only"


def _sqlite_begin(conn) -> None:
    # BEGIN IMMEDIATE takes the write lock up front (waiting up to busy_timeout). A deferred transaction that
    # reads and then writes can instead fail at once with SQLITE_BUSY when another process wrote in between.
    # A read-only transaction (READ_ONLY) begins deferred: in WAL it takes no lock a writer waits for.
    conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get(READ_ONLY) else "BEGIN IMMEDIATE")


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


def db_now(s: Session) -> datetime:
    """The database's clock (UTC): heartbeats are written and judged by it, so workers on hosts whose clocks
    disagree do not see each other's runs as stale (or alive) too early."""
    stamp = s.execute(select(func.current_timestamp())).scalar_one()
    if isinstance(stamp, str):             # SQLite: 'YYYY-MM-DD HH:MM:SS', UTC
        stamp = datetime.fromisoformat(stamp)
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)


def _is_stale(run: Any, stale_after: float, at: datetime) -> bool:
    """A running run's worker is gone: its heartbeat is older than ``stale_after`` at the database's time ``at``,
    or it ran here and its process has exited."""
    check_stale_after(stale_after)
    if run.host == socket.gethostname() and run.pid is not None and not pid_alive(run.pid):
        return True
    beat = run.heartbeat_at
    if beat is None:
        return True
    if beat.tzinfo is None:  # SQLite returns naive datetimes; we store UTC
        beat = beat.replace(tzinfo=UTC)
    return (at - beat).total_seconds() > stale_after


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


def _newer(found: str, known: str) -> StoreError:
    """The refusal of a database written by a newer flctl (``found``: its schema version or revision; ``known``: what
    this flctl knows of it), one line that says what to do."""
    return StoreError(f"database schema {found} is newer than {known}: upgrade flctl (pip install -U flctl) to open it")


def _one_line(exc: BaseException, url: str | None = None) -> str:
    """The first line of a driver's error, without the password: drivers may quote the connection string they were
    given (with ``url``, its password is removed wherever it appears; any URL password or password=... is too)."""

    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip()
    return redact(text.splitlines()[0] if text else type(orig).__name__, url)


class Store:
    """A handle on the run database. ``Store.open(url)`` checks it is reachable and of our schema."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.readonly = False
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @classmethod
    def open(cls, url: str, *, readonly: bool = False) -> Store:
        """Open (creating or upgrading as needed) the run database at ``url``. ``readonly``: for commands that
        only read (reports, listings): nothing is created, upgraded or written, and no file is added beside the
        database; SQLite opens the file read-only (see _readonly_sqlite; immutable when its folder cannot take the
        lock files), PostgreSQL in read-only transactions. A SQLite file is put in WAL mode only once its schema
        is known to be flctl's (or it is new): a foreign database is left as it was."""
        _check_environment()
        url = normalize_url(url)
        try:
            parsed = make_url(url)
        except Exception:
            raise StoreError(f"not a database URL: {redact(url, url)!r} (e.g. sqlite:///results/flctl.db, "
                             "postgresql://user@host/db)") from None
        shown_url = parsed.render_as_string(hide_password=True)
        sqlite = parsed.get_backend_name() == "sqlite"
        attempts: list[str | Callable[[], sqlite3.Connection]] = [url]
        if readonly and sqlite and parsed.database:
            path = Path(parsed.database).resolve()
            attempts = [_readonly_sqlite(path), _readonly_sqlite(path, immutable=True)]
        for target in attempts[:-1]:
            try:
                return cls._open(target, sqlite, shown_url, readonly)
            except _Unopenable:   # a read-only folder cannot take SQLite's lock files: read it as immutable
                pass
        return cls._open(attempts[-1], sqlite, shown_url, readonly)

    @classmethod
    def _open(cls, target: str | Callable[[], sqlite3.Connection], sqlite: bool, shown_url: str,
              readonly: bool) -> Store:
        """``target``: a URL, or a function that connects to a SQLite file (a read-only open, see
        _readonly_sqlite), whose connections are not pooled, so that each session decides afresh how to read."""
        kwargs: dict[str, Any] = {"pool_pre_ping": True}
        url = target if isinstance(target, str) else "sqlite://"
        if not isinstance(target, str):
            kwargs.update(creator=target, poolclass=NullPool)
        elif sqlite:
            kwargs["connect_args"] = {"timeout": 30}
        elif url.startswith("postgresql"):
            kwargs["connect_args"] = {"connect_timeout": 10}
            if readonly:
                kwargs["connect_args"]["options"] = "-c default_transaction_read_only=on"
        try:
            engine = create_engine(url, **kwargs)
        except Exception as exc:  # unknown dialect or driver
            # shown_url hides the URL's password, not a ?password= parameter

            raise StoreError(f"cannot use database {redact(shown_url)}: {_one_line(exc, url)}") from None
        if sqlite:
            event.listen(engine, "connect", _sqlite_pragmas_readonly if readonly else _sqlite_pragmas)
            event.listen(engine, "begin", _sqlite_begin_readonly if readonly else _sqlite_begin)
        store = cls(engine)
        store.readonly = readonly
        try:
            store._check_schema()
            store._use_wal()
        except StoreError:
            engine.dispose()
            raise
        except (SQLAlchemyError, DBAPIError) as exc:
            engine.dispose()
            error = _Unopenable if readonly and "unable to open database file" in str(exc) else StoreError
            # shown_url hides the URL's password, not a ?password= parameter

            raise error(f"cannot open database {redact(shown_url)}: {_one_line(exc, url)} "
                        "(check --db / FLCTL_DB, or move a corrupt file aside)") from None
        return store

    def _check_schema(self, scripts: Path | None = None, locked: bool = False) -> None:
        """Create a new database, or upgrade an flctl one in place (flctl.migrations); refuse anything else. Creating
        and upgrading happen under SCHEMA_LOCK (``locked``: held already), so processes that open a new database at
        the same moment do not both create its tables (on PostgreSQL the second would fail on pg_type)."""
        from flctl import migrations

        scripts = scripts or migrations.SCRIPTS
        with self.engine.connect() as conn:
            tables = set(inspect(conn).get_table_names())
            row = conn.execute(select(Meta.value).where(Meta.key == "schema_version")).scalar() \
                if "flctl_meta" in tables else None
        if row is not None and (not str(row).isdigit() or int(row) > SCHEMA_VERSION):
            raise _newer(f"v{row}", f"this flctl (v{SCHEMA_VERSION})")
        try:
            older = "flctl_meta" in tables and migrations.needs_upgrade(self.engine, scripts)
        except NewerSchema as exc:
            raise _newer(f"revision {exc}", "this flctl knows") from None
        if self.readonly and "flctl_meta" in tables and (row != str(SCHEMA_VERSION) or older):
            raise OlderSchema("the database is from an older flctl: `flctl migrate` upgrades it (so do flctl run "
                              "and flctl sweep); this command only reads")
        if self.readonly and "flctl_meta" not in tables:
            raise StoreError("the database is " + ("empty: not an flctl database yet" if not tables else
                             "not an flctl database") + "; this command only reads")
        if "flctl_meta" not in tables and tables:
            raise StoreError(f"database holds tables ({', '.join(sorted(tables))}) but is not an flctl "
                             "database; point --db at an empty or flctl database")
        if not locked and ("flctl_meta" not in tables or older or row != str(SCHEMA_VERSION)):
            with self.exclusive(SCHEMA_LOCK):     # then look again: another process may have done it meanwhile
                return self._check_schema(scripts, locked=True)
        if "flctl_meta" not in tables:
            with self.engine.begin() as conn:        # one transaction: a database is created whole or not at all
                Base.metadata.create_all(conn)
                conn.execute(delete(Meta).where(Meta.key == "schema_version"))
                conn.execute(insert(Meta).values(key="schema_version", value=str(SCHEMA_VERSION)))
                migrations.stamp_new(conn, scripts)
            return
        version = int(row) if row is not None and str(row).isdigit() else None
        if version is None or version > SCHEMA_VERSION:
            raise _newer(f"v{row}", f"this flctl (v{SCHEMA_VERSION})")
        try:
            migrations.upgrade(self.engine, scripts)
        except NewerSchema as exc:
            raise _newer(f"revision {exc}", "this flctl knows") from None
        if version < SCHEMA_VERSION:
            with self.session() as s:
                s.merge(Meta(key="schema_version", value=str(SCHEMA_VERSION)))

    def _use_wal(self) -> None:
        """Put flctl's SQLite database (known to be ours by now) in WAL mode, where readers run beside one writer.
        The mode is kept in the file, so it is set once, on the driver's connection, outside any transaction."""
        if self.readonly or self.engine.dialect.name != "sqlite":
            return
        conn = self.engine.raw_connection()
        try:
            if conn.cursor().execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal":
                return                     # the usual case: set by whoever opened the database first
            # Switching needs the file to itself, and SQLite answers "database is locked" at once (no busy wait)
            # while another process holds it: e.g. several processes opening a new database together. The schema
            # lock orders them; a reader still in the file gets a few short retries.
            with self.exclusive(SCHEMA_LOCK):
                for attempt in range(50):
                    try:
                        conn.cursor().execute("PRAGMA journal_mode=WAL")
                        return
                    except sqlite3.OperationalError as exc:
                        if "locked" not in str(exc) or attempt == 49:
                            raise
                        time.sleep(0.1)
        finally:
            conn.close()

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A transaction. A database whose schema was damaged (a table or column gone) or whose rows hold invalid
        JSON is StoreError, one line, for every command alike; lock conflicts stay OperationalError (``write``
        retries them)."""
        try:
            with self._sessions() as s, s.begin():
                yield s
        except (OperationalError, ProgrammingError) as exc:
            text = str(getattr(exc, "orig", exc))
            if not any(k in text for k in ("no such table", "no such column", "does not exist")):
                raise
            raise StoreError(f"the database is damaged: {text.splitlines()[0]}; restore it from a backup "
                             "(flctl creates and upgrades its tables itself)") from None
        except json.JSONDecodeError as exc:
            raise StoreError(f"the database is damaged: a row holds invalid JSON ({exc}); restore it from a "
                             "backup or delete that row") from None

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
                          config=c.to_dict(), status="queued",
                          created_at=stamp, attempts=0) for c in new)
            return len(new)
        return self.write(fn)

    def claim_run(self, run_id: str, *, stale_after: float = STALE_AFTER_S, max_attempts: int | None = None,
                  allow: Iterable[str] = TRAINABLE, job_id: str | None = None,
                  git_sha: str | None = None, device: str | None = None) -> str | None:
        """Atomically take a run for this process; returns the claim's fencing token, or None if someone else
        holds it or it is not claimable.

        Claimable: status in ``allow``, or running with a stale heartbeat (or a dead pid on this host).
        The update is a compare-and-swap on (status, attempts, token), so two workers never both win; the token
        is new at every claim, and the writes of the claim's holder (heartbeat, finish, hand-back, and through
        ``holds`` its files) take effect only while the run still carries it.
        """
        allow = set(allow)
        check_stale_after(stale_after)

        def fn(s: Session) -> str | None:
            run = s.get(Run, run_id)
            if run is None:
                return None
            stamp = db_now(s)
            if not (run.status in allow or (run.status == "running" and _is_stale(run, stale_after, stamp))):
                return None
            if max_attempts is not None and run.attempts >= max_attempts:
                return None
            token = secrets.token_hex(16)
            res = s.execute(
                update(Run).where(Run.id == run_id, Run.status == run.status, Run.attempts == run.attempts,
                                  Run.claim_token.is_(None) if run.claim_token is None
                                  else Run.claim_token == run.claim_token)
                .values(status="running", attempts=run.attempts + 1, error=None, host=socket.gethostname(),
                        pid=os.getpid(), job_id=job_id, git_sha=git_sha, device=device, started_at=stamp,
                        heartbeat_at=stamp, finished_at=None, claim_token=token)
                .execution_options(synchronize_session=False))
            return token if res.rowcount == 1 else None  # type: ignore[attr-defined]  # an UPDATE's CursorResult
        return self.write(fn)

    def holds(self, run_id: str, token: str) -> bool:
        """Whether the claim with ``token`` still holds the run (it is running under that claim). A read that takes
        no write lock: training asks it before its writes, and a preemption handler interrupting it on the same
        thread (submitit's checkpoint, which hands the run back) must not wait for a lock its own thread holds."""
        with self.engine.connect().execution_options(**{READ_ONLY: True}) as conn, conn.begin():
            return conn.scalar(select(func.count()).select_from(Run).where(
                Run.id == run_id, Run.status == "running", Run.claim_token == token)) == 1

    def claim_next(self, sweep_id: str, *, max_attempts: int, stale_after: float = STALE_AFTER_S,
                   job_id: str | None = None, git_sha: str | None = None,
                   accept: Callable[[dict], bool] | None = None) -> tuple[str, str] | None:
        """Claim the sweep's next cell still to do, for a pull worker: (run id, fencing token), or None when none
        is left. With ``accept``,
        only a cell whose stored config it accepts (e.g. one that can train together with cells already held).

        To do: queued, failed with attempts left, or running with a lost worker. Candidates are tried in id
        order through ``claim_run``'s compare-and-swap, so workers racing for the same cell never both win.
        """
        cols = (Run.id, Run.status, Run.attempts, Run.host, Run.pid, Run.heartbeat_at, Run.config)
        with self.session() as s:
            rows = s.execute(select(*cols).join(SweepCell, SweepCell.run_id == Run.id)
                             .where(SweepCell.sweep_id == sweep_id, Run.attempts < max_attempts,
                                    Run.status.in_((*TRAINABLE, "running")))
                             .order_by(Run.id)).all()
            at = db_now(s)
        for r in rows:
            if (r.status == "running" and not _is_stale(r, stale_after, at)) or (accept and not accept(r.config)):
                continue
            token = self.claim_run(r.id, stale_after=stale_after, max_attempts=max_attempts, job_id=job_id,
                                   git_sha=git_sha, device=r.config.get("device"))
            if token is not None:
                return r.id, token
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
            at = db_now(s)
            for run in s.scalars(q).all():
                ours = ((run.host == host and run.pid in pids)
                        or (run.job_id is not None and run.job_id.split("_")[0] in job_prefixes))
                if not (ours or _is_stale(run, stale_after, at)):
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
            at = db_now(s)
            for run in s.scalars(q).all():
                if not _is_stale(run, stale_after, at):
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

    def requeue(self, run_id: str, token: str, reason: str, duration_s: float = 0.0,
                epochs_done: int | None = None) -> bool:
        """Hand a running run back (stopped, preempted, timed out): interrupted, and the next claim resumes it
        from its checkpoint. The time it trained counts towards its duration. False (nothing written) when the
        claim ``token`` no longer holds the run.

        A handed-back attempt is not a failed one, so it is given back too; otherwise a cell preempted
        ``max_attempts`` times would stay queued with no attempt left to claim it.
        """
        values: dict[str, Any] = {"status": "interrupted", "error": reason, "attempts": Run.attempts - 1,
                                  "duration_s": func.coalesce(Run.duration_s, 0.0) + duration_s}
        if epochs_done is not None:
            values["epochs_done"] = epochs_done
        return self._fenced_update(run_id, token, values)

    def heartbeat(self, run_id: str, token: str, epochs_done: int | None = None) -> bool:
        """Refresh the claim's heartbeat (the database's clock); False when the claim no longer holds the run."""
        values: dict[str, Any] = {}
        if epochs_done is not None:
            values["epochs_done"] = epochs_done
        return self._fenced_update(run_id, token, values, beat=True)

    def _fenced_update(self, run_id: str, token: str, values: dict[str, Any], beat: bool = False) -> bool:
        def fn(s: Session) -> bool:
            extra = {"heartbeat_at": db_now(s)} if beat else {}
            res = s.execute(update(Run).where(Run.id == run_id, Run.status == "running", Run.claim_token == token)
                            .values(**values, **extra).execution_options(synchronize_session=False))
            return res.rowcount == 1  # type: ignore[attr-defined]  # an UPDATE's CursorResult
        return self.write(fn)

    def record_provenance(self, run_id: str, token: str, provenance: dict[str, Any]) -> bool:
        """Where the code that trains the claimed run comes from (flctl.runner, as training starts)."""
        return self._fenced_update(run_id, token, {"provenance": provenance})

    def finish_run(self, run_id: str, token: str, *, status: str, epochs_done: int, metrics: dict[str, float],
                   diverged_at: dict | None, lambda_capped: int, artifacts: dict[str, str],
                   duration_s: float, trained_with: dict[str, Any] | None = None) -> None:
        """Record how a run ended. ClaimLost (nothing written) when the claim ``token`` no longer holds it."""
        def fn(s: Session) -> None:
            run = s.get(Run, run_id)
            assert run is not None, run_id     # a claimed run is never deleted
            if run.status != "running" or run.claim_token != token:
                raise ClaimLost(f"run {run_id}: another worker holds it now; its outcome here is not recorded")
            run.status, run.epochs_done, run.metrics = status, epochs_done, metrics
            run.trained_with = trained_with or None
            run.diverged_at, run.lambda_capped = diverged_at, lambda_capped
            run.finished_at = run.heartbeat_at = now()
            run.duration_s = (run.duration_s or 0.0) + duration_s
            run.artifacts = [Artifact(kind=k, path=p) for k, p in sorted(artifacts.items())]
        self.write(fn)

    def fail_run(self, run_id: str, token: str, error: str, duration_s: float) -> bool:
        # Only a run still running under this claim fails: one handed back by a preempted job stays interrupted,
        # and one another worker took over is theirs.
        return self._fenced_update(run_id, token, {"status": "failed", "error": error, "finished_at": now(),
                                                   "duration_s": func.coalesce(Run.duration_s, 0.0) + duration_s})

    @contextmanager
    def exclusive(self, name: str) -> Iterator[None]:
        """Hold the database-wide lock ``name`` (one holder at a time, across processes and hosts): PostgreSQL's
        transaction-level advisory lock, released with its transaction however the block ends; SQLite's database
        is one machine's file, so an exclusive file lock beside it. For what must not run twice at once on one
        database: creating schemas, syncing Optuna studies."""
        url = self.engine.url
        if url.get_backend_name() == "postgresql":
            with self.engine.connect() as conn, conn.begin():
                conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({zlib.crc32(f'flctl:{name}'.encode())})")
                yield
            return
        import fcntl

        path = Path(url.database or "")
        if not url.database or url.database == ":memory:":
            with _MEMORY_LOCK:
                yield
            return
        with open(path.with_name(f"{path.name}.{name}.lock"), "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield

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
            at = db_now(s)
            return [dict(r._mapping, stale=r.status == "running" and _is_stale(r, stale_after, at)) for r in rows]

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
        q = _run_filter(select(Run).order_by(Run.created_at.desc()), task, method, status, seed)
        if limit:
            q = q.limit(limit)
        with self.session() as s:
            return [r.record() for r in s.scalars(q).all()]

    def count_runs(self, *, task: str | None = None, method: str | None = None, status: str | None = None,
                   seed: int | None = None) -> int:
        """How many runs ``list_runs`` would list without a limit."""
        with self.session() as s:
            return s.scalar(_run_filter(select(func.count()).select_from(Run), task, method, status, seed)) or 0


def _run_filter(q: Any, task: str | None, method: str | None, status: str | None, seed: int | None) -> Any:
    """``q`` restricted to the runs of the given task, method, status and seed (None: any)."""
    for col, val in ((Run.task, task), (Run.method, method), (Run.status, status), (Run.seed, seed)):
        if val is not None:
            q = q.where(col == val)
    return q
