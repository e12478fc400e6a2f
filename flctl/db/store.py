"""The run database: SQLite under ``results/`` by default, PostgreSQL by URL. ``Store`` opens it (checking, creating
or upgrading the schema), runs transactions with retries, holds database-wide locks and answers the read queries;
what differs between engines is their dialect's (flctl.db.dialect: flctl.db.sqlite, flctl.db.postgres); the fenced
claim protocol of workers is flctl.db.queue's.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import os
import random
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import create_engine, func, select, update
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DBAPIError, OperationalError, ProgrammingError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from flctl.db.bulk import insert_runs, record_sweep
from flctl.db.checked import checked_runs, left_out, unreadable
from flctl.db.counts import SweepCounts, list_sweeps, sweep_counts
from flctl.db.dialect import Connect, DatabaseFile, Dialect, made_back
from flctl.db.liveness import STALE_AFTER_S, _check_environment, _is_stale, db_now
from flctl.db.refs import by_prefix, find_sweep, is_id_prefix
from flctl.db.schema import Run, RunRecord, Sweep, SweepCell
from flctl.db.upgrade import check_schema
from flctl.db.urls import dialect_of, normalize_url, parsed
from flctl.errors import ConfigError, DiskFull, StoreError
from flctl.status import Status
from flctl.text import redact, shown

T = TypeVar("T")


class _Unopenable(StoreError):
    """SQLite could not open the file at all (e.g. a read-only folder for a read-only open)."""


def _let_go(interrupt: BaseException) -> None:
    """Free what a transaction ended by a KeyboardInterrupt or SystemExit (Ctrl-C, a stop signal) still holds.
    SQLAlchemy then closes the driver's connection without a rollback (no I/O under an interrupt), but SQLite
    closes a connection with a statement still active (an UPDATE ... RETURNING not yet read, a SELECT mid-way) only
    once that statement is finalized: until its cursor, referenced from the interrupt's traceback, is collected, the
    transaction and its write lock live on, and every other worker's write waited minutes for it. The finished
    frames of the traceback (the database library's) let their cursors go; the caller's frames are left alone."""
    tb = interrupt.__traceback__
    while tb is not None:
        with contextlib.suppress(RuntimeError):       # a frame still running (this one, its callers) is not cleared
            tb.tb_frame.clear()
        tb = tb.tb_next
    gc.collect()


def _one_line(exc: BaseException, url: str | None = None) -> str:
    """The first line of a driver's error, without the password: drivers may quote the connection string they were
    given (with ``url``, its password is removed wherever it appears; any URL password or password=... is too)."""

    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip()
    return redact(text.splitlines()[0] if text else type(orig).__name__, url)


def moved(store: Store) -> str | None:
    """Why the database ``store`` opened is not there any more: its SQLite file deleted, or replaced by another
    file (its open connections would go on writing into the unlinked one, and a new connection would make an
    empty database in its place). None while it is there; a server database does not move under its URL."""
    if (opened := store.file) is None:
        return None
    try:
        st = opened.path.stat()
    except FileNotFoundError:
        return f"the database {opened.path} was deleted"
    except OSError as exc:
        return f"the database {opened.path} cannot be reached ({exc.strerror})"
    if (st.st_dev, st.st_ino) == (opened.device, opened.inode):
        return None
    return f"the database {opened.path} was replaced by another file"


def not_the_one(store: Store, inode: int | None) -> str | None:
    """Why ``store`` (just opened) is not the SQLite file whose inode was ``inode`` when the sweep launched: a
    worker that starts after its database was replaced must not claim cells in the replacement. The inode alone: a
    shared file system gives another device number on each node."""
    if inode is None or store.file is None or store.file.inode == inode:
        return None
    return f"the database {store.file.path} was replaced by another file"


class Store:
    """A handle on the run database. ``Store.open(url)`` checks it is reachable and of our schema."""

    def __init__(self, engine: Engine, dialect: Dialect | None = None) -> None:
        self.engine = engine
        self.dialect = dialect or dialect_of(engine.url)
        self.readonly = False
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self.file: DatabaseFile | None = None      # the file it opened (None: a server's, or in memory)

    @classmethod
    def open(cls, url: str, *, readonly: bool = False, create: bool = True) -> Store:
        """Open (creating or upgrading as needed) the run database at ``url``. ``readonly``: for commands that
        only read (reports, listings): nothing is created, upgraded or written, and no file is added beside the
        database (SQLite reads the file read-only, PostgreSQL in read-only transactions: their dialects). What
        only flctl's own database may be given (SQLite's WAL mode) waits until its schema is known to be flctl's
        (or it is new): a foreign database is left as it was. Without ``create``, a database file that is not there
        is DatabaseDeleted (a sweep's worker: the database it was started for was deleted)."""
        _check_environment()
        url = normalize_url(url)
        try:
            parsed = make_url(url)
        except Exception:
            raise StoreError(f"not a database URL: {redact(url, url)!r} (e.g. sqlite:///results/flctl.db, "
                             "postgresql://user@host/db)") from None
        dialect = dialect_of(parsed)
        shown_url = parsed.render_as_string(hide_password=True)
        with made_back(dialect.made_files(parsed)):
            attempts = dialect.targets(parsed, readonly=readonly, create=create)
            store = None
            for target in attempts[:-1]:
                try:
                    store = cls._open(target, dialect, shown_url, readonly)
                    break
                except _Unopenable:   # e.g. a read-only folder cannot take SQLite's lock files: the next way
                    pass
            store = store or cls._open(attempts[-1], dialect, shown_url, readonly)
        if (path := dialect.file(parsed)) is not None:
            with contextlib.suppress(OSError):
                st = path.stat()
                store.file = DatabaseFile(path, st.st_dev, st.st_ino)
        return store

    @classmethod
    def open_existing(cls, url: str, *, readonly: bool = True) -> Store | None:
        """The database at ``url`` (read-only unless told), or None where it is a file not made yet: opening it
        would make it (a listing, a report or a dry run before the first run)."""
        if (found := parsed(url)) is None:
            return cls.open(url, readonly=readonly)           # its one-line error
        path = dialect_of(found).file(found)
        if path is not None and not path.exists():
            return None
        return cls.open(url, readonly=readonly, create=False)

    @classmethod
    def _open(cls, target: str | Connect, dialect: Dialect, shown_url: str, readonly: bool) -> Store:
        """``target``: a URL, or a function that connects (a read-only SQLite open), whose connections are not
        pooled, so that each session decides afresh how to read."""
        kwargs: dict[str, Any] = {"pool_pre_ping": True}
        url = target if isinstance(target, str) else f"{dialect.name}://"
        if not isinstance(target, str):
            kwargs.update(creator=target, poolclass=NullPool)
        else:
            kwargs.update(dialect.engine_args(readonly=readonly))
        try:
            engine = create_engine(url, **kwargs)
        except Exception as exc:  # unknown dialect or driver
            # shown_url hides the URL's password, not a ?password= parameter
            raise StoreError(f"cannot use database {redact(shown_url)}: {_one_line(exc, url)}") from None
        dialect.set_up(engine, readonly=readonly)
        store = cls(engine, dialect)
        store.readonly = readonly
        try:
            check_schema(store)
            dialect.opened(engine, readonly=readonly)
        except StoreError:
            engine.dispose()
            raise
        except (SQLAlchemyError, DBAPIError) as exc:
            engine.dispose()
            error = _Unopenable if readonly and "unable to open database file" in str(exc) else StoreError
            # shown_url hides the URL's password, not a ?password= parameter
            if isinstance(target, str) and dialect.file(engine.url) is None and not dialect.in_memory(engine.url):
                raise error(f"cannot reach database {redact(shown_url)}: {_one_line(exc, url)} (check --db / "
                            "FLCTL_DB and that its server is running)") from None
            raise error(f"cannot open database {redact(shown_url)}: {_one_line(exc, url)} "
                        "(check --db / FLCTL_DB, or move a corrupt file aside)") from None
        return store

    def close(self) -> None:
        self.engine.dispose()

    def disk_full(self, exc: BaseException) -> DiskFull | None:
        """The database error ``exc`` as a DiskFull naming the database's file, where it says a write found no room
        (its dialect's words: Dialect.is_full); None for any other error."""
        if not self.dialect.is_full(exc):
            return None
        where = self.dialect.file(self.engine.url) or "the run database"
        return DiskFull(errno.ENOSPC, os.strerror(errno.ENOSPC), str(where))

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
        except BaseException as exc:
            if not isinstance(exc, Exception):
                _let_go(exc)
            raise

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
        return self.write(lambda s: len(insert_runs(s, configs)))

    @contextmanager
    def exclusive(self, name: str) -> Iterator[None]:
        """Hold the database-wide lock ``name`` (one holder at a time, across processes and hosts: the dialect's,
        PostgreSQL's advisory lock or a lock file beside SQLite's). For what must not run twice at once on one
        database: creating schemas, syncing Optuna studies."""
        with self.dialect.exclusive(self.engine, name):
            yield

    @contextmanager
    def try_exclusive(self, name: str) -> Iterator[bool]:
        """The lock ``name`` of ``exclusive`` if no one holds it, without waiting: yields whether it was taken (and
        is held through the block). For work that the holder does for everyone (the Optuna mirror, flctl.study)."""
        with self.dialect.try_exclusive(self.engine, name) as got:
            yield got

    # ---- sweeps ----

    def create_sweep(self, sweep_id: str, name: str | None, task: str, spec: dict[str, Any],
                     configs: list[Any]) -> list[str]:
        """Record the sweep and its cells (runs inserted as queued when new), in one transaction and in bulk
        (flctl.db.bulk.record_sweep). Idempotent; returns the ids of the runs it added (queued, no attempt yet)."""
        configs = list({c.run_id: c for c in configs}.values())
        return self.write(lambda s: record_sweep(s, Sweep(id=sweep_id, name=name, task=task, spec=spec), configs))

    def count_submission(self, sweep_id: str) -> None:
        self.write(lambda s: s.execute(update(Sweep).where(Sweep.id == sweep_id)
                                       .values(submissions=Sweep.submissions + 1)))

    def get_sweep(self, sweep_id_or_name: str) -> dict[str, Any] | None:
        """A sweep by its id, its name (the latest of that name) or a unique hex prefix of its id (4 digits or
        more, matched literally); None when nothing matches. ConfigError for an ambiguous prefix, and for a name
        that is also the start of another sweep's id (neither is chosen silently)."""
        with self.session() as s:
            sweep = find_sweep(s, sweep_id_or_name)
            if sweep is None:
                return None
            return {"id": sweep.id, "name": sweep.name, "task": sweep.task, "spec": sweep.spec,
                    "created_at": sweep.created_at.isoformat(), "submissions": sweep.submissions}

    def list_sweeps(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The sweeps, newest first (the ``limit`` newest), with their cells counted (flctl.db.counts.list_sweeps)."""
        return list_sweeps(self, limit)

    def sweep_counts(self, sweep_id: str, stale_after: float = STALE_AFTER_S) -> SweepCounts:
        """The sweep's cells counted by method and state, its failures by error (flctl.db.counts.sweep_counts): what
        its ledger shows (flctl.status.ledger)."""
        return sweep_counts(self, sweep_id, stale_after)

    def sweep_runs(self, sweep_id: str, stale_after: float = STALE_AFTER_S) -> list[dict[str, Any]]:
        """The runs of a sweep's cells (status, attempts, heartbeat, metrics), without their artifacts;
        ``stale`` marks running runs whose worker is gone."""
        cols = (Run.id, Run.method, Run.seed, Run.status, Run.attempts, Run.epochs_done, Run.heartbeat_at,
                Run.host, Run.pid, Run.metrics, Run.config, Run.error, Run.finished_at, Run.duration_s)
        with self.session() as s:
            rows = s.execute(select(*cols).join(SweepCell, SweepCell.run_id == Run.id)
                             .where(SweepCell.sweep_id == sweep_id).order_by(Run.id)).all()
            at = db_now(s)
            return [dict(r._mapping, stale=r.status == Status.RUNNING and _is_stale(r, stale_after, at)) for r in rows]

    def get_run(self, run_id_or_prefix: str) -> RunRecord | None:
        """A run by its id or a unique hex prefix of it (4 to 64 digits, matched literally: no wildcards); None
        when none matches. ConfigError for anything that is not such a prefix, or one several runs share."""
        if not is_id_prefix(run_id_or_prefix):
            raise ConfigError(f"run id {shown(run_id_or_prefix)}: give 4 to 64 hex digits of it (see `flctl runs`)")
        with self.session() as s:
            try:
                run = s.get(Run, run_id_or_prefix.lower()) or by_prefix(s, Run, run_id_or_prefix, "run")
            except ValueError:    # a row of text that is not JSON or not a time: named (DamagedRow), not the database
                if found := unreadable(s, select(Run).where(Run.id.startswith(run_id_or_prefix.lower(),
                                                                             autoescape=True))):
                    raise found[0] from None
                raise
            return None if run is None else run.record()

    def list_runs(self, *, task: str | None = None, method: str | None = None, status: str | None = None,
                  seed: int | None = None, limit: int | None = None) -> list[RunRecord]:
        q = _run_filter(select(Run).order_by(Run.created_at.desc()), task, method, status, seed)
        if limit:
            q = q.limit(limit)
        with self.session() as s:
            runs, damaged = checked_runs(s, q)
        left_out(damaged)       # a damaged row is said and left out: it does not stop the listing
        return runs

    def count_runs(self, *, task: str | None = None, method: str | None = None, status: str | None = None,
                   seed: int | None = None) -> int:
        """How many runs ``list_runs`` would list without a limit."""
        with self.session() as s:
            return s.scalar(_run_filter(select(func.count()).select_from(Run), task, method, status, seed)) or 0


def _run_filter(q: Any, task: str | None, method: str | None, status: str | None, seed: int | None) -> Any:
    """``q`` restricted to the runs of the given task, method, status and seed (None: any)."""
    if method is not None:
        from flctl.method_info import canonical

        method = canonical(method)
    for col, val in ((Run.task, task), (Run.method, method), (Run.status, status), (Run.seed, seed)):
        if val is not None:
            q = q.where(col == val)
    return q
