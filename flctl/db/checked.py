"""The checked read of whole runs that every reader goes through (``checked_runs``): a damaged row (a JSON column
that is not JSON, or JSON of another shape; a time that is not one) is named, never a traceback, and never stops the others. Below both the
store and the readers (flctl.db.store, flctl.db.reads), which each use it."""

from __future__ import annotations

import json
from collections.abc import Iterable

from sqlalchemy import Select, Text, type_coerce
from sqlalchemy.orm import Session

from flctl.db.schema import Run, RunRecord
from flctl.errors import DamagedRow
from flctl.text import say_once

# The runs table's JSON columns: SQLite keeps them as text, which another tool or a damaged file may leave unparsable
# (PostgreSQL's json type refuses such text; JSON of another shape is Run.record's check).
JSON_COLUMNS = ("config", "metrics", "diverged_at", "trained_with", "provenance")
# Its times: SQLite keeps them as text too ("yesterday" stops a whole fetch in SQLAlchemy's DateTime parser).
TIME_COLUMNS = ("created_at", "started_at", "finished_at", "heartbeat_at")


def checked_runs(s: Session, q: Select) -> tuple[list[RunRecord], list[DamagedRow]]:
    """The runs ``q`` (a select of Run) reads, as RunRecords, and apart from them each damaged row it met (a JSON
    column that is not JSON, or JSON of another shape) as a DamagedRow naming the run and the column."""
    try:
        rows, damaged = list(s.scalars(q).all()), []
    except ValueError:        # one row's text (JSON, a time) stops the whole fetch: find it, read the others
        damaged = unreadable(s, q)
        rows = list(s.scalars(q.where(Run.id.not_in([d.run_id for d in damaged]))).all())
    records = []
    for row in rows:
        try:
            records.append(row.record())
        except DamagedRow as exc:
            damaged.append(exc)
    return records, damaged


def unreadable(s: Session, q: Select) -> list[DamagedRow]:
    """The rows ``q`` (a select from the runs table) reads whose JSON columns do not parse, or whose times are not
    times: read as text, one DamagedRow per row (its first such column)."""
    from datetime import datetime

    checks = [(c, json.loads, "not JSON") for c in JSON_COLUMNS] + \
        [(c, datetime.fromisoformat, "not a time") for c in TIME_COLUMNS]
    raw = [type_coerce(getattr(Run, c), Text) for c, _, _ in checks]
    found = []
    for run_id, *texts in s.execute(q.with_only_columns(Run.id, *raw)):
        for (column, parse, what), text in zip(checks, texts):
            try:
                if isinstance(text, str):
                    parse(text)
            except ValueError:
                found.append(DamagedRow(run_id, column, what))
                break
    return found


def left_out(damaged: Iterable[DamagedRow]) -> None:
    """Say each damaged row a listing left out: one ``flctl: warning:`` line on stderr per row, once per process."""
    for exc in damaged:
        say_once(f"flctl: warning: {exc.damage}, left out here; {exc.FIX}")
