"""flctl's command line. Each command parses, calls one function, prints; heavy imports stay inside commands
so that `flctl --help` starts fast."""

from __future__ import annotations

import errno
import signal
import sys
from collections.abc import Callable
from typing import Annotated

import typer
from typer.core import TyperGroup

from flctl.cli import export, info, ledger, new_task, paper, report, reproduce, run, runs, sweep, verify
from flctl.cli.common import print_error, tolerate_narrow_encodings
from flctl.cli.parsing import Command
from flctl.errors import ConfigError, StoreError
from flctl.shell import STOP_SIGNALS, received


def _is(exc: BaseException, name: str) -> bool:
    # By class name: typer >= 0.29 vendors click (typer._click), older typer uses click itself; the names are the
    # same in both (typer checks NoArgsIsHelpError the same way).
    return any(c.__name__ == name for c in type(exc).__mro__)


class _OneLineErrors(TyperGroup):
    """Typer's group, with its own parse errors (a value that is not an integer, a missing argument, an unknown
    option or command) printed like every other bad input: one `error:` line, exit 2, instead of a usage panel."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):  # type: ignore[override]
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except (Exception, KeyboardInterrupt) as exc:
            if _is(exc, "NoArgsIsHelpError"):       # the help is printed already
                sys.exit(2)
            if _is(exc, "UsageError"):
                ctx = getattr(exc, "ctx", None)
                see = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
                print_error(exc.format_message().rstrip(".") + _choices(self, args, exc) + see)  # type: ignore[attr-defined]
                sys.exit(2)
            if _is(exc, "ClickException"):
                exc.show()  # type: ignore[attr-defined]
                sys.exit(exc.exit_code)  # type: ignore[attr-defined]
            if isinstance(exc, (ConfigError, StoreError)):   # bad input, or a database damaged past open: one line
                print_error(str(exc))
                sys.exit(getattr(exc, "exit_code", 2))      # 1 for damaged state (errors.DamagedRow)
            if (line := _ground_failed(exc)) is not None:     # the ground went from under a command: one line, 1
                print_error(line)
                sys.exit(1)
            if isinstance(exc, KeyboardInterrupt) or (_is(exc, "Abort") and _signalled):
                _interrupted()
            if _is(exc, "Abort"):
                print("Aborted!", file=sys.stderr)
                sys.exit(1)
            raise
        if _signalled:          # typer turns the KeyboardInterrupt of _interrupt into exit 130 (older typer: Abort)
            _interrupted()
        sys.exit(code if isinstance(code, int) else 0)


def _choices(group: TyperGroup, args: list[str] | None, exc: BaseException) -> str:
    """For an option given without its value (`flctl report --table`): the values it takes, from its completion
    (tables, plots, methods, formats, tasks); "" for an option whose values cannot be listed."""
    name = getattr(exc, "option_name", None)
    words = list(sys.argv[1:] if args is None else args)
    cmd = next((group.commands[w] for w in words if w in group.commands), None)
    if cmd is None or name is None or "requires an argument" not in str(exc):
        return ""
    for param in cmd.params:
        if name in param.opts:
            try:
                values = [str(item.value) for item in param.shell_complete(cmd.context_class(cmd), "")]
            except Exception:      # a completion that reads a database it cannot: no list, the error stands
                return ""
            return f"; give one of: {', '.join(values)}" if values else ""
    return ""


def _ground_failed(exc: BaseException) -> str | None:
    """What a command that lost its ground says, in one line (exit 1): the database server stopped answering or its
    disk failed under it (the driver's OperationalError), or a file could not be written (a full disk or quota, a
    file size limit, a read-only file system or a permission taken away, an I/O error). None for anything else, which stays a traceback: a
    bug should be seen whole. Whatever was recorded stays recorded (every write is a transaction or a file renamed
    into place), and running the command again resumes."""
    from flctl.fs import is_full

    again = "what was recorded is kept; run the command again once it is fixed (runs resume from their checkpoints)"
    # Optuna wraps what its storage's database raised (StorageInternalError from the driver's): told as that
    if type(exc).__module__.startswith("optuna") and type(exc).__name__ == "StorageInternalError" \
            and exc.__cause__ is not None:
        exc = exc.__cause__
    # OperationalError, InterfaceError: the server or its disk (an IntegrityError, a ProgrammingError is flctl's own
    # bug: a traceback); by name, so that SQLAlchemy is not imported to ask
    if type(exc).__module__.startswith("sqlalchemy") and hasattr(exc, "orig") and (
            any(c.__name__ in ("OperationalError", "InterfaceError") for c in type(exc).__mro__)
            or getattr(exc, "connection_invalidated", False)):
        from flctl.text import redact

        cause = (str(exc.orig).strip().splitlines() or [type(exc.orig).__name__])[0]
        return f"the run database failed under this command ({type(exc.orig).__name__}: {redact(cause)}); {again}"
    if isinstance(exc, OSError) and (is_full(exc) or exc.errno in (errno.EROFS, errno.EIO, errno.EACCES, errno.EPERM)):
        what = f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
        return f"cannot write ({what}); {again}" if is_full(exc) else f"{what}; {again}"
    return None


def _interrupted() -> None:
    """One line, and 128 + the signal's number (SIGHUP 129, SIGINT 130, SIGTERM 143), as `flctl run` and the workers
    exit."""
    signum = _signalled[-1] if _signalled else signal.SIGINT
    print(f"flctl: interrupted ({signum.name})", file=sys.stderr)
    sys.exit(128 + signum)


def _flags_take_no_value() -> None:
    """typer >= 0.25 shows each option's type in the help, a flag's as `<bool>`, which reads as if it took a value;
    a flag shows no type (typer has no setting for this; older typer has no such column)."""
    from typer.core import TyperOption

    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is not None:
        TyperOption.display_type_rich = (  # type: ignore[method-assign]
            lambda self, ctx: None if self.is_flag and not self.count else shown(self, ctx))


_flags_take_no_value()

app = typer.Typer(
    cls=_OneLineErrors,
    name="flctl",
    help="Feasible Learning experiment orchestrator: train ERM, CSERM, FL and RFL, keep every sample's loss "
    "and multiplier, and turn runs into the paper's tables and figures.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",   # not "rich": a help text's "[default: 60]" must print, not be read as markup
)


def _print_version(asked: bool) -> None:
    if asked:
        from flctl.versions import git_revision, library_versions

        commit = git_revision()
        print(f"flctl {library_versions()['flctl']}" + (f" (commit {commit[:12]})" if commit else ""))
        raise typer.Exit()


@app.callback()
def _options(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                   help="Print flctl's version and exit.")] = False) -> None:
    pass


# Every command by its help panel, each made a Command (its options' words checked by flctl.cli.parsing).
COMMANDS: dict[str, list[Callable[..., None]]] = {"Train": [run.run, sweep.sweep, ledger.cancel],
                                                   "Inspect": [ledger.status, ledger.sweeps, runs.runs, runs.show],
                                                   "Report": [report.report, paper.paper, export.export],
                                                   "Catalogue": [info.tasks, info.methods, new_task.new_task],
                                                   "Maintain": [runs.migrate, verify.verify, reproduce.reproduce]}
for _panel, _commands in COMMANDS.items():
    for _command in _commands:
        app.command(_command.__name__.replace("_", "-"), cls=Command, rich_help_panel=_panel)(_command)


# The signals that interrupted this command (flctl.shell.STOP_SIGNALS: SIGTERM and SIGHUP turned into an interruption
# like Ctrl-C's): every command then exits 128 + the signal's number, 129, 130 or 143, with one line (training commands
# stop at an epoch's end first, with handlers of their own: flctl.runner.stop_on_signals).
# Its own: a signal a training loop's handler took (flctl.shell.received) was told by that command, not here.
_signalled: list[signal.Signals] = []


def _interrupt(signum: int, _frame) -> None:
    _signalled.append(signal.Signals(signum))
    received.append(signal.Signals(signum))
    raise KeyboardInterrupt


def _thread_failed(args) -> None:
    """A library's background thread that raises (TensorBoard's event writer on a full disk) prints one warning
    line, not a traceback between the command's lines; what it failed is told by the command itself (a logger's
    end line)."""
    if args.exc_type is SystemExit:
        return
    first = (str(args.exc_value).strip().splitlines() or [""])[0][:200]
    name = args.thread.name if args.thread is not None else "?"
    print(f"flctl: warning: a background thread ({name}) stopped: {args.exc_type.__name__}: {first}",
          file=sys.stderr, flush=True)


def main() -> None:
    import threading

    from flctl.versions import torch_pair_problem

    threading.excepthook = _thread_failed

    for name in STOP_SIGNALS:
        # left alone when ignored: `flctl sweep ... &` from a script ignores SIGINT, `nohup flctl ...` SIGHUP
        if signal.getsignal(signum := signal.Signals[name]) is not signal.SIG_IGN:
            signal.signal(signum, _interrupt)
    tolerate_narrow_encodings()
    problem = torch_pair_problem()   # before any command imports torchvision: one line, not its 40-line traceback
    if problem is not None:
        print_error(problem)
        sys.exit(2)
    app()
