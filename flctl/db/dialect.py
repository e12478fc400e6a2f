"""What differs between database engines, behind the one interface ``Store`` asks (flctl.db.store): how a URL is
connected to, what an engine is set up with, what is done once the schema is known to be flctl's, the database-wide
lock, the file a database lives in (and its identity, DatabaseFile), whether a URL is in memory and what the
engine says when its disk is full. SQLite's dialect is flctl.db.sqlite, PostgreSQL's flctl.db.postgres; any
other engine SQLAlchemy reaches gets this base, whose lock holds within one process only (docs/extending.md, "A
database backend", says what a new engine must add)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

from sqlalchemy.engine import URL, Engine

# A function that makes a DBAPI connection (a creator): its connections are not pooled, each session decides afresh.
Connect = Callable[[], Any]

# The locks of an engine without a dialect of its own (Dialect.exclusive), by name: this process only.
_PROCESS_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_LOCK = threading.Lock()


def process_lock(name: str, locks: dict[str, threading.Lock] | None = None) -> threading.Lock:
    """This process's lock ``name`` in ``locks`` (made at first use): a lock of one name does not hold another, so
    a holder of one may take another (a mirror makes Optuna's schema under the schema lock)."""
    locks = _PROCESS_LOCKS if locks is None else locks
    with _LOCKS_LOCK:
        return locks.setdefault(name, threading.Lock())


@contextmanager
def try_lock(lock: threading.Lock) -> Iterator[bool]:
    """``lock`` taken if it is free, held through the block: yields whether it was."""
    got = lock.acquire(blocking=False)
    try:
        yield got
    finally:
        if got:
            lock.release()


class DatabaseFile(NamedTuple):
    """The file a store opened its database in, as it was then: a file deleted or replaced under the store is told
    by its identity (flctl.db.store.moved), and a sweep's workers by its inode alone (flctl.db.store.not_the_one)."""

    path: Path
    device: int
    inode: int


class Dialect:
    """One database engine's rules. Stateless: one instance serves every store of the engine."""

    name: ClassVar[str] = ""          # SQLAlchemy's backend name ("sqlite", "postgresql"); "": any other
    # What a driver's error says when a write found no room: the operating system's words, and each engine's own.
    full_signs: ClassVar[tuple[str, ...]] = ("No space left on device",)

    def targets(self, url: URL, *, readonly: bool, create: bool) -> list[str | Connect]:
        """What to connect to, in order: a URL, or a function that connects. Each but the last is given up for the
        next when the database cannot be opened that way (flctl.db.store._Unopenable). ``create``: a database that
        is not there may be made (a server's database is made by its administrator, whatever this says)."""
        return [url.render_as_string(hide_password=False)]

    def engine_args(self, *, readonly: bool) -> dict[str, Any]:
        """Keyword arguments of sqlalchemy.create_engine for a URL target (``readonly``: the store only reads)."""
        return {}

    def set_up(self, engine: Engine, *, readonly: bool) -> None:
        """Listeners on a new engine, before its first connection (pragmas, how transactions begin)."""

    def opened(self, engine: Engine, *, readonly: bool) -> None:
        """Once the schema is known to be flctl's (or was just made): what only flctl's own database may be given."""

    @contextmanager
    def exclusive(self, engine: Engine, name: str) -> Iterator[None]:
        """Hold the database-wide lock ``name``: one holder at a time. Here, within this process only: an engine
        without a dialect of its own has no lock that other processes see."""
        with process_lock(name):
            yield

    @contextmanager
    def try_exclusive(self, engine: Engine, name: str) -> Iterator[bool]:
        """The lock ``name`` of ``exclusive`` if no one holds it, without waiting: yields whether it was taken (and
        is held through the block)."""
        with try_lock(process_lock(name)) as got:
            yield got

    def file(self, url: URL) -> Path | None:
        """The file the database lives in (None: a server's, or in memory): a file can be deleted or replaced under
        the store (flctl.db.store.moved), and opening one that is not there would make it."""
        return None

    def made_files(self, url: URL) -> tuple[Path, ...]:
        """The files opening ``url`` may make, its database's file first (none: a server's, or in memory): an open
        that fails takes back those it made (flctl.db.store)."""
        return ()

    def for_others(self, url: URL) -> str:
        """``url`` for a library that opens flctl's database with an engine of its own (Optuna), such that it never
        makes a database that is not there."""
        return url.render_as_string(hide_password=False)


    def in_memory(self, url: URL) -> bool:
        """Whether ``url`` is a database that lives in this process's memory: gone when it exits."""
        return False

    def path_problem(self, url: URL) -> str | None:
        """Why the file ``url`` names cannot be a file on any file system (None: it can, or it names no file)."""
        return None

    def is_full(self, exc: BaseException) -> bool:
        """Whether the database error ``exc`` (SQLAlchemy's, or its driver's) says the disk is full."""
        text = str(getattr(exc, "orig", exc))
        return any(sign in text for sign in self.full_signs)


@contextmanager
def made_back(made: tuple[Path, ...]) -> Iterator[None]:
    """Opening a database whose open may make the files ``made`` (Dialect.made_files: SQLite's file, then the others
    beside it): where the open fails (a URL SQLite refuses, a read-only request of a command that writes), those it
    made are removed again while the database file is still empty, so that a refused URL leaves nothing behind. A
    file another process filled meanwhile is kept."""
    new = [p for p in made if not p.exists()]
    try:
        yield
    except Exception:       # a refusal; an interrupt (Ctrl-C) leaves the empty file, which harms nothing
        if made and made[0] in new:
            with contextlib.suppress(OSError):
                if made[0].stat().st_size == 0:
                    for p in new:
                        p.unlink(missing_ok=True)
        raise
