"""The checked read of whole runs that every reader goes through (``checked_runs``): a damaged row (a JSON column
that is not JSON, or JSON of another shape) is named, never a traceback, and never stops the others. Below both the
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


def checked_runs(s: Session, q: Select) -> tuple[list[RunRecord], list[DamagedRow]]:
    """The runs ``q`` (a select of Run) reads, as RunRecords, and apart from them each damaged row it met (a JSON
    column that is not JSON, or JSON of another shape) as a DamagedRow naming the run and the column."""
    try:
        rows, damaged = list(s.scalars(q).all()), []
    except json.JSONDecodeError:        # one row's text stops the whole fetch: find it, read the others
        damaged = not_json(s, q)
        rows = list(s.scalars(q.where(Run.id.not_in([d.run_id for d in damaged]))).all())
    records = []
    for row in rows:
        try:
            records.append(row.record())
        except DamagedRow as exc:
            damaged.append(exc)
    return records, damaged


def not_json(s: Session, q: Select) -> list[DamagedRow]:
    """The rows ``q`` (a select from the runs table) reads whose JSON columns do not parse: read as text, one
    DamagedRow per row (its first such column)."""
    raw = [type_coerce(getattr(Run, c), Text) for c in JSON_COLUMNS]
    found = []
    for run_id, *texts in s.execute(q.with_only_columns(Run.id, *raw)):
        for column, text in zip(JSON_COLUMNS, texts):
            try:
                if isinstance(text, str):
                    json.loads(text)
            except ValueError:
                found.append(DamagedRow(run_id, column, "not JSON"))
                break
    return found


def left_out(damaged: Iterable[DamagedRow]) -> None:
    """Say each damaged row a listing left out: one ``flctl: warning:`` line on stderr per row, once per process."""
    for exc in damaged:
        say_once(f"flctl: warning: {exc.damage}, left out here; {exc.FIX}")
