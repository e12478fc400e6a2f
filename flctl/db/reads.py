"""Read queries over the run database that only some commands ask (`flctl runs`, `flctl export`, reports): each
run's id, the sweeps that hold runs, and the runs a reference names (a run, or a sweep's), each through the checked
read of whole runs (flctl.db.checked)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from flctl.db.checked import checked_runs, left_out
from flctl.db.schema import Run, RunRecord, Sweep, SweepCell

if TYPE_CHECKING:
    from flctl.db.store import Store



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


def runs_of(store: Store, ref: str) -> tuple[list[RunRecord], str | None]:
    """The runs ``ref`` names (a run, or a sweep's cells), with the sweep they belong to (a run named alone: the
    latest sweep that holds it, None for a run of its own); ConfigError as run_or_sweep."""
    run, sweep = run_or_sweep(store, ref)
    if sweep is not None:
        cells = select(SweepCell.run_id).where(SweepCell.sweep_id == sweep["id"])
        with store.session() as s:       # the sweep's runs alone, newest first as list_runs lists them
            runs, damaged = checked_runs(s, select(Run).where(Run.id.in_(cells)).order_by(Run.created_at.desc()))
        left_out(damaged)
        return runs, sweep["id"]
    assert run is not None
    return [run], sweep_of(store, run.id)
