"""Writing an epoch's per-sample records (flctl.records.reads reads them, and holds their SCHEMA): an eval epoch's rows of one split
as a table (``split_table``), and the epoch's file, written atomically with the epoch's summary metrics in its
metadata, then its checksum into the run's checksums (``write_epoch``; flctl.records.checks keeps their format).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flctl.fs import atomic_path, make_below
from flctl.layout import records_of
from flctl.records.checks import SUMMARY_KEY, epoch_of, load_checksums, write_checksums
from flctl.records.reads import EPOCH_GLOB, SCHEMA

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
            "split": pa.repeat(pa.scalar(split, pa.string()), n),   # (a list of n strings took 90 % of this)
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


# An epoch file keeps that eval's summary metrics in its metadata under SUMMARY_KEY (flctl.records.checks): what a
# logger was told live, read back by `flctl export` (epoch_summaries).


def write_epoch(root: Path, run_id: str, epoch: int, tables: Sequence[pa.Table],
                summary: dict[str, float] | None = None) -> Path:
    """Atomically write one eval epoch's records (all splits) for a run, with its ``summary`` metrics in the file's
    metadata, then its checksum into the run's checksums (atomically too); returns the file path.

    The checksums drop the epochs after this one (a run that redoes an epoch has removed its later files). A run
    whose folder already holds files of earlier epochs but no checksums (it began before flctl kept them, and
    resumed) gets none: one unlisted file would fail the check, so it stays unverified as a whole."""
    folder = records_of(root, run_id)
    make_below(folder, 2)              # records/run_id=<id>, never the results folder above
    final = folder / f"epoch={epoch:05d}.parquet"
    sink = pa.BufferOutputStream()
    table = pa.concat_tables(tables)
    if summary is not None:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                               SUMMARY_KEY: json.dumps(summary, allow_nan=True).encode()})
    pq.write_table(table, sink)
    data = sink.getvalue()
    listed = _checksums_to_extend(folder, run_id, epoch)
    with atomic_path(final, parents=False) as tmp:
        with open(tmp, "wb") as f:
            f.write(memoryview(data))
    if listed is not None:
        listed[final.name] = {"sha256": hashlib.sha256(memoryview(data)).hexdigest(), "bytes": data.size}
        write_checksums(folder, run_id, listed)
    return final


def _checksums_to_extend(folder: Path, run_id: str, epoch: int) -> dict[str, dict] | None:
    """The entries of the run's checksums that stay when ``epoch`` is written (those of earlier epochs); None when
    the run keeps none (files of earlier epochs without checksums)."""
    try:
        listed = load_checksums(folder, run_id)
    except ValueError:
        listed = {}     # damaged, or another run's: start again; the files it vouched for now fail the check
    if listed is None:
        earlier = [p for p in folder.glob(EPOCH_GLOB) if (e := epoch_of(p)) is not None and e < epoch]
        return None if earlier else {}
    return {name: entry for name, entry in listed.items() if (e := epoch_of(Path(name))) is not None and e < epoch}
