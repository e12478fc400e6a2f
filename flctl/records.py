"""Per-sample records: one Parquet dataset under ``<results>/records``, one folder per run (hive layout).

Each eval epoch of a run is one file ``run_id=<id>/epoch=<e>.parquet`` holding both splits. A file is written
to a temporary name and renamed into place, so readers never see half a file, and a resumed run that redoes
an epoch replaces that epoch's file instead of appending duplicate rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flctl.errors import ConfigError
from flctl.fs import atomic_path
from flctl.layout import records_of

SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("split", pa.string()),          # "train" | "test"
        ("epoch", pa.int32()),           # epochs completed when evaluated
        ("sample_id", pa.int64()),       # position in the task's split; train ids index the multipliers
        ("loss", pa.float64()),
        ("multiplier", pa.float64()),    # train rows of FL/RFL; null otherwise
        ("prediction", pa.float64()),    # predicted class (classification) or value (regression)
        ("target", pa.float64()),
        ("correct", pa.bool_()),         # classification only; null for regression
        ("confidence", pa.float64()),    # classification: the max softmax probability; null otherwise
        ("pruned", pa.bool_()),          # train rows of runs with --prune-after: left out of this epoch; else null
    ]
)


# As written: run_id dictionary-encoded, the type pyarrow gives the hive partition folder ``run_id=<id>``, so that
# readers that merge the folder name with the column (pandas.read_parquet, pyarrow.parquet.read_table) agree
# with the files. flctl reads with SCHEMA (plain strings), which also reads files written before this change.
FILE_SCHEMA = SCHEMA.set(0, pa.field("run_id", pa.dictionary(pa.int32(), pa.string())))


def split_table(
    run_id: str,
    split: str,
    epoch: int,
    loss: np.ndarray,
    prediction: np.ndarray,
    target: np.ndarray,
    correct: np.ndarray | None = None,
    multiplier: np.ndarray | None = None,
    pruned: np.ndarray | None = None,
    confidence: np.ndarray | None = None,
) -> pa.Table:
    n = len(loss)
    return pa.table(
        {
            "run_id": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)), pa.array([run_id])),
            "split": pa.array([split] * n, pa.string()),
            "epoch": pa.array(np.full(n, epoch, dtype=np.int32)),
            "sample_id": pa.array(np.arange(n, dtype=np.int64)),
            "loss": pa.array(np.asarray(loss, dtype=np.float64)),
            "multiplier": pa.array(np.asarray(multiplier, dtype=np.float64))
            if multiplier is not None
            else pa.nulls(n, pa.float64()),
            "prediction": pa.array(np.asarray(prediction, dtype=np.float64)),
            "target": pa.array(np.asarray(target, dtype=np.float64)),
            "correct": pa.array(np.asarray(correct, dtype=bool)) if correct is not None else pa.nulls(n, pa.bool_()),
            "confidence": pa.array(np.asarray(confidence, dtype=np.float64)) if confidence is not None
            else pa.nulls(n, pa.float64()),
            "pruned": pa.array(np.asarray(pruned, dtype=bool)) if pruned is not None else pa.nulls(n, pa.bool_()),
        },
        schema=FILE_SCHEMA,
    )


def write_epoch(root: Path, run_id: str, epoch: int, tables: Sequence[pa.Table]) -> Path:
    """Atomically write one eval epoch's records (all splits) for a run; returns the file path."""
    folder = records_of(root, run_id)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"epoch={epoch:05d}.parquet"
    with atomic_path(final) as tmp:
        pq.write_table(pa.concat_tables(tables), tmp)
    return final


def read(root: Path, run_ids: Sequence[str] | None = None, split: str | None = None,
         epoch: int | None = None) -> pa.Table:
    """Records of the given runs (all when None), optionally one split and one epoch."""
    root = Path(root)
    files = None
    if run_ids is not None:
        files = [str(p) for r in run_ids for p in sorted(records_of(root, r).glob("epoch=*.parquet"))]
        if not files:
            return SCHEMA.empty_table()
    # Here, not at the top: pyarrow.dataset imports pandas, and a run that only writes records need not.
    import pyarrow.dataset as ds

    flt = None
    for col, val in (("split", split), ("epoch", epoch)):
        if val is not None:
            cond = ds.field(col) == val
            flt = cond if flt is None else flt & cond
    return table(files if files is not None else root, filter=flt)


def table(source: Sequence[str] | Path, columns: Sequence[str] | None = None, filter=None) -> pa.Table:
    """Record files (a list, or every one under a folder) read as one table, only ``columns`` and rows passing
    ``filter``. A file there that is not a record file of ours (not Parquet, another schema: planted, or copied in
    by mistake) is ConfigError naming it, not an Arrow traceback."""
    import pyarrow.dataset as ds

    try:
        data = ds.dataset(source if isinstance(source, Path) else list(source), format="parquet", schema=SCHEMA,
                          partitioning=None)
        return data.to_table(columns=list(columns) if columns else None, filter=filter)
    except (pa.ArrowException, OSError) as exc:
        raise ConfigError(unreadable(source, exc)) from None


def unreadable(source: Sequence[str] | Path, exc: BaseException) -> str:
    """One line naming the first record file of ``source`` that does not hold records."""
    paths = sorted(str(p) for p in source.rglob("*.parquet")) if isinstance(source, Path) else list(source)
    for path in paths:
        try:
            schema = pq.read_schema(path)
        except (pa.ArrowException, OSError) as err:
            return f"{path} is not a Parquet file ({str(err).splitlines()[0]}); move it out of the records folder"
        if any(f.name not in schema.names or not schema.field(f.name).type.equals(f.type)
               for f in SCHEMA if f.name != "run_id"):     # run_id: plain string or dictionary, both ours
            return (f"{path} is not a record file of flctl (columns {', '.join(schema.names)}); "
                    "move it out of the records folder")
    return f"per-sample records cannot be read: {str(exc).splitlines()[0]}"


def _epoch_of(path: Path) -> int:
    return int(path.stem.split("=")[1])


def final_epoch(root: Path, run_id: str) -> int | None:
    files = sorted(records_of(root, run_id).glob("epoch=*.parquet"))
    return _epoch_of(files[-1]) if files else None


def files_after(root: Path, run_id: str, epoch: int) -> list[Path]:
    """A run's record files of epochs after ``epoch`` (what a run that restarts at ``epoch`` will redo)."""
    return [p for p in sorted(records_of(root, run_id).glob("epoch=*.parquet")) if _epoch_of(p) > epoch]
