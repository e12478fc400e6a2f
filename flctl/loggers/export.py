"""`flctl export`: finished runs logged after the fact, from the database and the records, as they were logged live:
each evaluated epoch's summary metrics as the run's file keeps them (flctl.records.epoch_summaries) and its
multipliers from the records. A run is keyed by its id in every tool: exporting again replaces, never adds."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flctl.loggers.base import scalars
from flctl.loggers.session import Logging


def export(runs: Sequence[Any], root: Path, loggers: Sequence[str], sweep_id: str | None) -> Logging:
    """Log ``runs`` (store records, finished) to ``loggers``, their records under ``root``; ``sweep_id``: their sweep
    (flctl.db.reads.runs_of names one run or one sweep's runs). The caller has checked every run as `flctl verify` does (flctl.report.data.gate, each file read whole, as
    `flctl export` does), so that nothing is logged of a damaged run. Returns the session, whose ``lines()`` say what
    could not be logged."""
    import pyarrow.dataset as ds

    from flctl.layout import Layout
    from flctl.records import epoch_summaries, read_file

    records_root = Layout(root).records
    session = Logging(loggers, root, sweep_id, replay=True)
    for run in runs:
        session.start(run.cfg)
        kept = epoch_summaries(records_root, run.id)
        for epoch, summary, path in kept:
            # Through the records' reader (its schema check), the train split's multipliers; None where none.
            lam = read_file(path, ["multiplier"], filter=ds.field("split") == "train")["multiplier"]
            multipliers = None if lam.null_count == len(lam) else lam.to_numpy(zero_copy_only=False)
            session.log(run.id, epoch, scalars({}, summary, multipliers), multipliers)
        if not kept and run.metrics:       # trained before the files kept each eval's numbers: its final ones
            session.log(run.id, run.epochs_done or 0, {k: float(v) for k, v in run.metrics.items() if v is not None})
        session.finish(run.id, run.status)
    return session

