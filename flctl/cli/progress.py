"""What a command shows while a run trains, for `flctl run` and `flctl reproduce` alike (``epoch_progress``): on a
terminal a progress bar over epochs (``EpochBar``); in a log, timestamped lines (``EpochLines``, through
``LogLines``, which `flctl status --watch` off a terminal also uses), since a log shows a bar only at its end. On a
terminal, what is redrawn in place (`status --watch`'s ledger, `sweep --wait`'s line: ``SweepLine``) is drawn by
``drawn``, the one drawer."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from flctl.cli.common import console
from flctl.status import TERMINAL, Status

# What a progress hands training for each epoch (flctl.train's EpochStats).
OnEpoch = Callable[[Any], None]
# The most times a second a terminal's live display is redrawn: enough for a clock's seconds, and few enough that
# a slow terminal (ssh, tmux) keeps up.
REDRAWS_PER_S = 4
# `sweep --wait`'s line asks the database for the sweep's counts at most this often, and waits ten times as long as
# the last ask took (a 100,000-cell sweep's counts take about 0.1 s: never more than a tenth of a core on them).
ASK_EVERY_S = 1.0


@contextlib.contextmanager
def drawn(first: Any = None, *, get: Callable[[], Any] | None = None) -> Iterator[Callable[[Any], None]]:
    """On a terminal: ``first`` (a rich renderable) drawn in place, redrawn as what the yielded function is handed,
    or ``get()`` at each redraw (REDRAWS_PER_S a second); what else the command prints goes above it. Whatever ends
    the block (its work done, a signal's exit, an exception) leaves the last frame whole, the cursor shown on the
    line below it; on a terminal that hung up, the writes are dropped (flctl.shell.Tolerant), never raised."""
    from rich.live import Live

    with Live(first, console=console, refresh_per_second=REDRAWS_PER_S, get_renderable=get) as live:
        yield live.update


class LogLines:
    """Timestamped plain lines for a log (stdout not a terminal): one when ``say`` is asked to (an evaluation, a
    change), and at least every LOG_EVERY_S seconds while ``tick`` is called, so that a job's log never looks hung."""

    def __init__(self, every_s: float | None = None, clock=None) -> None:
        import time

        from flctl.knobs import LOG_EVERY_S

        self.every_s = LOG_EVERY_S if every_s is None else every_s
        self.clock = clock or time.monotonic
        self.last = -float("inf")

    def say(self, text: str) -> None:
        import time

        console.print(f"{time.strftime('%H:%M:%S')} {text}", highlight=False, soft_wrap=True)
        self.last = self.clock()

    def tick(self, text: str, *, now: bool = False) -> None:
        """``text`` as a line if ``now`` or if the last line is LOG_EVERY_S old."""
        if now or self.clock() - self.last >= self.every_s:
            self.say(text)

    @contextlib.contextmanager
    def beating(self, state: Callable[[], str]) -> Iterator[None]:
        """Keep the lines coming from a thread while the work inside runs (an epoch may take minutes): ``state()``
        is the line printed when no other was for LOG_EVERY_S."""
        import threading

        done = threading.Event()

        def beat() -> None:
            while not done.wait(min(1.0, self.every_s)):
                if self.clock() - self.last >= self.every_s:    # state() may query a database: only when due
                    self.tick(state())

        thread = threading.Thread(target=beat, daemon=True, name="log-lines")
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()


class EpochLines:
    """Without a terminal: a timestamped line when training starts, at each evaluation, and at least every
    LOG_EVERY_S seconds (LogLines), instead of a progress bar that a log shows only at the end."""

    def __init__(self, run_id: str, title: str) -> None:
        self.run_id, self.title, self.lines = run_id, title, LogLines()
        self.latest = "starting (data, model)"

    def state(self) -> str:
        return f"run {self.run_id} ({self.title}): {self.latest}"

    def __enter__(self) -> OnEpoch:
        self.beating = self.lines.beating(self.state)
        self.beating.__enter__()
        self.lines.say(self.state())

        def on_epoch(stats) -> None:
            lam = "" if stats.max_multiplier is None else f" · max λ {stats.max_multiplier:.3g}"
            self.latest = (f"epoch {stats.epoch}/{stats.epochs} · batch loss avg {stats.train_avg_loss:.4f} max "
                           f"{stats.train_max_loss:.4f}{lam}")
            if stats.metrics:
                test = {k: v for k, v in stats.metrics.items() if k in ("test.avg_loss", "test.accuracy")}
                self.latest += "".join(f" · {k} {v:.4g}" for k, v in test.items())
            self.lines.tick(self.state(), now=stats.metrics is not None)
        return on_epoch

    def __exit__(self, *exc) -> None:
        self.beating.__exit__(*exc)


class EpochBar:
    """A rich progress bar over epochs showing the latest avg/max loss and max λ."""

    def __init__(self, epochs: int, title: str) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), console=console,
                                 transient=False)
        self.task = self.progress.add_task(title, total=epochs, stats="")

    def __enter__(self) -> OnEpoch:
        self.progress.start()

        def on_epoch(stats) -> None:
            lam = "" if stats.max_multiplier is None else f" max λ {stats.max_multiplier:.3g}"
            self.progress.update(self.task, completed=stats.epoch, total=stats.epochs,   # a solver: 1 of 1
                                 # the losses of the epoch's batches as they trained, not the summary's
                                 # evaluation of the final model (its max is another number)
                                 stats=f"batch loss avg {stats.train_avg_loss:.4f} max {stats.train_max_loss:.4f}{lam}")
        return on_epoch

    def __exit__(self, *exc) -> None:
        self.progress.stop()


def epoch_progress(run_id: str, epochs: int, title: str) -> EpochBar | EpochLines:
    """What shows a run's epochs as it trains, entered around the training (``with ... as on_epoch``): a bar on a
    terminal, else lines for a log."""
    return EpochBar(epochs, title) if console.is_terminal else EpochLines(run_id, title)


class SweepLine:
    """`sweep --wait`'s line on a terminal while this process trains cells (``sweep_line``): the sweep's cells done of
    all, running, failed, the time left and the time waited, e.g. ``sweep 3f2a: 12/25 done · 2 running · 1 failed ·
    about 40 s left · 1:23``. The counts are the database's (``ask``: flctl.status.ledger, grouped counts, no row
    read); the line is drawn from the last ones read, so that its clock moves while a slow database answers.

    The time left: once cells have ended in this wait, the pace they ended at (the cells left x the seconds waited per
    cell ended); before, ``per_cell_s`` (the estimate's wall seconds a cell adds; ``pricing`` while it is asked for)
    x the cells left when the wait began, less the time waited."""

    def __init__(self, url: str, sid: str, clock: Callable[[], float] | None = None) -> None:
        import time

        self.url, self.sid = url, sid
        self.per_cell_s: float | None = None
        self.pricing = False
        self.clock = clock or time.monotonic
        self.started = self.clock()
        self.data: dict[str, Any] | None = None
        self.first: tuple[int, int] | None = None    # (cells ended, cells left) when the wait began
        self.why: str | None = None                  # why the database cannot be read now
        self.reader: Any = None

    def ask(self) -> None:
        """Read the sweep's counts (opening the database at the first ask, and again after one failed)."""
        from flctl.results import peek
        from flctl.status import ledger

        try:
            self.reader = self.reader or peek(self.url)
            if self.reader is None:
                self.why = "it is not there"
                return
            data = ledger(self.reader, self.sid)
        except Exception as exc:       # gone, locked, a server down: the worker in this process says what it met
            self.why = type(exc).__name__
            self.close()
            return
        self.first = self.first or (_ended(data), _left(data))      # before the data: a redraw reads both
        self.why, self.data = None, data

    def close(self) -> None:
        reader, self.reader = self.reader, None
        if reader is not None:
            with contextlib.suppress(Exception):
                reader.close()

    def text(self) -> str:
        waited = self.clock() - self.started
        clock = f"{int(waited) // 60}:{int(waited) % 60:02d}"
        if self.data is None:
            return f"sweep {self.sid}: the database cannot be read now ({self.why}) · {clock}"
        total = self.data["total"]
        parts = [f"{total[Status.COMPLETED]}/{self.data['cells']} done", f"{total[Status.RUNNING]} running"]
        parts += [f"{total[k]} {k}" for k in ("stale", Status.FAILED, Status.DIVERGED) if total[k]]
        parts += [self.left(waited)] if _left(self.data) else []
        parts += [f"the database cannot be read now ({self.why})"] if self.why else []
        return f"sweep {self.sid}: {' · '.join(parts)} · {clock}"

    def left(self, waited: float) -> str:
        if self.data is None or self.first is None:
            return ""
        left, ended = _left(self.data), _ended(self.data) - self.first[0]
        if ended > 0:
            return f"about {_span(waited * left / ended)} left"
        if self.pricing:
            return "time left: estimating"
        if self.per_cell_s is None:
            return "time left: known when a cell ends"
        planned = self.per_cell_s * self.first[1]
        return f"about {_span(planned - waited)} left" if waited < planned else f"past the estimate of {_span(planned)}"

    def render(self) -> Any:
        from rich.text import Text

        return Text(self.text(), no_wrap=True, overflow="ellipsis")    # one line, however narrow the terminal


def _ended(data: dict[str, Any]) -> int:
    return sum(data["total"][k] for k in TERMINAL)


def _left(data: dict[str, Any]) -> int:
    return max(0, data["cells"] - _ended(data) - data["total"]["missing"])


def _span(s: float) -> str:
    """Seconds of a person's wait: ``45 s``, ``12 min``, ``2 h 05 min``."""
    s = max(1, round(s))
    return f"{s} s" if s < 90 else f"{round(s / 60)} min" if s < 5400 else f"{s // 3600} h {s % 3600 // 60:02d} min"


@contextlib.contextmanager
def sweep_line(url: str, sid: str, per_cell_s: Callable[[], float | None] | None = None) -> Iterator[None]:
    """``SweepLine`` drawn on a terminal while the work inside runs, its counts read by a thread of its own (at most
    every ASK_EVERY_S, and ten times as long as the last read took); the estimate, ``per_cell_s()``, by another (it
    reads the task's finished runs: neither the work nor the end waits for it). Read once more at the end, so that
    the frame left is the sweep as the work left it."""
    import threading

    line = SweepLine(url, sid)
    line.ask()
    done = threading.Event()

    def price(estimate: Callable[[], float | None]) -> None:
        line.per_cell_s, line.pricing = estimate(), False

    if per_cell_s is not None:
        line.pricing = True
        threading.Thread(target=price, args=(per_cell_s,), daemon=True, name="sweep-line-estimate").start()

    def poll() -> None:
        took = 0.0
        while not done.wait(max(ASK_EVERY_S, 10 * took)):
            began = line.clock()
            line.ask()
            took = line.clock() - began

    thread = threading.Thread(target=poll, daemon=True, name="sweep-line")
    try:
        with drawn(get=line.render):
            thread.start()
            try:
                yield
            finally:
                done.set()
                thread.join(timeout=5.0)     # a read that hangs (a server gone) is left to end on its own
                if not thread.is_alive():
                    line.ask()
    finally:
        if not thread.is_alive():
            line.close()
