"""Create a new run database, or check and upgrade an flctl one in place (flctl.migrations), under the schema lock."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from sqlalchemy import delete, insert, inspect, select, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from flctl import migrations
from flctl.db.schema import SCHEMA_VERSION, Base, Meta
from flctl.errors import EmptyDatabase, NewerSchema, OlderSchema, StoreError
from flctl.migrations import VERSION_TABLE


class Opened(Protocol):
    """What the schema check needs of a store being opened (flctl.db.store.Store)."""

    engine: Engine
    readonly: bool

    def exclusive(self, name: str) -> AbstractContextManager[None]: ...

    def session(self) -> AbstractContextManager[Session]: ...

# The database-wide lock (Store.exclusive) under which schemas are created or upgraded, flctl's and Optuna's.
SCHEMA_LOCK = "schema"


def newer(found: str, known: str) -> StoreError:
    """The refusal of a database written by a newer flctl (``found``: its schema version or revision; ``known``: what
    this flctl knows of it), one line that says what to do."""
    return StoreError(f"database schema {found} is newer than {known}: upgrade flctl (pip install -U flctl) to open it")


def newest_revision(scripts: Path) -> str:
    """The newest revision of ``scripts`` (flctl.migrations) read from its file names, without importing Alembic: its
    import and walk of the revision files are 0.3 s of every command that opens a database. Revision files are named
    after their revision, in order (``0007_engine_auto.py`` is revision 0007, down from 0006), which
    tests/test_migrations.py checks against Alembic's own head."""
    return max(p.name.split("_", 1)[0] for p in (scripts / "versions").glob("[0-9][0-9][0-9][0-9]_*.py"))


def check_schema(store: Opened, scripts: Path | None = None, locked: bool = False) -> None:
    """Create a new database, or upgrade an flctl one in place (flctl.migrations); refuse anything else. Creating
    and upgrading happen under SCHEMA_LOCK (``locked``: held already), so processes that open a new database at
    the same moment do not both create its tables (on PostgreSQL the second would fail on pg_type). A database at
    today's version and newest revision is the common case, and is told from two reads without Alembic."""
    scripts = scripts or migrations.SCRIPTS
    with store.engine.connect() as conn:
        tables = set(inspect(conn).get_table_names())
        row = conn.execute(select(Meta.value).where(Meta.key == "schema_version")).scalar() \
            if "flctl_meta" in tables else None
        at = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all() \
            if VERSION_TABLE in tables else []
    if row == str(SCHEMA_VERSION) and at == [newest_revision(scripts)]:
        return
    if row is not None and (not str(row).isdigit() or int(row) > SCHEMA_VERSION):
        raise newer(f"v{row}", f"this flctl (v{SCHEMA_VERSION})")
    try:
        older = "flctl_meta" in tables and migrations.needs_upgrade(store.engine, scripts)
    except NewerSchema as exc:
        raise newer(f"revision {exc}", "this flctl knows") from None
    if store.readonly and "flctl_meta" in tables and (row != str(SCHEMA_VERSION) or older):
        raise OlderSchema("the database is from an older flctl: `flctl migrate` upgrades it (so do flctl run "
                          "and flctl sweep); this command only reads")
    if store.readonly and not tables:
        raise EmptyDatabase("the database is empty: not an flctl database yet (`flctl migrate` makes its schema); "
                            "this command only reads")
    if store.readonly and "flctl_meta" not in tables:
        raise StoreError("the database is not an flctl database; this command only reads")
    if "flctl_meta" not in tables and tables:
        raise StoreError(f"database holds tables ({', '.join(sorted(tables))}) but is not an flctl "
                         "database; point --db at an empty or flctl database")
    if not locked and ("flctl_meta" not in tables or older or row != str(SCHEMA_VERSION)):
        with store.exclusive(SCHEMA_LOCK):     # then look again: another process may have done it meanwhile
            return check_schema(store, scripts, locked=True)
    if "flctl_meta" not in tables:
        with store.engine.begin() as conn:        # one transaction: a database is created whole or not at all
            Base.metadata.create_all(conn)
            conn.execute(delete(Meta).where(Meta.key == "schema_version"))
            conn.execute(insert(Meta).values(key="schema_version", value=str(SCHEMA_VERSION)))
            migrations.stamp_new(conn, scripts)
        return
    version = int(row) if row is not None and str(row).isdigit() else None
    if version is None or version > SCHEMA_VERSION:
        raise newer(f"v{row}", f"this flctl (v{SCHEMA_VERSION})")
    try:
        migrations.upgrade(store.engine, scripts)
    except NewerSchema as exc:
        raise newer(f"revision {exc}", "this flctl knows") from None
    if version < SCHEMA_VERSION:
        with store.session() as s:
            s.merge(Meta(key="schema_version", value=str(SCHEMA_VERSION)))
