"""Train a recorded run again and compare its records, value by value: ``reproduce(store, results_root, ref)``.

A reviewer's check that a paper's runs are what their records say: the run is trained again in a scratch folder from
its recorded configuration, with the torch threads it recorded (a thread count changes the rounding) and, for a cell
of a grouped sweep, with the cells it was grouped with in the rows they had (its trained_with names them; a grouped
kernel's rounding depends on the group: docs/reference.md, "What is bit-identical"). Then every record file of the two is
compared bit for bit; the first difference is found by epoch, split and sample id. Nothing under the results folder
is written, and the database is only read. No typer here: flctl/cli/reproduce.py prints what this returns.
"""

from __future__ import annotations

import math
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flctl.errors import ConfigError
from flctl.status import Status
from flctl.text import say_once
from flctl.versions import CHANGES_NUMBERS

if TYPE_CHECKING:
    import pyarrow as pa

    from flctl.config import RunConfig
    from flctl.db import RunRecord, Store

# The versions compared: flctl's own (its code computes the numbers) and the libraries whose version alone can move
# them (flctl.versions.CHANGES_NUMBERS). Not flctl's commit, which moves with every change to the checkout, most of
# which touch no number, nor the libraries that compute none (pyarrow writes the records; a dev install moves it).
COMPARED = ("flctl", *CHANGES_NUMBERS)
# The columns that say where a value is: a difference in them is one of layout, not of a value.
WHERE = ("epoch", "split", "sample_id")


@dataclass(frozen=True)
class Difference:
    """The first value that differs (by epoch, split, sample id, then column), or a file one side lacks."""
    epoch: int
    split: str | None = None
    sample_id: int | None = None
    column: str | None = None
    recorded: Any = None
    now: Any = None
    missing: str | None = None      # "recorded" or "now": the side whose file of this epoch is missing

    @property
    def size(self) -> float:
        """|recorded - now|; inf where one is null or not a number."""
        try:
            return abs(float(self.recorded) - float(self.now))
        except (TypeError, ValueError):
            return math.inf

    def line(self, run_id: str) -> str:
        if self.missing is not None:
            return f"run {run_id}: epoch {self.epoch}'s record file is missing {self.missing}"
        if self.column is None:
            return f"run {run_id}: epoch {self.epoch}'s records hold other samples (their ids or splits differ)"
        return (f"run {run_id}: first difference at epoch {self.epoch}, split {self.split}, sample_id "
                f"{self.sample_id}, column {self.column}: |difference| {self.size:.3g} (recorded {self.recorded!r}, "
                f"now {self.now!r})")


@dataclass(frozen=True)
class Reproduction:
    """What ``reproduce`` found."""
    run_id: str
    files: int                                  # record files compared
    difference: Difference | None               # None: every record file bit-identical
    threads: int | None                         # torch threads it trained with again (None: not a CPU run)
    group: list[str] = field(default_factory=list)    # the cells trained with it, itself included, in order
    group_wanted: int = 1                       # cells its record says it trained with
    versions: dict[str, tuple[Any, Any]] = field(default_factory=dict)   # COMPARED's that differ: (recorded, here)

    @property
    def identical(self) -> bool:
        return self.difference is None


def version_changes(recorded: Any, here: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The recorded versions of COMPARED that differ here, name -> (recorded, here); {} when none was recorded.
    Names are compared as pip compares them (``NumPy`` is numpy, ``scikit_learn`` scikit-learn). A record that is not
    a table of versions (a damaged row) is said once and compared as none."""
    if recorded is not None and not isinstance(recorded, dict):
        say_once(f"flctl: warning: the run's recorded library versions are unreadable ({type(recorded).__name__}, "
                 "not a table): they are not compared")
        return {}
    ours = {_canonical(k): (k, v) for k, v in here.items()}
    found = {}
    for name, was in (recorded or {}).items():
        key = _canonical(str(name))
        now = ours.get(key, (None, None))[1]
        if key in COMPARED and now != was:
            found[key] = (was, now)
    return found


def _canonical(name: str) -> str:
    """A distribution's name as pip compares it (PEP 503): lower case, runs of -_. as one -."""
    return re.sub(r"[-_.]+", "-", name).lower()


def versions_line(changes: dict[str, tuple[Any, Any]]) -> str:
    """One warning line naming each differing version."""
    said = ", ".join(f"{k} {now} (recorded {was})" for k, (was, now) in sorted(changes.items()))
    return f"this machine's versions differ from the run's: {said}; its records may differ for that alone"


def group_of(store: Store, run: RunRecord) -> list[RunRecord]:
    """The cells ``run`` trained with as one grouped model, itself included, in the grouped model's row order: the
    run ids its trained_with records (``cells``, flctl.stepper.Stepper.trained_with); for a run trained before
    flctl recorded them, ``inferred_group``. Just ``[run]`` for a run that trained alone or stepped in turn (equal
    alone). ConfigError where a recorded cell is no longer in the database, or the record is not such a group."""
    made = run.trained_with or {}
    if made.get("engine") != "grouped" or int(made.get("cells_together") or 1) < 2:
        return [run]
    ids = made.get("cells")
    if not isinstance(ids, list):
        return inferred_group(store, run)
    if run.id not in ids or not all(isinstance(cell, str) and len(cell) == len(run.id) for cell in ids) \
            or len(set(ids)) != len(ids):     # a group that does not hold the run, or not run ids: a damaged row
        raise ConfigError(f"run {run.id}'s record of the cells it trained with is damaged (trained_with's 'cells' is "
                          "not the run ids of a group that holds it); restore that row from a backup to reproduce it")
    group = [run if cell == run.id else store.get_run(cell) for cell in ids]
    missing = [cell for cell, r in zip(ids, group) if r is None]
    if missing:
        raise ConfigError(f"run {run.id} trained as one model with run {missing[0]}, which is not in the database: "
                          f"its rounding cannot be trained again without it")
    return [r for r in group if r is not None]


def inferred_group(store: Store, run: RunRecord) -> list[RunRecord]:
    """The group of a grouped ``run`` that recorded no ids (trained before flctl recorded them): the runs of its task that
    the same worker process (host and pid) trained grouped in groups of the same size and that could train with it,
    by claim time (a worker claims a group's cells one after the other, in id order), cut into groups of that
    size."""
    size = int((run.trained_with or {}).get("cells_together") or 1)
    key = run.cfg.together_key()
    same = [r for r in store.list_runs(task=run.task)
            if (r.host, r.pid) == (run.host, run.pid) and (r.trained_with or {}).get("engine") == "grouped"
            and (r.trained_with or {}).get("cells_together") == size and r.cfg.together_key() == key]
    same.sort(key=lambda r: (r.started_at or "", r.id))
    at = next(i for i, r in enumerate(same) if r.id == run.id)
    start = at - at % size
    return same[start:start + size]


def compare(recorded_root: Path, now_root: Path, run_id: str) -> tuple[int, Difference | None]:
    """(record files compared, the first difference or None). Each side's files are checked first (checksums,
    schema: flctl.records.read); values are compared by their bits, so NaN equals NaN and -0.0 differs from 0.0."""
    from flctl import records
    from flctl.layout import records_of

    def epochs(root: Path) -> dict[int, Path]:
        return {int(p.stem.split("=")[1]): p for p in records_of(root, run_id).glob(records.EPOCH_GLOB)}

    mine, theirs = epochs(recorded_root), epochs(now_root)
    for epoch in sorted(mine.keys() | theirs.keys()):
        if epoch not in theirs or epoch not in mine:
            return len(mine), Difference(epoch, missing="now" if epoch not in theirs else "recorded")
    a, b = (_sorted(records.read(root, [run_id])) for root in (recorded_root, now_root))
    return len(mine), first_difference(a, b)


def _sorted(table: pa.Table) -> pa.Table:
    return table.sort_by([(c, "ascending") for c in WHERE])


def first_difference(a: pa.Table, b: pa.Table) -> Difference | None:
    """The first row (tables sorted by epoch, split, sample id) at which a value's bits differ, and its first such
    column; None when every value is the same. Tables of other rows differ at the first row whose place differs."""
    import numpy as np

    if len(a) != len(b) or any(not a[c].equals(b[c]) for c in WHERE):
        rows = min(len(a), len(b))
        at = next((i for i in range(rows) if any(a[c][i] != b[c][i] for c in WHERE)), rows)
        side = a if at < len(a) else b
        return Difference(int(side["epoch"][min(at, len(side) - 1)].as_py()))
    first: tuple[int, str] | None = None
    for column in (c for c in a.column_names if c not in WHERE and c != "run_id"):
        x, y = a[column], b[column]
        differs = np.asarray(x.is_null()) != np.asarray(y.is_null())
        # a null is NaN in a float column, None in others: the same on both sides, and told apart by the masks
        vx, vy = (np.asarray(t.to_numpy(zero_copy_only=False)) for t in (x, y))
        if vx.dtype.kind == "f" and vx.dtype == vy.dtype:      # by bits: NaN is NaN, and -0.0 is not 0.0
            vx, vy = vx.view(f"u{vx.itemsize}"), vy.view(f"u{vy.itemsize}")
        differs |= vx != vy
        hits = np.flatnonzero(differs)
        if hits.size and (first is None or hits[0] < first[0]):
            first = int(hits[0]), column
    if first is None:
        return None
    row, column = first
    return Difference(int(a["epoch"][row].as_py()), a["split"][row].as_py(), int(a["sample_id"][row].as_py()), column,
                      a[column][row].as_py(), b[column][row].as_py())


def check_reproducible(run: RunRecord) -> None:
    """ConfigError (bad input, exit 2) for a run that cannot be trained again here to compare: one not completed,
    or one trained on CUDA where none is."""
    if run.status != Status.COMPLETED:
        raise ConfigError(f"run {run.id} is {run.status}, not completed: only a completed run's records can be "
                          f"reproduced (`flctl run` or `flctl sweep` finishes it)")
    if str(run.cfg.device).startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"run {run.id} was trained on {run.cfg.device}; this machine has no CUDA device")


class NotCompared(RuntimeError):
    """The run trained again, but its records could not be compared after all (a recorded file damaged or removed
    while it trained, or the scratch copy unreadable): found only after the work, so not bad input (exit 1)."""


@dataclass(frozen=True)
class Plan:
    """What a reproduction trains, every input checked (``prepare``): the run, the cells it trains with (itself
    included, in order) and their configurations, and the torch threads it recorded (None: this process's)."""
    run: RunRecord
    group: list[RunRecord]
    cfgs: list[RunConfig]
    threads: int | None


def prepare(store: Store, records_root: Path, ref: str) -> Plan:
    """Everything a reproduction of run ``ref`` (an id or unique prefix) needs, checked before any training, so
    that a refusal costs nothing: ConfigError for an unknown run, one not completed or trained on a device this
    machine lacks, one whose recorded records under ``records_root`` are missing or fail their checksums."""
    from flctl import records
    from flctl.layout import records_of

    run = store.get_run(ref)
    if run is None:
        raise ConfigError(f"no run {ref!r} in the database; list them with `flctl runs`")
    check_reproducible(run)
    if not records_of(records_root, run.id).is_dir():
        raise ConfigError(f"run {run.id} has no records under {records_root} to compare with (`flctl verify "
                          f"{run.id}` names the command that trains it again)")
    problems = records.check_run(records_root, run.id).problems
    if problems:
        raise ConfigError(f"run {run.id}'s recorded records fail their check ({problems[0].text}); `flctl verify "
                          f"{run.id}` lists what is wrong")
    group = group_of(store, run)
    threads = (run.trained_with or {}).get("threads")
    return Plan(run, group, [r.cfg for r in group], threads if isinstance(threads, int) else None)


def train_and_compare(plan: Plan, records_root: Path,
                      on_epoch: Callable[[Any], None] | None = None) -> Reproduction:
    """Train ``plan``'s cells again in a scratch folder, deleted after, and compare the run's records with those
    under ``records_root``. NotCompared where the records cannot be read once trained. ``on_epoch`` hears the run's
    own epochs (flctl.train.EpochStats)."""
    from flctl.layout import Layout
    from flctl.train import train_together
    from flctl.versions import library_versions

    run, cfgs = plan.run, plan.cfgs

    def own(stats) -> None:
        if on_epoch is not None and stats.run_id == run.id:
            on_epoch(stats)

    with tempfile.TemporaryDirectory(prefix="flctl-reproduce-") as scratch:
        again = Layout(Path(scratch))
        train_together(cfgs, again.records, [again.run_dir(c.run_id) for c in cfgs], own,
                       checkpoint_every=math.inf, threads=plan.threads)
        try:
            files, difference = compare(records_root, again.records, run.id)
        except ConfigError as exc:      # checked before training: what failed since is not the user's input
            raise NotCompared(f"{exc} (found after training it again: nothing was compared)") from None
    made = run.trained_with or {}
    return Reproduction(run.id, files, difference, plan.threads, [r.id for r in plan.group],
                        int(made.get("cells_together") or 1) if made.get("engine") == "grouped" else 1,
                        version_changes((run.provenance or {}).get("libraries"), library_versions()))


def reproduce(store: Store, records_root: Path, ref: str,
              on_epoch: Callable[[Any], None] | None = None) -> Reproduction:
    """Train run ``ref`` (an id or unique prefix) again in a scratch folder and compare its records with those under
    ``records_root``: ``prepare`` (its ConfigError, before any training), then ``train_and_compare``."""
    return train_and_compare(prepare(store, records_root, ref), records_root, on_epoch)
