"""`flctl` (the console script) and `python -m flctl`. A signal that arrives while the command line is still being
imported (typer, rich and flctl's command modules: about 0.3 s) ends the command as one that arrives later does (in
flctl.cli.main): one line and 128 + its number, not a KeyboardInterrupt traceback out of an import (Ctrl-C) or a
silent death (SIGTERM). flctl.cli.main then puts its own handlers in place."""

import signal
import sys


def _early(signum: int, _frame) -> None:
    print(f"flctl: interrupted ({signal.Signals(signum).name})", file=sys.stderr)   # flctl.cli._interrupted's line
    sys.exit(128 + signum)


def main() -> None:
    from flctl.procs import end_without_collecting

    end_without_collecting()       # first: its atexit handler runs last
    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) is not signal.SIG_IGN:     # `flctl sweep ... &` from a script ignores SIGINT
            signal.signal(signum, _early)
    from flctl.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
