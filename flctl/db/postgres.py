"""PostgreSQL's rules for the run database: the driver flctl ships (psycopg 3), a connect timeout, a small bounded
pool, read-only transactions for commands that only read, and transaction-level advisory locks: all of it works
through PgBouncer in transaction pooling."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy.engine import Engine

from flctl.db.dialect import Dialect

# A store's connections (PostgreSQL.engine_args): at most POOL_SIZE kept open, up to POOL_OVERFLOW more for a moment.
POOL_SIZE, POOL_OVERFLOW = 2, 2


def normalize(url: str) -> str:
    """psycopg 3 is the driver flctl ships; plain postgresql:// (or postgres://) would ask SQLAlchemy for psycopg2."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


class PostgreSQL(Dialect):
    name = "postgresql"
    full_signs = (*Dialect.full_signs, "could not extend file")      # SQLSTATE 53100, disk_full

    def engine_args(self, *, readonly: bool) -> dict[str, Any]:
        """What works behind PgBouncer in transaction pooling as well as on the server itself (docs/scale.md), where
        consecutive transactions of one client may run on different server connections: no statement prepared on
        the server (psycopg prepares one after 5 runs; PgBouncer 1.18 cannot route it to the connection that knows
        it), and read-only by transaction (psycopg's BEGIN READ ONLY), not by a startup parameter PgBouncer refuses.
        The pool is small and bounded: a worker's thread reuses one connection and its heartbeat thread another
        (POOL_SIZE kept open); a thread that holds the database-wide lock opens a session under it, and the heartbeat
        may beat meanwhile, so up to POOL_OVERFLOW more for a moment, closed as they return. A pool that lent none
        of them would wait its timeout (30 s) for the holder's own connection."""
        args: dict[str, Any] = {"connect_args": {"connect_timeout": 10, "prepare_threshold": None},
                                "pool_size": POOL_SIZE, "max_overflow": POOL_OVERFLOW}
        if readonly:
            args["execution_options"] = {"postgresql_readonly": True}
        return args

    @contextmanager
    def exclusive(self, engine: Engine, name: str) -> Iterator[None]:
        """A transaction-level advisory lock, released with its transaction however the block ends: across
        processes and hosts."""
        with engine.connect() as conn, conn.begin():
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_key(name)})")
            yield

    @contextmanager
    def try_exclusive(self, engine: Engine, name: str) -> Iterator[bool]:
        """``exclusive``'s advisory lock taken without waiting (pg_try_advisory_xact_lock): yields whether it was."""
        with engine.connect() as conn, conn.begin():
            yield bool(conn.exec_driver_sql(f"SELECT pg_try_advisory_xact_lock({_key(name)})").scalar())


def _key(name: str) -> int:
    """The advisory lock key of flctl's database-wide lock ``name``."""
    return zlib.crc32(f"flctl:{name}".encode())
