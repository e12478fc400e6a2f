"""Records that cannot lie (issue 45, part 3): every reader of record files checks each file's schema, each run's
records carry checksums written as they are committed, `flctl verify` checks them, and reports refuse a run whose
records fail, in one line that names the run, the file and how to train it again. A run from before checksums is
unverified, not failed, and stays readable."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flctl import records
from flctl.errors import ConfigError
from flctl.layout import records_of
from flctl.records import writes
from tests.helpers import in_process

# The reports the issue found reading a wrong file (the first three printed numbers, cdf refused it).
REPORTS = (("report", "--samples", "violators"), ("report", "--samples", "diff", "--methods", "erm,fl"),
           ("report", "--plot", "multipliers"), ("report", "--plot", "cdf"))


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ERM and an FL run of two-moons, 3 epochs each (3 record files per run), made once for the module."""
    root = tmp_path_factory.mktemp("integrity") / "results"
    for method in ("erm", "fl"):
        res = in_process("run", "two-moons", "--method", method, "--epochs", "3", "--eval-every", "1",
                         "--results-dir", str(root))
        assert res.returncode == 0, res.stdout + res.stderr
    return root


@pytest.fixture
def world(prepared: Path, results: Path) -> dict[str, str | Path]:
    """A private copy of the prepared runs as this test's results folder (FLCTL_RESULTS): its ids and the FL run's
    final record file, the one every report above reads."""
    shutil.copytree(prepared, results)
    ids = {}
    for method in ("erm", "fl"):
        res = in_process("runs", "--method", method, "--json")
        assert res.returncode == 0, res.stderr
        (row,) = json.loads(res.stdout)
        ids[method] = row["id"]
    return {**ids, "final": sorted(records_of(results / "records", ids["fl"]).glob("epoch=*.parquet"))[-1]}


def before_checksums(folder: Path) -> None:
    """Make a run's records ``folder`` as flctl wrote it before checksums: no _checksums.json, and files that keep no
    summary in their metadata (flctl.records.checks.SUMMARY_KEY came after checksums: a file with it had them)."""
    (folder / records.CHECKSUMS).unlink(missing_ok=True)
    for path in folder.glob("epoch=*.parquet"):
        pq.write_table(pq.read_table(path).replace_schema_metadata(None), path)


def refused(res, path: Path, run_id: str, results: Path) -> str:
    """``res`` is the one `error:` line of a refusal naming ``path`` and ``run_id``; nothing was written."""
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert str(path) in lines[0] and f"run {run_id}" in lines[0], lines[0]
    assert not (results / "reports").exists()
    return lines[0]


def test_a_foreign_parquet_file_in_place_of_an_epoch_file_is_refused_by_every_report(world, results: Path) -> None:
    final = world["final"]
    pq.write_table(pa.table({"sample_id": pa.array(np.arange(1000)), "value": pa.array(np.ones(1000))}), final)
    for command in REPORTS:
        line = refused(in_process(*command), final, world["fl"], results)
        assert "is not a record file of flctl" in line and "--rerun" in line, line


@pytest.mark.parametrize("checksums", [True, False], ids=["checksummed", "unverified"])
def test_a_loss_column_of_strings_is_refused_by_every_report(world, results: Path, checksums: bool) -> None:
    """Strings that read as numbers ('0.25'): a cast would give numbers, so only the schema check refuses them; the
    same without checksums (a run from before them), where the schema is all there is to check."""
    final = world["final"]
    table = pq.read_table(final)
    table = table.set_column(table.schema.get_field_index("loss"), "loss", table["loss"].cast(pa.string()))
    pq.write_table(table, final)
    if not checksums:       # as a run from before checksums: its folder holds its epoch files only
        before_checksums(final.parent)
    for command in REPORTS:
        line = refused(in_process(*command), final, world["fl"], results)
        assert "column loss holds string, not double" in line, line


@pytest.mark.parametrize("damage", ["flipped byte", "truncated"])
def test_a_damaged_file_fails_verify_and_reports_refuse_its_run_until_it_is_trained_again(world, results: Path,
                                                                                          damage: str) -> None:
    final = world["final"]
    data = bytearray(final.read_bytes())
    if damage == "flipped byte":
        data[len(data) // 2] ^= 0x01         # same size: only the checksum tells
    else:
        del data[len(data) // 2:]
    final.write_bytes(bytes(data))

    res = in_process("verify")
    assert res.returncode == 1, res.stdout + res.stderr
    assert str(final) in res.stdout and "1 failed" in res.stdout.strip().splitlines()[-1], res.stdout
    rows = {r["run"]: r for r in json.loads(in_process("verify", "--json").stdout)["runs"]}
    assert rows[world["erm"]]["records"] == "ok" and rows[world["fl"]]["records"] == "failed"
    (problem,) = rows[world["fl"]]["problems"]
    assert problem["path"] == str(final) and "does not match its checksum" in problem["problem"], problem

    lines = {command: refused(in_process(*command), final, world["fl"], results)
             for command in (*REPORTS, ("report", "--table", "main", "--columns", "test.cvar@0.9"))}
    assert all("does not match its checksum" in line for line in lines.values()), lines
    # The fix a report's line names trains the same run again (the table checks its runs as records of the database
    # before it reads any file, so its line spells the command too); then it verifies and reports read it. Each
    # line names `flctl verify RUN`.
    command = lines[REPORTS[0]].split("train it again: `", 1)[1].split("`", 1)[0]
    assert command == "flctl run two-moons --method fl --epochs 3 --eval-every 1 --rerun", lines
    assert f"`{command}`" in lines[("report", "--table", "main", "--columns", "test.cvar@0.9")]
    assert all(f"`flctl verify {world['fl']}`" in line for line in lines.values()), lines
    assert in_process(*shlex.split(command)[1:]).returncode == 0
    assert in_process("verify", world["fl"]).returncode == 0
    assert in_process("report", "--samples", "violators").returncode == 0


def test_verify_says_ok_failed_and_why_for_runs_and_sweeps_with_its_exit_codes(world, results: Path) -> None:
    res = in_process("verify")
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip().splitlines()[-1] == "2 runs: 2 ok; nothing failed"
    out = json.loads(in_process("verify", "--json").stdout)
    assert out["summary"] == {"ok": 2, "unverified": 0, "failed": 0, "in progress": 0}
    assert {r["run"]: (r["records"], r["files"]) for r in out["runs"]} == {world["erm"]: ("ok", 3),
                                                                            world["fl"]: ("ok", 3)}
    # A sweep of the FL run's configuration has that run as its one cell (completed already: nothing trains).
    assert in_process("sweep", "two-moons", "-m", "fl", "--epochs", "3", "--eval-every", "1", "--executor", "debug",
                      "--name", "again").returncode == 0
    for ref in ("again", world["fl"][:8]):
        out = json.loads(in_process("verify", ref, "--json").stdout)
        assert [r["run"] for r in out["runs"]] == [world["fl"]], ref
    res = in_process("verify", "nothing-of-that-name")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "no run or sweep" in res.stderr

    # A file of the run gone, and a file that is not the run's copied in: each named with why, exit 1.
    first = records.run_files(results / "records", world["fl"])[0]
    first.unlink()
    planted = records_of(results / "records", world["erm"]) / "epoch=00009.parquet"
    shutil.copy(records.run_files(results / "records", world["erm"])[0], planted)
    res = in_process("verify", "--json")
    assert res.returncode == 1
    out = json.loads(res.stdout)
    assert out["summary"]["failed"] == 2
    problems = {r["run"]: r["problems"] for r in out["runs"]}
    assert [(p["path"], p["planted"]) for p in problems[world["fl"]]] == [(str(first), False)]
    assert "is missing (its checksum is recorded)" in problems[world["fl"]][0]["problem"]
    assert [(p["path"], p["planted"]) for p in problems[world["erm"]]] == [(str(planted), True)]
    assert "is not among the run's checksums" in problems[world["erm"]][0]["problem"]
    fixes = {r["run"]: r["fix"] for r in out["runs"]}
    assert fixes[world["erm"]] == "move it out of the records folder" and "--rerun" in fixes[world["fl"]]
    text = in_process("verify")
    assert text.returncode == 1 and text.stdout.strip().splitlines()[-1] == "2 runs: 2 failed"
    # A run a worker holds is not checked (an epoch file lands before its checksum) and fails nothing.
    import sqlite3

    with sqlite3.connect(results / "flctl.db") as con:
        con.execute("UPDATE runs SET status = 'running' WHERE id = ?", (world["fl"],))
    con.close()
    res = in_process("verify", "--json")
    out = json.loads(res.stdout)
    assert res.returncode == 1 and out["summary"] == {"ok": 0, "unverified": 0, "failed": 1, "in progress": 1}
    with sqlite3.connect(results / "flctl.db") as con:
        con.execute("UPDATE runs SET status = 'completed' WHERE id = ?", (world["fl"],))
    con.close()
    # Reports refuse them too (the FL run's final file is intact: a listed file is missing), naming one.
    res = in_process("report", "--plot", "cdf")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert (str(first) in res.stderr and "--rerun" in res.stderr) or \
        (str(planted) in res.stderr and "move it out of the records folder" in res.stderr), res.stderr


def test_a_run_from_before_checksums_is_unverified_and_still_read(world, results: Path) -> None:
    """Written as flctl wrote records before checksums (and before confidence, pruned and the dictionary run_id):
    no _checksums.json, files of the older schema. Unverified is not a failure: verify exits 0, reports read it."""
    before = {}
    for run_id in (world["erm"], world["fl"]):
        before_checksums(records_of(results / "records", run_id))
    for path in records.run_files(results / "records", world["fl"]):
        old = pq.read_table(path).drop_columns(["confidence", "pruned"])
        old = old.set_column(0, "run_id", old["run_id"].cast(pa.string()))
        pq.write_table(old, path)
        before[path] = old
    res = in_process("verify")
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip().splitlines()[-1].startswith("2 runs: 2 unverified (no checksums"), res.stdout
    assert json.loads(in_process("verify", "--json").stdout)["summary"]["unverified"] == 2
    for command in (REPORTS[0], REPORTS[1], REPORTS[3]):
        res = in_process(*command)
        assert res.returncode == 0, (command, res.stderr)
    table = records.read(results / "records", [world["fl"]], epoch=3)
    assert table["confidence"].null_count == table.num_rows and table["loss"].equals(
        before[records.run_files(results / "records", world["fl"])[-1]]["loss"])


def test_checksums_are_written_with_each_epoch_and_only_for_runs_that_had_them_from_the_start(tmp_path: Path) -> None:
    def epoch(run_id: str, e: int) -> pa.Table:
        return writes.split_table(run_id, "train", e, np.full(4, float(e)), np.zeros(4), np.zeros(4))

    new, old = "0123456789abcdef", "fedcba9876543210"
    for e in (1, 2, 3):
        writes.write_epoch(tmp_path, new, e, [epoch(new, e)])
    body = json.loads((records_of(tmp_path, new) / records.CHECKSUMS).read_text())
    listed = body["files"]
    assert body["run_id"] == new        # the checksums name their run (a copy in another run's folder says so)
    assert sorted(listed) == ["epoch=00001.parquet", "epoch=00002.parquet", "epoch=00003.parquet"]
    # A run that resumes at epoch 1 removes its later files and writes epoch 2 again: epoch 3 leaves its checksums.
    records.run_files(tmp_path, new)[-1].unlink()
    writes.write_epoch(tmp_path, new, 2, [epoch(new, 2)])
    assert records.check_run(tmp_path, new).state == records.OK
    assert sorted(json.loads((records_of(tmp_path, new) / records.CHECKSUMS).read_text())["files"]) == \
        ["epoch=00001.parquet", "epoch=00002.parquet"]
    # A run begun before checksums and resumed after them keeps none: one unlisted file would fail it.
    folder = records_of(tmp_path, old)
    folder.mkdir(parents=True)
    pq.write_table(epoch(old, 1), folder / "epoch=00001.parquet")
    writes.write_epoch(tmp_path, old, 2, [epoch(old, 2)])
    assert not (folder / records.CHECKSUMS).exists() and records.check_run(tmp_path, old).state == records.UNVERIFIED
    assert records.read(tmp_path, [old]).num_rows == 8


def one_error(res, *words: str) -> str:
    """``res`` is one `error:` line holding ``words``, exit 2."""
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and all(w in lines[0] for w in words), res.stderr
    return lines[0]


@pytest.mark.parametrize("kept", ["named", "unnamed", "none"])
def test_another_runs_records_copied_into_a_run_fail_verify_and_reports(world, results: Path, kept: str) -> None:
    """`cp records/run_id=<A>/* records/run_id=<B>/` (the audit's case): every file, and the checksums, A's and
    intact. B fails (its rows are A's; its checksums name A), A stays ok, and reports refuse B instead of showing A's
    numbers as its own. ``kept``: checksums that name their run, checksums from before they did (which still verify
    while intact), and none at all (a run from before checksums: failed, not unverified)."""
    erm, fl = records_of(results / "records", world["erm"]), records_of(results / "records", world["fl"])
    for folder in (erm, fl):
        sums = folder / records.CHECKSUMS
        if kept == "none":
            before_checksums(folder)
        elif kept == "unnamed":
            body = json.loads(sums.read_text())
            assert body.pop("run_id") == folder.name.split("=", 1)[1]
            sums.write_text(json.dumps(body))
    intact = in_process("verify", "--json")
    assert intact.returncode == 0, intact.stdout + intact.stderr
    old = kept == "none"
    assert json.loads(intact.stdout)["summary"] == {"ok": 0 if old else 2, "unverified": 2 if old else 0, "failed": 0,
                                                    "in progress": 0}
    for path in erm.iterdir():
        shutil.copy(path, fl)

    res = in_process("verify", "--json")
    assert res.returncode == 1, res.stdout + res.stderr
    rows = {r["run"]: r for r in json.loads(res.stdout)["runs"]}
    assert rows[world["erm"]]["records"] == ("unverified" if old else "ok"), rows[world["erm"]]
    row = rows[world["fl"]]
    assert row["records"] == "failed" and "--rerun" in row["fix"], row
    texts = [p["problem"] for p in row["problems"]]
    if kept == "named":
        assert texts[0] == f"{fl / records.CHECKSUMS} names run {world['erm']!r}, not this folder's run " \
                           f"{world['fl']}: another run's, copied here", texts
    files = records.run_files(results / "records", world["fl"])
    for path in files:
        said = f"{path} holds rows of run {world['erm']!r}, not of run {world['fl']} (another run's records"
        assert any(t.startswith(said) for t in texts), texts
    text = in_process("verify")
    assert text.returncode == 1 and "1 failed" in text.stdout.strip().splitlines()[-1], text.stdout
    assert "holds rows of run" in text.stdout or "names run" in text.stdout, text.stdout

    first = fl / records.CHECKSUMS if kept == "named" else files[-1]
    for command in REPORTS:
        line = refused(in_process(*command), first, world["fl"], results)
        assert "--rerun" in line, line
    # The records reader refuses them too.
    with pytest.raises(ConfigError, match="holds rows of run|names run"):
        records.read(results / "records", [world["fl"]])


def test_verify_of_a_results_folder_that_is_a_file_says_so(tmp_path: Path) -> None:
    file = tmp_path / "results.txt"
    file.write_text("not a folder\n")
    for extra in ((), ("--json",), ("--db", f"sqlite:///{tmp_path / 'flctl.db'}")):
        line = one_error(in_process("verify", "--results-dir", str(file), *extra), str(file), "is a file, not a folder")
        assert "flctl.db" not in line.split("is a file", 1)[0] and "no run database" not in line, line
    assert file.read_text() == "not a folder\n" and sorted(p.name for p in tmp_path.iterdir()) == ["results.txt"]


def test_verify_of_a_records_folder_that_is_a_file_says_so(world, results: Path) -> None:
    shutil.rmtree(results / "records")
    (results / "records").write_text("")
    for args in ((), ("--json",), (world["fl"],)):
        line = one_error(in_process("verify", *args), str(results / "records"), "is a file, not a folder")
        assert "is missing" not in line, line
    assert (results / "records").read_text() == "" and not (results / "reports").exists()


@pytest.mark.parametrize("size", [True, False, -1, 1.0, "1234", None], ids=repr)
def test_a_checksum_entry_whose_bytes_is_not_a_byte_count_fails_its_run(world, results: Path, size) -> None:
    """``"bytes": true`` is not 1 (bool is an int in Python), nor is a negative, a float or a string a byte count:
    the checksums are damaged, and the run fails naming them."""
    sums = records_of(results / "records", world["fl"]) / records.CHECKSUMS
    body = json.loads(sums.read_text())
    body["files"][world["final"].name]["bytes"] = size
    sums.write_text(json.dumps(body))
    res = in_process("verify", "--json")
    assert res.returncode == 1, res.stdout + res.stderr
    rows = {r["run"]: r for r in json.loads(res.stdout)["runs"]}
    assert rows[world["erm"]]["records"] == "ok"
    problem = rows[world["fl"]]["problems"][0]
    assert problem["path"] == str(sums), problem
    assert f"holds an entry that is not a record file's checksum ('{world['final'].name}')" in problem["problem"]
