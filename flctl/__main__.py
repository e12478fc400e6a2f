"""`flctl` (the console script) and `python -m flctl`. Its standard streams are made safe first (flctl.shell: a
closed or full stdout, a pipe whose reader has gone, is never a traceback). A signal that arrives while the command
line is still being imported (typer, rich and flctl's command modules: about 0.3 s) ends the command as one that
arrives later does (in flctl.cli.main): one line and 128 + its number, not a KeyboardInterrupt traceback out of an
import (Ctrl-C) or a silent death (SIGTERM, SIGHUP). flctl.cli.main then puts its own handlers in place."""

import signal
import sys

from flctl.shell import STOP_SIGNALS, ending, install


def _early(signum: int, _frame) -> None:
    print(f"flctl: interrupted ({signal.Signals(signum).name})", file=sys.stderr)   # flctl.cli._interrupted's line
    sys.exit(128 + signum)


def main() -> None:
    from flctl.procs import end_without_collecting

    install()
    end_without_collecting()       # first: its atexit handler runs last
    for name in STOP_SIGNALS:
        # left alone when ignored: `flctl sweep ... &` from a script ignores SIGINT, `nohup flctl ...` SIGHUP
        if signal.getsignal(signum := signal.Signals[name]) is not signal.SIG_IGN:
            signal.signal(signum, _early)
    from flctl.cli import main as cli_main

    try:
        cli_main()
    except SystemExit as exc:
        if exc.code is not None and not isinstance(exc.code, int):     # sys.exit("message"): as Python ends it
            raise
        sys.exit(ending(exc.code or 0))
    sys.exit(ending(0))


if __name__ == "__main__":
    main()
