"""Read queries over the run database that only some commands ask (`flctl runs`, `flctl export`, reports): each
run's id, the sweeps that hold runs, and the runs a reference names (a run, or a sweep's). And the checked read of
whole runs that every reader goes through (``checked_runs``): a damaged row is named, never a traceback, and never
stops the others."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sqlalchemy import Select, Text, select, type_coerce
from sqlalchemy.orm import Session

from flctl.db.schema import Run, RunRecord, Sweep, SweepCell
from flctl.errors import DamagedRow

if TYPE_CHECKING:
    from flctl.db.store import Store

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
        if exc.damage not in _SAID:
            _SAID.add(exc.damage)
            print(f"flctl: warning: {exc.damage}, left out here; {exc.FIX}", file=sys.stderr, flush=True)


_SAID: set[str] = set()


def run_ids(store: Store) -> list[str]:
    """Every run's id (`flctl runs` shows each at its shortest unique prefix)."""
    with store.session() as s:
        return list(s.scalars(select(Run.id)).all())


def sweep_of(store: Store, run_id: str) -> str | None:
    """The latest sweep whose cells hold run ``run_id`` (None: a run of its own, `flctl run`)."""
    with store.session() as s:
        return s.scalars(select(Sweep.id).join(SweepCell, SweepCell.sweep_id == Sweep.id)
                         .where(SweepCell.run_id == run_id).order_by(Sweep.created_at.desc())).first()


def latest_sweeps(store: Store, run_ids: Iterable[str]) -> dict[str, tuple[str, str | None]]:
    """Each of ``run_ids`` that a sweep holds, with the latest such sweep's (id, name); a run of its own is not in
    it. In chunks: a query's parameters are bounded (SQLite's 32,766)."""
    ids, found = list(run_ids), {}
    with store.session() as s:
        for start in range(0, len(ids), 1000):
            rows = s.execute(select(SweepCell.run_id, Sweep.id, Sweep.name)
                             .join(Sweep, SweepCell.sweep_id == Sweep.id)
                             .where(SweepCell.run_id.in_(ids[start:start + 1000]))
                             .order_by(Sweep.created_at)).all()
            found.update({run_id: (sid, name) for run_id, sid, name in rows})     # the latest last: it stays
    return found


def run_or_sweep(store: Store, ref: str) -> tuple[RunRecord | None, dict[str, Any] | None]:
    """The run (id or unique prefix) or sweep (id, prefix or name) ``ref`` names: (run, None) or (None, sweep); a
    ConfigError where it names neither, both, or several."""
    from flctl.errors import ConfigError
    from flctl.text import shown

    run, refused = None, None
    try:
        run = store.get_run(ref)
    except ConfigError as exc:      # not an id prefix (a sweep's name), or one several runs share
        refused = exc
    sweep = store.get_sweep(ref)
    if run is not None and sweep is not None:
        raise ConfigError(f"{ref!r} names run {run.id} and sweep {sweep['id']}; give more of the id you mean")
    if run is not None or sweep is not None:
        return run, sweep
    if refused is not None and all(c in "0123456789abcdef" for c in ref.lower()):
        raise refused
    raise ConfigError(f"no run or sweep {shown(ref)} in the database; list them with `flctl runs` or `flctl sweeps`")


def runs_of(store: Store, ref: str) -> tuple[list[RunRecord], dict[str, str | None]]:
    """The runs ``ref`` names (a run, or a sweep's cells), with the sweep each belongs to (a run named alone: the
    latest sweep that holds it, None for a run of its own); ConfigError as run_or_sweep."""
    run, sweep = run_or_sweep(store, ref)
    if sweep is not None:
        cells = select(SweepCell.run_id).where(SweepCell.sweep_id == sweep["id"])
        with store.session() as s:       # the sweep's runs alone, newest first as list_runs lists them
            runs, damaged = checked_runs(s, select(Run).where(Run.id.in_(cells)).order_by(Run.created_at.desc()))
        left_out(damaged)
        return runs, {r.id: sweep["id"] for r in runs}
    assert run is not None
    return [run], {run.id: sweep_of(store, run.id)}
