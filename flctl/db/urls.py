"""A database URL, read through its engine's dialect (flctl.db.dialect): the dialect it gets, the form flctl connects
to, the form another library is given, and what a URL says before anything connects (not a URL, in memory, the file
it names). No engine's URL form is read anywhere else."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy.engine import URL, make_url

from flctl.db import postgres
from flctl.db.dialect import Dialect
from flctl.db.postgres import PostgreSQL
from flctl.db.sqlite import SQLite

DIALECTS: tuple[Dialect, ...] = (SQLite(), PostgreSQL())
EXAMPLES = "(e.g. sqlite:///results/flctl.db, postgresql://user@host/db)"


def file_url(path: Path) -> str:
    """The URL of the SQLite database file at ``path`` (a results folder's flctl.db, MLflow's own store)."""
    return f"sqlite:///{path}"


def normalize_url(url: str) -> str:
    """``url`` as flctl connects to it: PostgreSQL's through the driver flctl ships."""
    return postgres.normalize(url)


def dialect_of(url: URL) -> Dialect:
    """The rules of ``url``'s engine: SQLite's, PostgreSQL's, or the base's for any other."""
    return next((d for d in DIALECTS if d.name == url.get_backend_name()), Dialect())


def parsed(url: str) -> URL | None:
    """``url`` normalized and parsed; None where it is not a URL (Store.open says so in one line)."""
    try:
        return make_url(normalize_url(url))
    except Exception:       # noqa: BLE001 - any parse failure is the same answer
        return None


def existing_storage(url: str) -> Any:
    """An Optuna storage (RDBStorage) on flctl's database at ``url``, which must exist already: its URL is such that
    it never makes the database (Dialect.for_others; an Optuna sync after a SQLite database was deleted would
    otherwise leave an empty one in its place), and its engine gets the arguments flctl's own stores get
    (Dialect.engine_args: PostgreSQL's work behind PgBouncer)."""
    import optuna

    parsed_url = make_url(normalize_url(url))
    dialect = dialect_of(parsed_url)
    return optuna.storages.RDBStorage(dialect.for_others(parsed_url), engine_kwargs=dialect.engine_args(readonly=False))


def in_memory(url: str) -> bool:
    """Whether ``url`` is a database in this process's memory (SQLite's ``sqlite://``, ``:memory:``, ...): every row
    gone when the process exits. A string that is not a URL is not (url_problem says what it is)."""
    found = parsed(url)
    return found is not None and dialect_of(found).in_memory(found)


def url_problem(url: str) -> str | None:
    """Why ``url`` is no database URL flctl can open, said without connecting (a dry run checks it too): not a URL,
    an engine SQLAlchemy does not have, or a file no file system takes; None where it is one."""
    from flctl.text import redact

    found = parsed(url)
    if found is None:
        return f"{redact(url, url)!r} is not a database URL {EXAMPLES}"
    try:
        found.get_dialect()
    except Exception:       # noqa: BLE001 - NoSuchModuleError, or a driver's import failing
        return f"{redact(url, url)!r} is not a database URL flctl can open: SQLAlchemy has no engine " \
               f"{make_url(url).drivername!r} {EXAMPLES}"
    return dialect_of(found).path_problem(found)


def database_file(url: str) -> Path | None:
    """The file the database at ``url`` lives in (None: a server's, in memory, or not a URL)."""
    found = parsed(url)
    return None if found is None else dialect_of(found).file(found)
