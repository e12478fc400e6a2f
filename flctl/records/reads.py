"""The records' schema and every checked read of them (flctl.records is the package's overview).

Every read of record files goes through here, and is checked: a file of another schema (``SCHEMA``: names and
types) is refused in one line that names it, never cast into numbers; a report first checks each run it reads
against its checksums (``check_run``), and each file it reads against the run (every row's ``run_id``). A run
written before flctl kept checksums has none: it is unverified, not failed, and stays readable; a run whose files
were written with checksums and has none lost them, and fails.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from flctl.errors import ConfigError
from flctl.layout import Layout, records_of
from flctl.records.checks import CHECKSUMS as CHECKSUMS
from flctl.records.checks import SUMMARY_KEY as SUMMARY_KEY
from flctl.records.checks import (
    facts,
    kept_checksums,
    load_checksums,
    mismatch,
    other_runs,
    strays,
)
from flctl.status import Status

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

# Columns added after the first release: a file written before them lacks them, and they read as null.
LATER_COLUMNS = frozenset({"confidence", "pruned"})


EPOCH_GLOB = "epoch=*.parquet"


# ---- the schema of one file ----

def schema_problem(schema: pa.Schema) -> str | None:
    """What makes ``schema`` another than a record file's (SCHEMA: its column names and types), or None. run_id
    may be plain or dictionary-encoded strings (both were written); a later column (LATER_COLUMNS) may be absent."""
    names = schema.names
    missing = [f.name for f in SCHEMA if f.name not in names and f.name not in LATER_COLUMNS]
    if missing:
        lacks = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        return f"columns {', '.join(names[:6]) + (', …' if len(names) > 6 else '') or 'none'}; no {lacks}"
    unknown = [n for n in names if n not in SCHEMA.names]
    if unknown:
        return f"column{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} not among a record file's"
    if len(set(names)) != len(names):
        return "a column twice"
    for f in SCHEMA:
        if f.name not in names:
            continue
        kind = schema.field(f.name).type
        same = kind.equals(f.type) or (f.name == "run_id" and pa.types.is_dictionary(kind)
                                        and kind.value_type.equals(pa.string()))
        if not same:
            return f"column {f.name} holds {kind}, not {f.type}"
    return None


def file_problem(path: Path | str) -> str | None:
    """None when ``path`` is a record file by its schema, else one line naming it and what it is."""
    try:
        schema = pq.read_schema(path)
    except FileNotFoundError:
        return f"{path} is missing"
    except (pa.ArrowException, OSError) as exc:
        return f"{path} is not a Parquet file ({_first_line(exc)})"
    problem = schema_problem(schema)
    return None if problem is None else f"{path} is not a record file of flctl ({problem})"


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


# ---- a run checked against its checksums ----

# What a check finds of a run's records. A run whose records fail reads "failed", the word of a run's state that
# failed (flctl.status spells it).
OK, UNVERIFIED, FAILED = "ok", "unverified", Status.FAILED.value


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a run's records: ``text`` is one line naming the file. ``planted``: a file the run's
    checksums do not list (something else put it there: moving it out repairs the run); otherwise the run's own
    records are damaged or missing, and only training it again repairs them."""

    path: Path
    text: str
    planted: bool = False


@dataclass
class RunCheck:
    """A run's records checked: ``state`` is ok (every file listed, present and matching its checksum and the
    schema), unverified (no checksums: written before flctl kept them; the files read are still schema-checked)
    or failed (``problems``)."""

    run_id: str
    folder: Path
    checksummed: bool
    files: list[Path] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def state(self) -> str:
        return FAILED if self.problems else OK if self.checksummed else UNVERIFIED


def run_files(root: Path, run_id: str) -> list[Path]:
    """A run's epoch files, oldest first (the last is its final records)."""
    return sorted(records_of(root, run_id).glob(EPOCH_GLOB))


def check_run(root: Path, run_id: str, deep: Collection[str] | None = None, *, completed: bool = False) -> RunCheck:
    """Whether a run's records are sound: the one check `flctl verify` and every reader of records make. Its
    checksums are the run's (and present, where its files were written by a flctl that keeps them), every file they
    list is present with its size, none is unlisted, the folder holds nothing else, and each file named in ``deep``
    (file names; None: every file) has the records' schema, its recorded SHA-256 and rows of this run only. The cheap
    part (names, sizes) covers every file; the reads cover ``deep``, what a reader reads. ``completed``: the run
    finished, so it has records (a missing folder fails). Check only a run no worker is writing: an epoch file lands
    before its checksum (flctl.writes.write_epoch), so a run in progress may be between the two."""
    folder = records_of(root, run_id)
    files = run_files(root, run_id)
    check = RunCheck(run_id, folder, checksummed=False, files=files)
    if not folder.is_dir():
        if completed:
            what = "is a file, not a folder" if folder.exists() else "is missing"
            check.problems.append(Problem(folder, f"{folder} {what} (a completed run has records)"))
        return check
    try:
        listed = load_checksums(folder, run_id)
    except ValueError as exc:
        check.problems.append(Problem(folder / CHECKSUMS, f"{folder / CHECKSUMS} {exc}"))
        listed = {}
    check.checksummed = listed is not None
    if listed is None and files and kept_checksums(files[0]):
        # Its first file was written by a flctl that keeps checksums: they were lost (deleted, or the folder copied
        # without them), not never written. (A run resumed across that release keeps none: its first file is older.)
        check.checksummed = True
        check.problems.append(Problem(folder / CHECKSUMS, f"{folder / CHECKSUMS} is missing, though {files[0].name} "
                                      "was written by a flctl that keeps checksums (deleted, or the folder copied "
                                      "without it)"))
    elif completed and not files and listed is None:
        check.problems.append(Problem(folder, f"{folder} holds no record files (a completed run has records)"))
    present = {p.name for p in files}
    for name in sorted(set(listed or ()) - present):
        check.problems.append(Problem(folder / name, f"{folder / name} is missing (its checksum is recorded)"))
    for path in files:
        read = deep is None or path.name in deep
        # "<path> is not a record file of flctl (...)", else "<path> holds rows of run ..."
        wrong = (_cached_problem(path) or other_runs(path, run_id)) if read else None
        entry = None if listed is None else listed.get(path.name)
        if listed is not None and entry is None:            # not the run's: what it is, when it was read
            check.problems.append(Problem(path, wrong or f"{path} is not among the run's checksums (flctl did not "
                                                         "write it there)", planted=True))
            continue
        differs = None if entry is None else mismatch(path, entry, read)
        if wrong is not None or differs is not None:
            text = f"{wrong}, and does not match its checksum ({differs})" if wrong and differs else \
                wrong or f"{path} does not match its checksum ({differs})"
            check.problems.append(Problem(path, text))
    check.problems += [Problem(path, text, planted=True) for path, text in strays(folder, files)]
    return check


def _cached_problem(path: Path) -> str | None:
    try:
        found = facts(path)
    except OSError:
        return file_problem(path)
    if "problem" not in found:
        found["problem"] = file_problem(path)
    return found["problem"]


# ---- reading ----

def read(root: Path, run_ids: Sequence[str] | None = None, split: str | None = None,
         epoch: int | None = None) -> pa.Table:
    """Records of the given runs (all when None), optionally one split and one epoch. Each run is checked first
    (``check_run``: its checksums, and the schema of each file): ConfigError naming the first problem."""
    root = Path(root)
    if (inner := Layout(root).records).is_dir() and not any(root.glob("run_id=*")):   # a results folder, as every
        raise ConfigError(f"{root} is a results folder, not a records folder: its records are under {inner}")  # command takes
    if run_ids is None:
        run_ids = sorted(p.name.split("=", 1)[1] for p in root.glob("run_id=*") if p.is_dir())
    files: list[Path] = []
    for run_id in run_ids:
        check = check_run(root, run_id)
        if check.problems:
            raise ConfigError(refusal(check, f"train it again: {RETRAIN_BY_ID.format(run_id=run_id)}"))
        files += check.files
    if not files:
        return SCHEMA.empty_table()
    # Here, not at the top: pyarrow.dataset imports pandas, and a run that only writes records need not.
    import pyarrow.dataset as ds

    flt = None
    for col, val in (("split", split), ("epoch", epoch)):
        if val is not None:
            cond = ds.field(col) == val
            flt = cond if flt is None else flt & cond
    return table([str(p) for p in files], filter=flt)


# How to train a run again, when only its id is at hand (flctl.report.data.retrain_command spells out the command
# from its configuration).
RETRAIN_BY_ID = "`flctl run` with its options and --rerun (`flctl show {run_id}` lists them)"


def refusal(check: RunCheck, retrain: str) -> str:
    """One line: the run whose records failed, its first problem, the fix (``retrain``: how to train it again,
    for damaged or missing records; a planted file is moved out instead) and `flctl verify RUN`, which says it all."""
    first = check.problems[0]
    more = len(check.problems) - 1
    return (f"run {check.run_id}: its records fail their check: {first.text}; {fix(check, retrain)}; "
            + (f"{more} more problem{'s' if more > 1 else ''}: `flctl verify {check.run_id}` lists them" if more
               else f"`flctl verify {check.run_id}` checks it again"))


def fix(check: RunCheck, retrain: str) -> str:
    """What repairs the first problem of a failed run: moving a planted file out, else training it again
    (``retrain``); for a run without checksums, whose files cannot say whether they are its own, either."""
    if check.problems[0].planted:
        return "move it out of the records folder"
    return retrain if check.checksummed or not check.files else f"move it out of the records folder if it is not the run's, else {retrain}"


def table(source: Sequence[str], columns: Sequence[str] | None = None, filter=None) -> pa.Table:
    """Record files read as one table, only ``columns`` and rows passing ``filter``. Each file's schema is checked
    first: a file that is not a record file of ours (not Parquet, another schema: planted, copied in by mistake, a
    column of other types) is ConfigError naming it, never read with its values cast."""
    import pyarrow.dataset as ds

    paths = [str(p) for p in source]
    for path in paths:
        problem = _cached_problem(Path(path))
        if problem is not None:
            raise ConfigError(f"{problem}; move it out of the records folder")
    try:
        data = ds.dataset(paths, format="parquet", schema=SCHEMA, partitioning=None)
        return data.to_table(columns=list(columns) if columns else None, filter=filter)
    except (pa.ArrowException, OSError) as exc:
        raise ConfigError(f"per-sample records cannot be read: {_first_line(exc)}") from None


def read_file(path: Path | str, columns: Sequence[str] | None = None, filter=None) -> pa.Table:
    """One record file (``table`` of one)."""
    return table([str(path)], columns, filter)


def _epoch_of(path: Path) -> int:
    return int(path.stem.split("=")[1])


def files_after(root: Path, run_id: str, epoch: int) -> list[Path]:
    """A run's record files of epochs after ``epoch`` (what a run that restarts at ``epoch`` will redo)."""
    return [p for p in sorted(records_of(root, run_id).glob(EPOCH_GLOB)) if _epoch_of(p) > epoch]


def epoch_summaries(root: Path, run_id: str) -> list[tuple[int, dict[str, float], Path]]:
    """(epoch, summary metrics, its file) of each of the run's eval epochs whose file keeps them
    (flctl.writes.write_epoch), by epoch: the numbers a logger was given as the run trained. Files from before
    flctl kept them are left out."""
    found = []
    for path in sorted(records_of(Path(root), run_id).glob(EPOCH_GLOB)):
        try:
            meta = pq.read_schema(path).metadata or {}
            epoch = int(path.stem.split("=", 1)[1])
        except (OSError, ValueError, pa.ArrowException):
            continue
        if SUMMARY_KEY in meta:
            found.append((epoch, json.loads(meta[SUMMARY_KEY]), path))
    return found
