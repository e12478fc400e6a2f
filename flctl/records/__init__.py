"""What a run writes to disk, one module a job; no torch imported here (reports read records without it).

Per-sample records are one Parquet dataset under ``<results>/records``, one folder per run (hive layout). Each eval
epoch of a run is one file ``run_id=<id>/epoch=<e>.parquet`` holding both splits, written to a temporary name and
renamed into place, so readers never see half a file, and a resumed run that redoes an epoch replaces that epoch's
file instead of appending duplicate rows. Each file's SHA-256 and size go into the run's checksums,
``run_id=<id>/_checksums.json``, once the file is in place.

- ``reads``: the records' ``SCHEMA`` and every checked read of them (``read``, ``table``, ``check_run``);
- ``writes``: an epoch's file written, then its checksum (``write_epoch``);
- ``checks``: what a check rests on: the checksums file, and the facts of each record file;
- ``run_folder``: a run's other files under ``runs/<id>/`` (checkpoint, weights, extras; imports torch).

What callers read is re-exported here (``from flctl import records; records.read(...)``); a writer imports its
module (``flctl.records.writes``, ``flctl.records.run_folder``).
"""

from flctl.records.checks import CHECKSUMS as CHECKSUMS
from flctl.records.reads import EPOCH_GLOB as EPOCH_GLOB
from flctl.records.reads import FAILED as FAILED
from flctl.records.reads import OK as OK
from flctl.records.reads import RETRAIN_BY_ID as RETRAIN_BY_ID
from flctl.records.reads import SCHEMA as SCHEMA
from flctl.records.reads import UNVERIFIED as UNVERIFIED
from flctl.records.reads import RunCheck as RunCheck
from flctl.records.reads import check_run as check_run
from flctl.records.reads import epoch_summaries as epoch_summaries
from flctl.records.reads import files_after as files_after
from flctl.records.reads import fix as fix
from flctl.records.reads import read as read
from flctl.records.reads import read_file as read_file
from flctl.records.reads import refusal as refusal
from flctl.records.reads import run_files as run_files
from flctl.records.reads import table as table
