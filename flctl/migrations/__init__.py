"""Schema migrations of the run database, through Alembic (as Optuna does for its tables).

A new database gets today's tables (``Base.metadata.create_all``) and is stamped with the newest revision. An
existing one is upgraded in place to the newest revision when it is opened. One written before migrations
existed (schema v1: ``flctl_meta`` but no ``alembic_version``) is first stamped with the baseline revision,
which is exactly that schema. A database stamped with a revision this flctl does not know was written by a newer
flctl and is refused.

A schema change is: the new column or table in ``flctl/db/schema.py`` and one revision file under ``versions/`` that
makes the same change to an existing database; ``alembic -c flctl/migrations/alembic.ini revision -m "..."``
writes one from script.py.mako.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from flctl.errors import NewerSchema

if TYPE_CHECKING:
    from alembic.config import Config
    from sqlalchemy.engine import Connection, Engine

# Alembic is imported inside the functions that use it: flctl.db.upgrade reads VERSION_TABLE and SCRIPTS on every
# open of a database, and Alembic's import (0.1 s) is needed only where a schema is made or upgraded.
SCRIPTS = Path(__file__).parent
BASELINE = "0001"          # the schema of flctl_meta schema_version 1
# Where a database's revision is kept. Not Alembic's default "alembic_version": Optuna keeps its own schema revision
# there, in the same database.
VERSION_TABLE = "flctl_alembic_version"


def _config(connection: Connection, scripts: Path) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(scripts))
    cfg.attributes["connection"] = connection     # env.py migrates on this connection, in its transaction
    return cfg


def head(scripts: Path = SCRIPTS) -> str:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(scripts))
    found = ScriptDirectory.from_config(cfg).get_current_head()
    assert found is not None
    return found


def current(connection: Connection) -> str | None:
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE}).get_current_revision()


def stamp_new(connection: Connection, scripts: Path = SCRIPTS) -> None:
    """Mark a database just created from today's tables (in this connection's transaction) as being at the newest
    revision."""
    from alembic import command

    command.stamp(_config(connection, scripts), "head")


def needs_upgrade(engine: Engine, scripts: Path = SCRIPTS) -> bool:
    """The database is not at our newest revision (older, or from before migrations); NewerSchema when its revision
    is not one of ours."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(scripts))
    known = ScriptDirectory.from_config(cfg)
    with engine.connect() as conn:
        at = current(conn)
    if at is not None and at not in {s.revision for s in known.walk_revisions()}:
        raise NewerSchema(at)
    return at != known.get_current_head()


def upgrade(engine: Engine, scripts: Path = SCRIPTS) -> list[str]:
    """Bring an existing flctl database to the newest revision, in one transaction; returns the revisions it
    passed through ([] when it was current). Raises NewerSchema for a revision we do not know."""
    from alembic import command
    from alembic.script import ScriptDirectory

    with engine.begin() as conn:
        cfg = _config(conn, scripts)
        known = ScriptDirectory.from_config(cfg)
        at = current(conn)
        if at is None:                                   # written before migrations existed
            command.stamp(cfg, BASELINE)
            at = BASELINE
        if at not in {s.revision for s in known.walk_revisions()}:
            raise NewerSchema(at)
        target = known.get_current_head()
        if at == target:
            return []
        steps = [s.revision for s in known.iterate_revisions(target, at)][::-1]
        command.upgrade(cfg, "head")
        return steps


# Rows a revision reads and writes at a time (fill_configs): a database of many runs is not held in memory at once.
PAGE = 1000


def fill_configs(conn: Connection, later: Mapping[str, object]) -> None:
    """Write the ``later`` fields (name: the default older rows were hashed under) into every stored run config that
    lacks them, page by page: what a revision does when flctl.config gains fields with ``later=True``."""
    import sqlalchemy as sa

    runs = sa.table("runs", sa.column("id", sa.String), sa.column("config", sa.JSON))
    fill = runs.update().where(runs.c.id == sa.bindparam("run_id")).values(config=sa.bindparam("full"))
    last = ""
    while rows := conn.execute(sa.select(runs.c.id, runs.c.config).where(runs.c.id > last)
                               .order_by(runs.c.id).limit(PAGE)).all():
        # A config that is not a JSON object is left as it is: reading that run names the damage (Run.record).
        changed = [{"run_id": run_id, "full": {**later, **config}} for run_id, config in rows
                   if isinstance(config, dict) and not later.keys() <= config.keys()]
        if changed:
            conn.execute(fill, changed)
        last = rows[-1].id
