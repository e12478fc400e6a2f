"""`flctl verify` is the gate for every reader of records: each damage a user can do to a run's records folder fails
verify, and every reader (reports, `flctl export`, flctl.api.records) refuses the run in one line that names it and
`flctl verify RUN`, exit 2, with the results folder exactly as it was. A deleted checksums file is damage, not
"unverified" (which is for runs from before checksums, tests/test_records_integrity.py), and a file in a run's folder
that is not the run's fails it, as it would fail `pandas.read_parquet(records/run_id=<id>)`."""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from flctl import records
from flctl.errors import ConfigError
from flctl.layout import records_of
from tests.helpers import in_process


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ERM and an FL run of two-moons, 2 evaluated epochs each, made once for the module."""
    root = tmp_path_factory.mktemp("gate") / "results"
    for method in ("erm", "fl"):
        res = in_process("run", "two-moons", "--method", method, "--epochs", "2", "--eval-every", "1",
                         "--results-dir", str(root))
        assert res.returncode == 0, res.stdout + res.stderr
    with sqlite3.connect(root / "flctl.db") as conn:     # every commit in the database file: a copy is whole
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return root


@pytest.fixture
def world(prepared: Path, results: Path) -> dict[str, str]:
    """A private copy of the prepared runs as this test's results folder (FLCTL_RESULTS), and their ids."""
    shutil.copytree(prepared, results, ignore=shutil.ignore_patterns("flctl.db-wal", "flctl.db-shm"))
    ids = {}
    for method in ("erm", "fl"):
        (row,) = json.loads(in_process("runs", "--method", method, "--json").stdout)
        ids[method] = row["id"]
    return ids


def snapshot(root: Path) -> dict[str, str]:
    """Every file and folder under ``root`` with a hash of its bytes (folders: 'dir')."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*")) if p.name not in ("flctl.db-wal", "flctl.db-shm")}


def final(root: Path, run_id: str) -> Path:
    return records.run_files(root / "records", run_id)[-1]


# Each damage done to the FL run's records folder; returns the path a refusal names.
def delete_checksums(root: Path, ids: dict[str, str]) -> Path:
    path = records_of(root / "records", ids["fl"]) / records.CHECKSUMS
    path.unlink()
    return path


def stray_text(root: Path, ids: dict[str, str]) -> Path:
    path = records_of(root / "records", ids["fl"]) / "notes.txt"
    path.write_text("the learning rate looked too high\n")
    return path


def stray_parquet(root: Path, ids: dict[str, str]) -> Path:
    """A copy of the run's own final file under another name: pandas reads the folder with every row twice."""
    path = records_of(root / "records", ids["fl"]) / "x.parquet"
    shutil.copy(final(root, ids["fl"]), path)
    return path


def truncate(root: Path, ids: dict[str, str]) -> Path:
    path = final(root, ids["fl"])
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def other_runs_file(root: Path, ids: dict[str, str]) -> Path:
    """The ERM run's final file copied over the FL run's, same name."""
    path, theirs = final(root, ids["fl"]), final(root, ids["erm"])
    assert path.name == theirs.name and path.stat().st_size != theirs.stat().st_size
    shutil.copy(theirs, path)
    return path


DAMAGES: dict[str, Callable[[Path, dict[str, str]], Path]] = {
    "checksums deleted": delete_checksums, "notes.txt": stray_text, "x.parquet": stray_parquet,
    "truncated": truncate, "another run's file": other_runs_file}
# What each damage's line says of the file it names.
SAID = {"checksums deleted": "is missing, though epoch=00001.parquet was written by a flctl that keeps checksums",
        "notes.txt": "is a file that is not the run's", "x.parquet": "is a file that is not the run's",
        "truncated": "does not match its checksum", "another run's file": "does not match its checksum"}
READERS = (("report", "--table", "main"), ("report", "--plot", "cdf"), ("export", "FL", "--to", "tensorboard"))


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_each_damage_fails_verify_and_every_reader_refuses_it_writing_nothing(world, results: Path,
                                                                              damage: str) -> None:
    assert in_process("verify").returncode == 0
    path = DAMAGES[damage](results, world)
    before = snapshot(results)

    res = in_process("verify", "--json")
    assert res.returncode == 1, res.stdout + res.stderr
    rows = {r["run"]: r for r in json.loads(res.stdout)["runs"]}
    assert rows[world["erm"]]["records"] == "ok" and rows[world["fl"]]["records"] == "failed", rows
    problems = rows[world["fl"]]["problems"]
    assert problems[0]["path"] == str(path) and SAID[damage] in problems[0]["problem"], problems
    text = in_process("verify", world["fl"])
    assert text.returncode == 1 and text.stdout.strip().splitlines()[-1] == "1 run: 1 failed", text.stdout

    for command in READERS:
        res = in_process(*(world["fl"] if word == "FL" else word for word in command))
        assert res.returncode == 2, (command, res.stdout + res.stderr)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (command, res.stderr)
        assert f"run {world['fl']}" in lines[0] and str(path) in lines[0], (command, lines[0])
        assert f"`flctl verify {world['fl']}`" in lines[0], (command, lines[0])
    from flctl import api

    with pytest.raises(ConfigError) as raised:
        api.records([world["fl"]], results_dir=results)
    said = str(raised.value)
    assert "\n" not in said and str(path) in said and f"`flctl verify {world['fl']}`" in said, said
    assert snapshot(results) == before


def test_the_other_run_stays_readable_by_every_reader(world, results: Path) -> None:
    """The gate refuses the damaged run only: the sound one beside it is read, exported and shown."""
    stray_text(results, world)
    for command in (("verify", world["erm"]), ("export", world["erm"], "--to", "tensorboard")):
        res = in_process(*command)
        assert res.returncode == 0, (command, res.stdout + res.stderr)
    from flctl import api

    assert api.records([world["erm"]], results_dir=results, epoch=2).num_rows > 0


def test_a_stray_file_fails_a_run_from_before_checksums_too(world, results: Path) -> None:
    """Without checksums (a run from before them: unverified, read as it is), a file that is not the run's still
    fails it: it is not a question of checksums but of what a reader of the folder reads."""
    from tests.test_records_integrity import before_checksums

    folder = records_of(results / "records", world["fl"])
    before_checksums(folder)
    assert json.loads(in_process("verify", world["fl"], "--json").stdout)["summary"]["unverified"] == 1
    (folder / "notes.txt").write_text("x\n")
    out = json.loads(in_process("verify", world["fl"], "--json").stdout)
    assert out["summary"]["failed"] == 1 and out["runs"][0]["fix"] == "move it out of the records folder", out


def test_a_write_in_flight_is_no_stray_and_a_running_run_is_not_checked(world, results: Path) -> None:
    """flctl's own temporary names (a write in flight, hidden: every reader skips them) are not strays; a run a
    worker holds is between an epoch file and its checksum (write_epoch's order), so verify leaves it unchecked."""
    folder = records_of(results / "records", world["fl"])
    (folder / f".epoch=00003.parquet.{'ab' * 16}.tmp").write_bytes(b"half")
    assert in_process("verify", world["fl"]).returncode == 0
    assert in_process("report", "--plot", "cdf").returncode == 0
    # The first epoch file in place, its checksums not yet: what a reader sees between write_epoch's two steps.
    delete_checksums(results, world)
    for path in records.run_files(results / "records", world["fl"])[1:]:
        path.unlink()
    with sqlite3.connect(results / "flctl.db") as con:
        con.execute("UPDATE runs SET status = 'running' WHERE id = ?", (world["fl"],))
    con.close()
    out = json.loads(in_process("verify", "--json").stdout)
    assert out["summary"] == {"ok": 1, "unverified": 0, "failed": 0, "in progress": 1}, out
