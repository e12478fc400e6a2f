"""What a check of a run's per-sample records rests on (flctl.records checks a run with these): the run's checksums
file, ``run_id=<id>/_checksums.json`` (its format, reading it, writing it), and the facts found of each record file
as it is, once per file: its SHA-256 and the runs its rows name.

A run's checksums name the run (``"run_id"``), and every row of a record file names its run (the ``run_id``
column): a folder holding another run's files, or its checksums (copied in by mistake), fails its check rather
than lending that run's numbers to this one. Checksums written before they named their run still verify.

A run's folder holds its epoch files and its checksums, nothing else: any other entry (``notes.txt``, ``x.parquet``,
a folder) is not the run's, and fails its check (``strays``), as it would fail a reader of the folder
(``pandas.read_parquet(records/run_id=<id>)``). A run whose files were written by a flctl that keeps checksums
(``kept_checksums``) and that has none lost them: damaged, not "unverified", which is for runs from before them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from flctl.fs import atomic_path

# A run's checksums, beside its epoch files. The leading underscore keeps it out of the dataset: pyarrow (and so
# pandas) skip such names when they read the folder, and duckdb and polars read `*.parquet`.
CHECKSUMS = "_checksums.json"
CHECKSUMS_FORMAT = 1
_SHA256 = re.compile(r"[0-9a-f]{64}")
# The file metadata key under which an epoch's file keeps that eval's summary metrics (JSON; flctl.records writes
# it, `flctl export` reads it back). flctl has written it into every record file since it kept checksums (the
# checksums came first, bec2f17, the summaries a day later, 35da69d): a file that carries it had checksums.
SUMMARY_KEY = b"flctl.summary"


def epoch_of(path: Path) -> int | None:
    """The epoch a record file's name says (``epoch=00005.parquet``: 5), None for another name."""
    _, sep, number = path.stem.partition("=")
    return int(number) if sep and path.stem.startswith("epoch=") and number.isdigit() else None


def load_checksums(folder: Path, run_id: str) -> dict[str, dict] | None:
    """The checksums of run ``run_id`` in ``folder`` ({file name: {"sha256", "bytes"}}), None when it has none;
    ValueError (one phrase) when the file is not checksums of flctl, or names another run (checksums written before
    they named their run name none, and are the folder's)."""
    path = folder / CHECKSUMS
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot be read ({exc})") from None
    try:
        body = json.loads(text)
    except ValueError:
        raise ValueError("is not JSON") from None
    files = body.get("files") if isinstance(body, dict) else None
    if not isinstance(body, dict) or body.get("format") != CHECKSUMS_FORMAT or body.get("algorithm") != "sha256" \
            or not isinstance(files, dict) or not isinstance(body.get("run_id", run_id), str):
        raise ValueError(f"is not checksums of flctl (format {CHECKSUMS_FORMAT}, sha256)")
    if (named := body.get("run_id", run_id)) != run_id:
        raise ValueError(f"names run {named!r}, not this folder's run {run_id}: another run's, copied here")
    for name, entry in files.items():
        size = entry.get("bytes") if isinstance(entry, dict) else None
        if not (isinstance(entry, dict) and isinstance(entry.get("sha256"), str) and _SHA256.fullmatch(entry["sha256"])
                and type(size) is int and size >= 0 and epoch_of(Path(name)) is not None and "/" not in name):
            raise ValueError(f"holds an entry that is not a record file's checksum ({name!r})")
    return files


def write_checksums(folder: Path, run_id: str, listed: dict[str, dict]) -> None:
    """Write run ``run_id``'s checksums ``listed`` into its ``folder``, whole or not at all."""
    body = {"format": CHECKSUMS_FORMAT, "algorithm": "sha256", "run_id": run_id, "files": dict(sorted(listed.items()))}
    with atomic_path(folder / CHECKSUMS, parents=False) as tmp:
        tmp.write_text(json.dumps(body, indent=1) + "\n")


def kept_checksums(path: Path) -> bool:
    """Whether record file ``path`` was written by a flctl that keeps checksums (its metadata keeps the summary,
    SUMMARY_KEY); False for an older file, or one that cannot be read (its schema check says so)."""
    try:
        found = facts(path)
        if found.get("summary") is None:
            found["summary"] = "yes" if SUMMARY_KEY in (pq.read_schema(path).metadata or {}) else "no"
    except (pa.ArrowException, OSError):
        return False
    return found["summary"] == "yes"


def strays(folder: Path, files: list[Path]) -> list[tuple[Path, str]]:
    """The entries of a run's records ``folder`` that are not the run's (anything but its epoch ``files``, its
    checksums and writes in flight), each with one line that names it and why it fails the run."""
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return []
    own = {p.name for p in files} | {CHECKSUMS}
    found = []
    for path in entries:
        # a hidden or underscored name is skipped by every reader of the folder (pyarrow, pandas): a file browser's
        # .DS_Store, an NFS .nfsXXXX of a replaced file still open, a write in flight; never the run's records
        if path.name in own or path.name[:1] in "._":
            continue
        what = "a folder" if path.is_dir() else "a file"
        found.append((path, f"{path} is {what} that is not the run's (flctl writes epoch=NNNNN.parquet files and "
                            f"{CHECKSUMS} there, nothing else); readers of the folder (pandas.read_parquet) would "
                            "read it as records"))
    return found


def mismatch(path: Path, entry: dict, read: bool) -> str | None:
    """How ``path`` differs from its recorded checksum ``entry``: its size, else (when ``read``) its SHA-256."""
    try:
        size = path.stat().st_size
    except OSError:
        return "it is gone"
    if size != entry["bytes"]:
        return f"{size:,} bytes, {entry['bytes']:,} recorded: truncated or overwritten"
    if read and (found := digest(path)) != entry["sha256"]:
        return f"SHA-256 {found[:12]}…, {entry['sha256'][:12]}… recorded"
    return None


def other_runs(path: Path, run_id: str) -> str | None:
    """What of ``path`` (a record file by its schema) is not run ``run_id``'s: rows of other runs, or rows that name
    none; None when every row is the run's. Reads the run_id column alone, once per file as it is."""
    try:
        found = facts(path)
        if found.get("runs") is None:
            found["runs"] = "\n".join(sorted(_run_ids(path)))
    except (pa.ArrowException, OSError):
        return None         # unreadable: its schema check, or its checksum, says so
    others = [r for r in (found["runs"] or "").split("\n") if r != run_id]
    if not others:
        return None
    named = [repr(r) if r else "no run" for r in others]
    shown = ", ".join(named[:3]) + (f" and {len(named) - 3} more" if len(named) > 3 else "")
    return (f"{path} holds rows of run{'s' if len(others) > 1 else ''} {shown}, not of run {run_id} (another run's "
            "records, copied here)")


def _run_ids(path: Path) -> set[str]:
    """The run ids the rows of ``path`` name ("" for a row that names none)."""
    found: set[str] = set()
    for chunk in pq.read_table(path, columns=["run_id"])["run_id"].chunks:
        values = pc.unique(chunk)
        if pa.types.is_dictionary(values.type):
            values = values.dictionary_decode()
        found |= {"" if v is None else v for v in values.to_pylist()}
    return found


# What this process found of a file as it is (path, size, times, inode): reports check a file and then read it, and
# a report that shows several figures checks each file once.
_FOUND: dict[tuple[str, int, int, int, int], dict[str, str | None]] = {}


def facts(path: Path) -> dict[str, str | None]:
    """What this process found of ``path`` as it is now, a dict to keep more in; OSError when it cannot be seen."""
    st = os.stat(path)
    key = (str(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    if key not in _FOUND and len(_FOUND) > 50_000:
        _FOUND.clear()
    return _FOUND.setdefault(key, {})


def digest(path: Path) -> str:
    """The SHA-256 of ``path`` as it is, read once."""
    found = facts(path)
    if found.get("sha256") is None:
        with open(path, "rb") as f:
            found["sha256"] = hashlib.file_digest(f, "sha256").hexdigest()
    value = found["sha256"]
    assert value is not None
    return value
