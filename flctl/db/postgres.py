"""PostgreSQL's rules for the run database: the driver flctl ships (psycopg 3), a connect timeout, read-only
transactions for commands that only read, and transaction-level advisory locks."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy.engine import Engine

from flctl.db.dialect import Dialect


def normalize(url: str) -> str:
    """psycopg 3 is the driver flctl ships; plain postgresql:// (or postgres://) would ask SQLAlchemy for psycopg2."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


class PostgreSQL(Dialect):
    name = "postgresql"
    full_signs = (*Dialect.full_signs, "could not extend file")      # SQLSTATE 53100, disk_full

    def engine_args(self, *, readonly: bool) -> dict[str, Any]:
        args: dict[str, Any] = {"connect_timeout": 10}
        if readonly:
            args["options"] = "-c default_transaction_read_only=on"
        return {"connect_args": args}

    @contextmanager
    def exclusive(self, engine: Engine, name: str) -> Iterator[None]:
        """A transaction-level advisory lock, released with its transaction however the block ends: across
        processes and hosts."""
        with engine.connect() as conn, conn.begin():
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({zlib.crc32(f'flctl:{name}'.encode())})")
            yield
