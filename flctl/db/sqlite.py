"""SQLite's rules for the run database (its flctl.db.dialect): pragmas, BEGIN IMMEDIATE for writers, read-only opens
that create no file (immutable under a shared lock of an idle WAL database), writable connections that never make the
file again once it is deleted, WAL mode, and a lock file beside the database."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL, Engine

from flctl.db.dialect import Connect, Dialect, process_lock, try_lock
from flctl.errors import DatabaseDeleted, StoreError

_MEMORY_LOCKS: dict[str, threading.Lock] = {}     # the locks of an in-memory database, by name: this process only


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    # busy_timeout makes a locked writer wait instead of failing. The driver's own transaction handling is turned
    # off so that _sqlite_begin decides how to begin. No journal mode here: the file may not be flctl's, and
    # switching it to WAL rewrites its header (SQLite.opened does it once the schema is known to be ours).
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
    -wal file and cannot checkpoint into the database file (that needs the lock we share).

    The -wal file is looked for before the database file is opened: closing any descriptor of a file drops every
    POSIX lock this process holds on it, SQLite's own included, so a process that has the database open (a -wal
    file is there while it does: `flctl run` then a report through the Python API) must not open and close it here.
    Without its shared lock, another process's last connection would checkpoint and delete the -wal file under it,
    and it would read a "malformed" database."""
    if Path(f"{path}-wal").exists():
        return None
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


def never_made_again(url: URL, create: bool = True) -> URL:
    """``url`` (a SQLite file, writable) such that no connection ever creates the file: SQLite makes an empty
    database wherever none is, so a connection opened after the file was deleted (a worker's heartbeat, its fence,
    a pool's new connection) would put an empty one in its place, and the deletion would read as a replacement
    (flctl.db.store.moved). The file is made here, once, as the store opens, as SQLite would have made it then;
    not even then without ``create`` (a worker joining a sweep: its database exists, or it was deleted)."""
    from urllib.parse import quote

    if not url.database or url.database == ":memory:" or url.query.get("uri"):
        return url
    path = Path(url.database).resolve()
    if not path.exists():
        if not create:
            raise FileNotFoundError(f"the database {path} was deleted")
        sqlite3.connect(path).close()
    return url.set(database=f"file:{quote(str(path))}", query={**url.query, "mode": "rw", "uri": "true"})


def _lock_file(engine: Engine, name: str) -> Path | None:
    """The file beside the database whose lock is the database-wide lock ``name`` (None: a database in memory)."""
    if (database := file_of(engine.url)) is None:
        return None
    return lock_path(Path(database), name)


def lock_path(database: Path, name: str) -> Path:
    """The lock file of the database-wide lock ``name`` beside the SQLite file ``database``."""
    return database.with_name(f"{database.name}.{name}.lock")


def file_of(url: URL) -> str | None:
    """The file path of a SQLite ``url`` (one ``never_made_again`` wrote as a ``file:`` URI too); None for memory."""
    from urllib.parse import unquote

    database = url.database
    if database and url.query.get("uri") and database.startswith("file:"):
        database = unquote(database.removeprefix("file:"))
    return None if not database or database == ":memory:" else database


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


class SQLite(Dialect):
    name = "sqlite"
    full_signs = (*Dialect.full_signs, "database or disk is full")       # SQLITE_FULL

    def targets(self, url: URL, *, readonly: bool, create: bool) -> list[str | Connect]:
        """Read-only: SQLite's read-only mode, else the file as immutable (a folder that cannot take the lock
        files). Writable: a URL that never makes the file again (never_made_again)."""
        if readonly and url.database:
            path = Path(url.database).resolve()
            return [_readonly_sqlite(path), _readonly_sqlite(path, immutable=True)]
        if url.query.get("mode") == "ro" or url.query.get("immutable") in ("1", "true"):
            raise StoreError(f"{url.render_as_string()} asks SQLite for a read-only database; this command writes "
                             "(drop ?mode=ro / ?immutable=1 from --db / FLCTL_DB)")
        try:
            return [never_made_again(url, create).render_as_string(hide_password=False)]
        except FileNotFoundError as exc:
            raise DatabaseDeleted(str(exc)) from None
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open database {url.render_as_string()}: {exc} "
                             "(check --db / FLCTL_DB and that its folder exists)") from None

    def engine_args(self, *, readonly: bool) -> dict[str, Any]:
        return {"connect_args": {"timeout": 30}}

    def set_up(self, engine: Engine, *, readonly: bool) -> None:
        event.listen(engine, "connect", _sqlite_pragmas_readonly if readonly else _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin_readonly if readonly else _sqlite_begin)

    def opened(self, engine: Engine, *, readonly: bool) -> None:
        """Put flctl's SQLite database (known to be ours by now) in WAL mode, where readers run beside one writer.
        The mode is kept in the file, so it is set once, on the driver's connection, outside any transaction."""
        if readonly:
            return
        from flctl.db.upgrade import SCHEMA_LOCK

        conn = engine.raw_connection()
        try:
            if conn.cursor().execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal":
                return                     # the usual case: set by whoever opened the database first
            # Switching needs the file to itself, and SQLite answers "database is locked" at once (no busy wait)
            # while another process holds it: e.g. several processes opening a new database together. The schema
            # lock orders them; a reader still in the file gets a few short retries.
            with self.exclusive(engine, SCHEMA_LOCK):
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

    @contextmanager
    def exclusive(self, engine: Engine, name: str) -> Iterator[None]:
        """The database is one machine's file: an exclusive file lock beside it (an in-memory one: this process)."""
        import fcntl

        if (path := _lock_file(engine, name)) is None:
            with process_lock(name, _MEMORY_LOCKS):
                yield
            return
        with open(path, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield

    @contextmanager
    def try_exclusive(self, engine: Engine, name: str) -> Iterator[bool]:
        """``exclusive``'s lock file taken without waiting (LOCK_NB): yields whether it was."""
        import fcntl

        if (path := _lock_file(engine, name)) is None:
            with try_lock(process_lock(name, _MEMORY_LOCKS)) as got:
                yield got
            return
        with open(path, "a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                got = False
            else:
                got = True
            yield got       # closing the file releases the lock

    def file(self, url: URL) -> Path | None:
        database = file_of(url)
        return None if database is None else Path(database).resolve()

    def made_files(self, url: URL) -> tuple[Path, ...]:
        from flctl.db.upgrade import SCHEMA_LOCK

        path = self.file(url)
        return () if path is None or self.in_memory(url) else (path, lock_path(path, SCHEMA_LOCK))

    def for_others(self, url: URL) -> str:
        return self.targets(url, readonly=False, create=False)[0]         # type: ignore[return-value]

    def in_memory(self, url: URL) -> bool:
        database = url.database
        return (not database or database == ":memory:" or url.query.get("mode") == "memory"
                or database.startswith("file::memory:"))

    def path_problem(self, url: URL) -> str | None:
        from flctl.text import path_problem

        return path_problem("the SQLite database", url.database) if url.database else None
