"""When a running run counts as lost: the stale bound and heartbeat period (FLCTL_STALE_AFTER, FLCTL_HEARTBEAT),
the database's clock that heartbeats are judged by, the test a worker's run fails when its worker is gone, and how
often a process waiting on others looks at the database (poll_delays)."""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from flctl.errors import StoreError
from flctl.procs import pid_alive


def check_stale_after(seconds: float, what: str = "the stale bound") -> float:
    """A bound on heartbeat age past which a running run is presumed lost. Zero or less would make every running
    run stale at once (two workers training one run), so it must be a positive number of seconds."""
    if not (isinstance(seconds, (int, float)) and seconds > 0):      # NaN is not > 0 either
        raise StoreError(f"{what} must be a positive number of seconds, got {seconds!r}")
    return float(seconds)


def _seconds_from_env(name: str, default: str, *, finite: bool) -> float:
    """A positive number of seconds from the environment, parsed once at import; NaN when it is anything else
    (``30s``, empty, ``-5``, ``0``; ``inf`` too where ``finite``), which Store.open refuses in one line
    (_check_environment)."""
    try:
        value = float(os.environ.get(name, default))
    except ValueError:
        return math.nan
    return value if value > 0 and (math.isfinite(value) or not finite) else math.nan


# A running run whose heartbeat is older than this is presumed lost (killed, node gone) and may be re-claimed.
# Infinity is a valid, if unwise, bound: never presumed lost.
STALE_AFTER_S = _seconds_from_env("FLCTL_STALE_AFTER", "300", finite=False)
# How often a running run's worker writes its heartbeat (at most; flctl.runner). Finite: Event.wait(inf) raises
# in the heartbeat thread, which then dies; zero makes it a busy loop (thousands of fsyncs per run).
HEARTBEAT_S = _seconds_from_env("FLCTL_HEARTBEAT", "30", finite=True)
# Below this a heartbeat is a busy loop of database writes.
MIN_HEARTBEAT_S = 0.05


def _check_environment() -> None:
    """The one-line refusal of a bad FLCTL_STALE_AFTER or FLCTL_HEARTBEAT, for every command that opens a
    database (all that can train or judge a run's liveness do)."""
    for name, value in (("FLCTL_STALE_AFTER", STALE_AFTER_S), ("FLCTL_HEARTBEAT", HEARTBEAT_S)):
        if math.isnan(value):
            raise StoreError(f"{name} must be a positive number of seconds (e.g. 30), got {os.environ.get(name)!r}")
    if HEARTBEAT_S < MIN_HEARTBEAT_S:
        raise StoreError(f"FLCTL_HEARTBEAT must be at least {MIN_HEARTBEAT_S:g} s, got {HEARTBEAT_S:g}")
    if HEARTBEAT_S >= STALE_AFTER_S:     # every running run would look lost between two of its heartbeats
        raise StoreError(f"FLCTL_HEARTBEAT ({HEARTBEAT_S:g} s) must be shorter than FLCTL_STALE_AFTER "
                         f"({STALE_AFTER_S:g} s)")


def db_now(s: Session) -> datetime:
    """The database's clock (UTC): heartbeats are written and judged by it, so workers on hosts whose clocks
    disagree do not see each other's runs as stale (or alive) too early. To the millisecond on SQLite, whose
    CURRENT_TIMESTAMP is truncated to the second: by it a beat at :00.1 read at :02.9 is 2 s old and one at :00.9
    read at :03.1 is 3 s old, an error of up to a second either way that a short stale bound (2 s) cannot carry."""
    now = (func.strftime("%Y-%m-%d %H:%M:%f", "now") if s.get_bind().dialect.name == "sqlite"
           else func.current_timestamp())
    stamp = s.execute(select(now)).scalar_one()
    if isinstance(stamp, str):             # SQLite: 'YYYY-MM-DD HH:MM:SS.SSS', UTC
        stamp = datetime.fromisoformat(stamp)
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)


def _is_stale(run: Any, stale_after: float, at: datetime) -> bool:
    """A running run's worker is gone: its heartbeat is older than ``stale_after`` at the database's time ``at``,
    or it ran here and its process has exited."""
    check_stale_after(stale_after)
    if run.host == socket.gethostname() and run.pid is not None and not pid_alive(run.pid):
        return True
    beat = run.heartbeat_at
    if beat is None:
        return True
    if beat.tzinfo is None:  # SQLite returns naive datetimes; we store UTC
        beat = beat.replace(tzinfo=UTC)
    return (at - beat).total_seconds() > stale_after


def poll_delays(most: float, first: float = 0.02) -> Iterator[float]:
    """The sleeps of a loop that waits on other processes through the database (a sweep's ledger, a --tune trial's
    outcome, a worker's next cell): ``first`` and then half as long again each time, up to ``most``. What is waited on
    is often done within a moment (a --tune trial of a few epochs, the next trial's cell); a flat ``most`` was then
    most of the wait, and a long wait still costs one look (a query) per ``most``."""
    delay = min(first, most)
    while True:
        yield delay
        delay = min(most, delay * 1.5)
