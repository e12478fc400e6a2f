"""The one doorway to a results folder and its run database, for the CLI and the Python API alike: a command's folder
found and checked once, in one order (``find``: a ``Results``, handed down to what needs its root, URL or layout);
where they are (``results_root``, ``database_url``); the folder made for a command and taken back when the command
fails (``Results.make``, ``take_back``); its database opened to write, made and upgraded (``Results.open_to_write``),
or to read, never made (``Results.open_to_read``, ``peek``), and as a plan reads it (``peek_plan``; the runs that
price a plan are read through it by flctl.cost.stored_runs).

Bad input is a ConfigError of one line, raised before anything is written and said in the caller's words
(``Voice``: the CLI names its options, the API its arguments); a database that cannot be used is the Store's
StoreError. The CLI prints either as its one line (flctl.cli.common), the API lets them raise. What differs between
database engines is asked of their dialect (flctl.db.urls), never read here."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from flctl.errors import ConfigError
from flctl.layout import Layout

if TYPE_CHECKING:
    from flctl.db import Store

DEFAULT_RESULTS = "results"


@dataclass(frozen=True)
class Voice:
    """How a caller's one-line errors name the results folder, its database and their fixes: format strings of
    ``root`` (the folder, as given), ``why`` (what the file system said) and ``file`` (the database's file)."""

    is_a_file: str          # the results folder is a regular file
    unmade: str             # it cannot be made
    unwritable: str         # it is there but takes no file
    missing: str            # its database is a file not made yet
    missing_here: str       # ... the folder's own flctl.db (neither a database URL nor FLCTL_DB named another)


_CLI_UNWRITABLE = "results directory {root!r} is not writable ({why}); pass --results-dir"
_CLI_MISSING = ("no run database at {file}; run `flctl run TASK` first, or name the results folder that has one "
                "(--results-dir or FLCTL_RESULTS) or its database (--db or FLCTL_DB)")
CLI = Voice(
    is_a_file="results directory {root!r} is a file, not a folder; give a folder (--results-dir or FLCTL_RESULTS)",
    unmade=_CLI_UNWRITABLE, unwritable=_CLI_UNWRITABLE, missing=_CLI_MISSING, missing_here=_CLI_MISSING)
API = Voice(
    is_a_file="results_dir {root!r} is a file, not a folder; give a folder",
    unmade="results_dir {root!r} cannot be made ({why}); give a folder you can write",
    unwritable="results_dir {root!r} is not writable ({why}); give a folder you can write",
    missing="no run database at {file}; give the db (db= or FLCTL_DB) the runs were trained in",
    missing_here="no runs in {root!r}: it holds no flctl.db; give the results_dir the runs were trained in")


def results_root(results_dir: str | Path | None = None) -> Path:
    """The results folder: ``results_dir``, else FLCTL_RESULTS (an empty one is unset), else ./results; a path no
    file system takes is a ConfigError naming where it came from (the environment is read by no option parser)."""
    from flctl.text import path_problem

    chosen = results_dir if results_dir is not None else os.environ.get("FLCTL_RESULTS") or DEFAULT_RESULTS
    if (why := path_problem("results_dir" if results_dir is not None else "FLCTL_RESULTS", str(chosen))) is not None:
        raise ConfigError(why)
    return Path(chosen)


def database_url(db: str | None, root: Path) -> str:
    """The database: ``db``, else FLCTL_DB, else the results folder's flctl.db, checked without connecting. An
    in-memory database is a ConfigError: it would lose every row when the process exits, and no worker or report
    could see it."""
    from flctl.db.urls import file_url, in_memory, url_problem

    url = db or os.environ.get("FLCTL_DB") or file_url(Layout(root).db)
    if in_memory(url):
        raise ConfigError(f"{'--db' if db else 'FLCTL_DB'} {url!r} is an in-memory database, gone when this "
                          "command exits; give a file (sqlite:///results/flctl.db) or a server "
                          "(postgresql://user@host/db)")
    if (why := url_problem(url)) is not None:
        raise ConfigError(why)
    return url


def check_folder(root: Path, voice: Voice) -> None:
    """The checks of a results folder that write nothing (a dry run makes them too): not a file, and no folder
    flctl keeps inside it a file (flctl.layout.Layout.not_a_folder)."""
    if root.exists() and not root.is_dir():
        raise ConfigError(voice.is_a_file.format(root=str(root)))
    if (why := Layout(root).not_a_folder()) is not None:
        raise ConfigError(why)


@dataclass(frozen=True)
class Results:
    """A command's results folder as the doorway found and checked it, once (``find``): where it is (``root``), its
    run database (``url``), where flctl keeps each thing inside it (``layout``) and the words its errors are said in
    (``voice``). Handed down to what needs any of them, so that nothing derives or checks the folder again. The Store
    is not held here: ``open_to_write`` / ``open_to_read`` open it, and their caller closes it."""

    root: Path
    url: str
    layout: Layout
    voice: Voice

    def make(self, *, dry: bool = False) -> list[Path]:
        """The folder made and proven to take a file, its checks made once already (``_make``); the folders made,
        deepest first. ``dry``: nothing made, the nearest parent that exists proven instead."""
        return _make(self.root, self.voice, dry)

    def open_to_write(self) -> Store:
        """The folder made and its run database opened to write, made or upgraded; the folders made taken back should
        the database not open."""
        return _open_made(self.url, self.make())

    def open_to_read(self, *, readonly: bool = True) -> Store:
        """Its existing run database, never made; ``readonly``: nothing written to it (``_read``)."""
        return _read(self, readonly)


def find(results_dir: str | Path | None, db: str | None, voice: Voice) -> Results:
    """A command's results folder from its ``results_dir`` and ``db`` (each else its environment variable, else the
    default), checked in one order for the CLI and the API alike, so that one bad input is one first error: the
    folder's path (``results_root``), the folder as it is (``check_folder``: nothing written), then its database's
    URL (``database_url``: not connected). Whether it takes a file is asked where it is made (``Results.make``)."""
    root = results_root(results_dir)
    check_folder(root, voice)
    return Results(root, database_url(db, root), Layout(root), voice)


def _make(root: Path, voice: Voice, dry: bool) -> list[Path]:
    """Make the results folder ``root`` (checked already: ``check_folder``) and prove it takes a file
    (flctl.fs.refuses_files); the folders this made, deepest first, for ``take_back`` should what follows fail on
    bad input. ``dry`` (a dry run's check): make nothing, proving the nearest of its parents that exists. A
    ConfigError leaves nothing behind."""
    from flctl.fs import refuses_files

    absolute = root.absolute()
    made = [] if dry else [p for p in (absolute, *absolute.parents) if not p.exists()]
    try:
        if not dry:
            root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        take_back(made)
        raise ConfigError(voice.unmade.format(root=str(root), why=exc.strerror or exc)) from None
    try:
        why = refuses_files(next(p for p in (absolute, *absolute.parents) if p.exists()))
    except OSError as exc:
        why = str(exc.strerror or exc)
    if why is not None:
        take_back(made)
        raise ConfigError(voice.unwritable.format(root=str(root), why=why))
    return made


def take_back(made: list[Path]) -> None:
    """Remove the folders ``Results.make`` made, deepest first, while they are empty: never another's files (a folder
    another command began to fill meanwhile stays)."""
    for folder in made:
        try:
            folder.rmdir()
        except OSError:
            break


def _open_made(url: str, made: list[Path]) -> Store:
    """The run database at ``url`` opened to write; the folders ``made`` for it taken back should it not open."""
    from flctl.db import Store

    try:
        return Store.open(url)
    except BaseException:
        take_back(made)
        raise


def _read(found: Results, readonly: bool) -> Store:
    """The existing run database of ``found``: never made, and with ``readonly`` (listings, reports) nothing written
    to it. A database file not made yet is a ConfigError naming it (in ``found``'s voice)."""
    store = peek(found.url, readonly=readonly)
    if store is None:
        from flctl.db.urls import database_file, file_url

        said = found.voice.missing_here if found.url == file_url(found.layout.db) else found.voice.missing
        raise ConfigError(said.format(root=str(found.root), file=database_file(found.url)))
    return store


def open_sweep(url: str) -> Store:
    """A sweep's run database as its workers open it: to write, never made. A worker that starts after its sweep's
    database was deleted must not make an empty one (flctl.errors.DatabaseDeleted)."""
    from flctl.db import Store

    return Store.open(url, create=False)


def peek(url: str, *, readonly: bool = True) -> Store | None:
    """The run database at ``url`` opened to read (``readonly``: nothing written to it, not even an upgrade), or
    None where it is a file not made yet: a hint, a completion or a dry run that finds none makes none."""
    from flctl.db import Store

    return Store.open_existing(url, readonly=readonly)


def peek_plan(url: str) -> Store | None:
    """The run database at ``url`` as a plan (a dry run, a paper's programme) reads it: read-only, never made, and
    None where the real command would make it (a file not made yet, an empty one). One from an older flctl, which
    the real command upgrades, is OlderSchema (its rows cannot be read until then); what the real command would
    refuse is refused here in its one line (StoreError): a newer flctl's database, one not flctl's or damaged, a
    server that cannot be reached. A plan never reads such a database as "nothing trained yet"."""
    from flctl.errors import EmptyDatabase

    try:
        return peek(url)
    except EmptyDatabase:
        return None

