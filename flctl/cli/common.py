"""Shared CLI plumbing: one-line errors with exit code 2, results directory and database resolution."""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn, Optional, TypeVar

import typer
from rich.console import Console

from flctl import results
from flctl.config import PANELS
from flctl.errors import ConfigError


def tolerate_narrow_encodings() -> None:
    """Print through stdout and stderr whatever their encoding: under PYTHONIOENCODING=ascii (or a latin-1
    terminal) ε, α, λ and the table rules cannot be encoded, and each print would raise UnicodeEncodeError. Such
    characters print as '?' instead (one for one, so tables keep their columns); UTF-8 streams are left alone."""
    import codecs

    for stream in (sys.stdout, sys.stderr):
        encoding = getattr(stream, "encoding", None) or "utf-8"
        try:
            utf = codecs.lookup(encoding).name.startswith("utf")
        except LookupError:
            utf = False
        if not utf and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")


# Piped or redirected output (`flctl runs > file`) gets no terminal width to fit: rich would cut tables at 80
# columns ("be…"), so off a terminal the lines are as wide as their content (COLUMNS still wins when set).
# emoji=False: rich would print a user's text such as `cuda:x:` as an emoji (❌); text from users is printed as it
# is, through safe().
# (No stdout at all: a closed one in a process that did not start through flctl.shell.install.)
_terminal = getattr(sys.stdout, "isatty", bool)()
console = Console(width=None if _terminal or "COLUMNS" in os.environ else 10_000, emoji=False)
err_console = Console(stderr=True, emoji=False)

DEFAULT_RESULTS = results.DEFAULT_RESULTS
T = TypeVar("T")


def safe(text: object) -> str:
    """User text (names, paths, options, database rows, error messages quoting them) as rich prints it literally:
    without control characters (ESC sequences, bidi overrides such as U+202E, newlines), without passwords, with
    markup such as `[/x]` escaped. Every piece of user text the CLI prints goes through here."""
    from rich.markup import escape

    from flctl.text import printable, redact

    return escape(printable(redact(str(text))))


def print_error(message: str) -> None:
    """The one `error:` line; the whole message is made safe, since messages quote user input."""
    err_console.print(f"[bold red]error:[/] {safe(message)}", highlight=False, soft_wrap=True)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print a one-line error and exit (2 = bad input: nothing was written)."""
    print_error(message)
    raise typer.Exit(code)


# Where a command's results and database are: the doorway's (flctl.results), with its ConfigError or StoreError
# said as the command's one line, exit 2.

def bad_input_exits_2(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, or its ConfigError or StoreError as one line, exit 2 (bad input: nothing written)."""
    from flctl.errors import StoreError

    try:
        return fn(*args, **kwargs)
    except (ConfigError, StoreError) as exc:
        fail(str(exc))


def results_folder(results_dir: Path | None, db: str | None, voice: results.Voice = results.CLI) -> results.Results:
    """The command's results folder and database, found and checked once by the doorway (flctl.results.find: the
    folder's path, the folder, then the database's URL, in the API's order), or the first problem as one line, exit
    2. ``voice``: how its errors name the folder. What the command does with the folder is handed this."""
    return bad_input_exits_2(results.find, results_dir, db, voice)


def make_folder(folder: results.Results, *, dry: bool = False) -> None:
    """Create the results folder if needed and prove it takes a file; ``dry`` (a dry run's check): leave nothing
    behind (flctl.results.Results.make)."""
    bad_input_exits_2(folder.make, dry=dry)


def check_device(device: str, *, here: bool = True) -> str:
    """flctl.devices.resolve_device, or its one line and exit 2."""
    from flctl.devices import resolve_device

    try:
        return resolve_device(device, here=here)
    except ConfigError as exc:
        fail(str(exc))


def open_results(folder: results.Results):
    """The results folder, made if needed and proven writable, and its run database opened for writing; closed when
    the command ends (also when it runs in a process that lives on: the Python API, a test's CliRunner). A database
    that cannot be opened fails in one line and takes back the folders made for it."""
    store = bad_input_exits_2(folder.open_to_write)
    try:        # typer >= 0.29 vendors click
        from typer._click.globals import get_current_context
    except ImportError:
        from click import get_current_context  # type: ignore[no-redef]
    context = get_current_context(silent=True)
    if context is not None:
        context.call_on_close(store.close)
    return store


def existing_store(folder: results.Results, *, readonly: bool = True):
    """Open the folder's existing database without creating one (exit 2 where its file is not there: opening it
    would make it); ``readonly`` (listings, reports) writes nothing to it."""
    return bad_input_exits_2(folder.open_to_read, readonly=readonly)


def config_options(axes_panel: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., None]]:
    """Give a command one option per RunConfig field (flctl.config.FIELDS: flags, help, panel); the command
    receives their values as ``fields``, None where not given. With ``axes_panel`` (`flctl sweep`) the fields a
    sweep may vary take text (lists, ranges) and are listed in that panel; the others keep their type."""
    from flctl.config import FIELDS, PANELS

    def decorate(fn: Callable[..., Any]) -> Callable[..., None]:
        signature = inspect.signature(fn, eval_str=True)
        own = [p for p in signature.parameters.values() if p.name != "fields"]
        added = []
        for f in FIELDS.values():
            as_axis = axes_panel is not None and f.axis
            option = typer.Option(*f.flags, help=f.help, rich_help_panel=axes_panel if as_axis else PANELS[f.panel],
                                  autocompletion=complete_from(f.choices, listed=as_axis) if f.choices else None)
            added.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=None,
                                           annotation=Annotated[Optional[str if as_axis else f.kind], option]))

        def command(**kwargs: Any) -> None:
            fields = {name: kwargs.pop(name) for name in FIELDS}
            fn(**kwargs, fields=fields)

        command.__signature__ = signature.replace(parameters=own + added)  # type: ignore[attr-defined]
        command.__name__, command.__doc__ = fn.__name__, fn.__doc__
        return command

    return decorate


LAUNCH_PANEL = PANELS["launch"]


def launch_options(fn: Callable[..., Any]) -> Callable[..., None]:
    """Give a command one option per launch flag (flctl.launch.settings.LaunchFlags: the general flags, then each
    built-in launcher's options; name, help, panel); the command receives them as ``launch``, a LaunchFlags. A
    KEY=VALUE table (--sbatch) is a repeatable option. `flctl sweep` and `flctl paper` launch sweeps the same way."""
    import typing

    from flctl.cli.completion import complete_logger
    from flctl.launch.settings import LaunchFlags

    completers = {"log_to": complete_logger}       # what a shell offers after the flag
    kinds = typing.get_type_hints(LaunchFlags)
    signature = inspect.signature(fn, eval_str=True)
    own = [p for p in signature.parameters.values() if p.name != "launch"]
    added, tables = [], []
    for f in dataclasses.fields(LaunchFlags):
        kind = next(a for a in typing.get_args(kinds[f.name]) if a is not type(None))
        if typing.get_origin(kind) is dict:
            kind = list[str]
            tables.append(f.name)
        option = typer.Option(f"--{f.name.replace('_', '-')}", help=f.metadata["help"],
                              rich_help_panel=f.metadata["panel"], autocompletion=completers.get(f.name))
        added.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=None,
                                       annotation=Annotated[Optional[kind], option]))

    def command(**kwargs: Any) -> None:
        given = {f.name: kwargs.pop(f.name) for f in dataclasses.fields(LaunchFlags)}
        for name in tables:
            given[name] = parse_options(given[name], f"--{name.replace('_', '-')}") or None
        fn(**kwargs, launch=LaunchFlags(**given))

    command.__signature__ = signature.replace(parameters=own + added)  # type: ignore[attr-defined]
    command.__name__, command.__doc__ = fn.__name__, fn.__doc__
    return command


def find(lookup: Callable[[str], T | None], ref: str, what: str) -> T:
    """``lookup(ref)`` (a run or sweep by id, unique id prefix or name), or a one-line error: a malformed or
    ambiguous reference, or none found (``what``: "run" or "sweep", whose listing command is named)."""
    from flctl.errors import ConfigError
    from flctl.text import shown

    try:
        found = lookup(ref)
    except ConfigError as exc:
        fail(str(exc))
    if found is None:
        fail(f"no {what} {shown(ref)} in the database; list them with `flctl {what}s`")
    return found


def complete_from(values, *, listed: bool = False) -> Callable[[str], list[str]]:
    """Shell completion of a fixed list of values (methods, plot kinds, tables, formats). ``listed``: the option
    takes a comma-separated list (a sweep axis, `--methods erm,fl`), and the value after the last comma is
    completed."""
    def complete(incomplete: str) -> list[str]:
        head, _, last = incomplete.rpartition(",") if listed else ("", "", incomplete)
        return [head + "," + v if head else v for v in values if v.startswith(last)]
    return complete


def parse_options(pairs: list[str] | None, flag: str = "--option") -> dict[str, str]:
    """Repeated ``KEY=VALUE`` options (-o, --sbatch) as a dict; a pair without ``=`` or without a key, and a key given
    twice with two values (one would be dropped without a word), are one line, exit 2."""
    out: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = (part.strip() for part in pair.partition("="))
        if not sep or not key:
            fail(f"{flag} expects KEY=VALUE, got {pair!r}")
        if out.setdefault(key, value) != value:
            fail(f"{flag} {key} is given twice, as {out[key]!r} and {value!r}; give it once")
    return out


def with_model(options: dict[str, str], model: str | None) -> dict[str, str]:
    """``--model M`` is shorthand for ``-o model=M``; giving both is ambiguous."""
    if model is None:
        return options
    if "model" in options:
        fail("give either --model or -o model=..., not both")
    return {**options, "model": model}


# Where a command finds the results and the database: one declaration of each option, for every command.
RESULTS_DIR_HELP = f"Results folder: records, runs, jobs, reports, flctl.db [env FLCTL_RESULTS, else ./{DEFAULT_RESULTS}]."
DB_HELP = "Database URL [env FLCTL_DB, else sqlite: flctl.db in the results folder]."


ResultsDirOption = Annotated[Optional[Path], typer.Option("--results-dir", help=RESULTS_DIR_HELP,
                                                          rich_help_panel=PANELS["where"])]
DbOption = Annotated[Optional[str], typer.Option(help=DB_HELP, rich_help_panel=PANELS["where"])]


def gpu_sharing_line(device: str, settings) -> str | None:
    """How the workers of a launch on this machine share a GPU (--per-gpu K > 1 on CUDA): through NVIDIA MPS or by
    taking turns (flctl.launch.backends.local.gpu_sharing); None otherwise."""
    launcher = settings.launcher
    if not device.startswith("cuda") or settings.per_gpu < 2 or not launcher.runs_here or launcher.in_process:
        return None
    from flctl.launch.backends.local import gpu_sharing

    return gpu_sharing(settings.per_gpu)


def said_launched(launched, sid: str, spec, settings, quiet: bool = False, root: Path | None = None) -> None:
    """What a launch did (flctl.launch.plan.Launched), as `flctl sweep` and `flctl paper` say it; ``quiet`` (each
    --tune trial's launch): only the worker jobs it started. ``root``: the results folder (where --log-to writes)."""
    if not quiet:
        console.print(f"sweep [bold]{sid}[/]{f' ({safe(spec.name)})' if spec.name else ''}: {launched.cells} cells, "
                      f"{launched.added} new, {launched.completed} completed, {len(launched.requeued)} re-queued "
                      "after a lost worker" + (f", {len(launched.gave_up)} given up" if launched.gave_up else "")
                      + f"; {launched.todo} to do"
                      + (f", {launched.live} worker(s) already on it" if launched.live else ""))
    if not quiet and settings.log_to and launched.todo and root is not None:
        from flctl.loggers import where

        console.print(f"logging to {safe(where(settings.log_to, root))}")
    if not quiet and settings.log_to and launched.completed:
        # --log-to logs what trains; cells finished before (by another launch, with or without it) are the export's
        console.print(f"--log-to logs the cells this launch trains; the {launched.completed} finished before are "
                      f"logged by `flctl export {sid} --to {safe(settings.log_to[0])}` (where they are not already)")
    if not quiet and (sharing := gpu_sharing_line(spec.device, settings)):
        console.print(sharing)
    if launched.jobs:
        ids = sorted({settings.launcher.job_group(j.job_id) for j in launched.jobs})
        console.print(f"{len(launched.jobs)} worker job(s) through {settings.executor}: "
                      f"{safe(', '.join(ids[:5]))}{' ...' if len(ids) > 5 else ''}"
                      + (" and one in this process" if launched.here else ""))
    elif launched.here:
        console.print("1 worker, in this process")
    elif settings.launcher.in_process and launched.todo:       # a launcher whose workers ran before it returned
        console.print(f"its workers ran in this process ({safe(settings.executor)})")
