"""The run database's schema moves forward in place (Alembic revisions in flctl/migrations); a newer one is refused."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from flctl import migrations
from flctl.cli import app
from flctl.db import Store
from flctl.db.schema import Base, Meta
from flctl.db.upgrade import check_schema, newest_revision
from flctl.errors import OlderSchema, StoreError
from tests.helpers import config
from tests.test_concurrency import pg_database

pytestmark = pytest.mark.notorch

HEAD = migrations.head()
NEXT_REVISION = f"{int(HEAD) + 1:04d}"
NEXT = f'''"""A next version's change: a note per run.

Revision ID: {NEXT_REVISION}
Revises: {HEAD}
"""
import sqlalchemy as sa
from alembic import op

revision = "{NEXT_REVISION}"
down_revision = "{HEAD}"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("note", sa.Text(), nullable=True))
'''


# Columns of the runs table that revisions after the baseline added (0002: trained_with, 0003: claim_token,
# 0006: provenance).
V1_LATER_COLUMNS = ("trained_with", "claim_token", "provenance")


def url_for(backend: str, tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'flctl.db'}" if backend == "sqlite" else pg_database()


def revision(url: str) -> str:
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.connect() as conn:
        found = conn.execute(sa.text("SELECT version_num FROM flctl_alembic_version")).scalar_one()
    engine.dispose()
    return found


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_database_from_before_migrations_is_adopted_and_keeps_its_runs(tmp_path: Path, backend: str) -> None:
    url = url_for(backend, tmp_path)
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    Base.metadata.create_all(engine)                         # what flctl wrote before: tables and schema v1
    Store(engine).add_runs([config("two-moons", "fl")])       # a run, then the columns v1 did not have go
    with engine.begin() as conn:
        for column in V1_LATER_COLUMNS:                       # added by revisions after the baseline
            conn.execute(sa.text(f"ALTER TABLE runs DROP COLUMN {column}"))
        conn.execute(sa.insert(Meta).values(key="schema_version", value="1"))
    engine.dispose()

    with pytest.raises(OlderSchema, match="older flctl: `flctl migrate` upgrades it"):
        Store.open(url, readonly=True)                        # a read leaves it as it is
    cli = CliRunner()
    refused = cli.invoke(app, ["runs", "--db", url])
    assert refused.exit_code == 2 and "`flctl migrate` upgrades it" in refused.stderr
    with engine.connect() as conn:                            # left as it was: no revision table yet
        assert "flctl_alembic_version" not in sa.inspect(conn).get_table_names()
    migrated = cli.invoke(app, ["migrate", "--db", url])
    assert migrated.exit_code == 0 and f"upgraded the database to schema revision {HEAD}" in migrated.stdout
    assert revision(url) == HEAD
    assert config("two-moons", "fl").run_id[:8] in cli.invoke(app, ["runs", "--db", url]).stdout   # its prefix
    again = cli.invoke(app, ["migrate", "--db", url])
    assert again.exit_code == 0 and "up to date" in again.stdout
    store = Store.open(url)
    assert [r.id for r in store.list_runs()] == [config("two-moons", "fl").run_id]
    store.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_the_next_version_upgrades_in_place_and_this_one_refuses_it(tmp_path: Path, backend: str) -> None:
    url = url_for(backend, tmp_path)
    store = Store.open(url)
    store.add_runs([config("two-moons", "fl")])
    assert revision(url) == HEAD

    scripts = tmp_path / "next"                               # the next flctl: today's revisions plus one
    shutil.copytree(Path(__import__("flctl.migrations").migrations.SCRIPTS), scripts)
    (scripts / "versions" / f"{NEXT_REVISION}_note.py").write_text(NEXT)
    check_schema(store, scripts)
    assert revision(url) == NEXT_REVISION
    with store.engine.connect() as conn:
        assert "note" in {c["name"] for c in sa.inspect(conn).get_columns("runs")}
    assert len(store.list_runs()) == 1                        # nothing lost
    check_schema(store, scripts)                              # at head: nothing to do
    store.close()

    with pytest.raises(StoreError, match=f"revision {NEXT_REVISION} is newer than this flctl knows: upgrade flctl"):
        Store.open(url)
    res = CliRunner().invoke(app, ["runs", "--db", url])
    assert res.exit_code == 2 and "upgrade flctl" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_the_newest_revision_file_is_alembics_head(tmp_path: Path) -> None:
    """check_schema tells a current database from the revision files' names (without importing Alembic): the name
    must say what Alembic says, here and with a revision added."""
    assert newest_revision(migrations.SCRIPTS) == HEAD
    scripts = tmp_path / "next"
    shutil.copytree(migrations.SCRIPTS, scripts)
    (scripts / "versions" / f"{NEXT_REVISION}_note.py").write_text(NEXT)
    assert newest_revision(scripts) == migrations.head(scripts) == NEXT_REVISION


def test_opening_a_current_database_imports_no_alembic(tmp_path: Path) -> None:
    """Every command and worker opens the database: one at today's revision costs two reads, not Alembic's import
    and walk of its scripts (0.3 s)."""
    import subprocess
    import sys

    Store.open(f"sqlite:///{tmp_path / 'runs.db'}").close()
    code = (f"import sys; from flctl.db import Store; Store.open('sqlite:///{tmp_path / 'runs.db'}').close(); "
            "print('alembic' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stdout + out.stderr
