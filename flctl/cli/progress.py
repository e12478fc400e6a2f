"""What a command shows while a run trains, for `flctl run` and `flctl reproduce` alike (``epoch_progress``): on a
terminal a progress bar over epochs (``EpochBar``); in a log, timestamped lines (``EpochLines``, through
``LogLines``, which `flctl status --watch` off a terminal also uses), since a log shows a bar only at its end."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from flctl.cli.common import console

# What a progress hands training for each epoch (flctl.train's EpochStats).
OnEpoch = Callable[[Any], None]


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
