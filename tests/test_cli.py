"""The command line: the main job end to end, listings, and bad databases and folders (the table of bad arguments
is tests/test_bad_input.py)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flctl import api
from flctl.cli import app
from flctl.cost import format_cost
from tests.helpers import files_under

runner = CliRunner()


def flctl(*args: str):
    return runner.invoke(app, list(args))


def test_run_two_moons_fl_records_parquet_and_database(results: Path) -> None:
    res = flctl("run", "two-moons", "--method", "fl", "--eps", "0.1", "--epochs", "30")
    assert res.exit_code == 0, res.output
    assert "completed after 30 epochs" in res.output
    rows = json.loads(flctl("runs", "--json").stdout)
    assert len(rows) == 1
    run = rows[0]
    assert run["status"] == "completed" and run["task"] == "two-moons" and run["method"] == "fl"
    assert run["config"]["eps"] == 0.1 and run["config"]["alpha"] is None    # FL ignores alpha
    assert len(run["config_hash"]) == 64 and run["id"] == run["config_hash"][:16]
    for key in ("train.avg_loss", "train.max_loss", "train.accuracy", "train.cvar_0.9", "train.violation_rate",
                "train.zero_multiplier_share", "test.avg_loss", "test.accuracy"):
        assert key in run["metrics"]
    assert Path(run["artifacts"]["records"]).is_dir() and Path(run["artifacts"]["model"]).is_file()
    assert run["host"] and run["duration_s"] > 0 and run["attempts"] == 1
    assert (results / "flctl.db").is_file()

    # The same configuration is the same run: shown, not trained again.
    again = flctl("run", "two-moons", "--method", "fl", "--eps", "0.1", "--epochs", "30")
    assert again.exit_code == 0 and "already completed" in again.output
    assert len(json.loads(flctl("runs", "--json").stdout)) == 1

    shown = json.loads(flctl("show", run["id"][:6], "--json").stdout)
    assert shown["id"] == run["id"]
    assert shown["trained_with"] == {"engine": "eager", "cells_together": 1, "device": "cpu", "threads": 1,
                                     "threads_from": "OMP_NUM_THREADS"}      # the suite's (tests/conftest.py)
    human = flctl("show", run["id"])
    assert human.exit_code == 0 and "violation_rate" in human.output


def test_p_min_sets_eps_and_listing_filters(results: Path) -> None:
    assert flctl("run", "digits", "-m", "rfl", "--p-min", "0.6", "--alpha", "0.5", "--epochs", "1").exit_code == 0
    assert flctl("run", "digits", "-m", "erm", "--epochs", "1").exit_code == 0
    rfl = json.loads(flctl("runs", "--method", "rfl", "--json").stdout)
    assert len(rfl) == 1 and rfl[0]["config"]["eps"] == pytest.approx(0.5108, abs=1e-4)
    assert len(json.loads(flctl("runs", "--task", "digits", "--json").stdout)) == 2
    assert json.loads(flctl("runs", "--status", "failed", "--json").stdout) == []
    assert "2 run(s)" in flctl("runs").output


@pytest.mark.notorch
def test_tasks_and_methods_listings() -> None:
    tasks = {t["name"]: t for t in json.loads(flctl("tasks", "--json").stdout)}
    assert set(tasks) >= {"two-moons", "polyfit", "digits", "diabetes"}
    moons = tasks["two-moons"]["defaults"]
    assert (moons["epochs"], moons["batch_size"], moons["lr"], moons["dual_lr"]) == (250, 512, 5e-4, 1e-2)
    methods = {m["name"]: m for m in json.loads(flctl("methods", "--json").stdout)}
    assert list(methods) == ["erm", "fl", "rfl", "cserm"]          # table order
    assert methods["rfl"]["uses_alpha"] and not methods["fl"]["uses_alpha"]
    assert flctl("tasks").exit_code == 0 and flctl("methods").exit_code == 0


# ---- bad input: one line on stderr, exit code 2, nothing written ----

def assert_rejected(res, *needles: str) -> None:
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.notorch
def test_unwritable_results_directory(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    res = flctl("run", "two-moons", "--epochs", "1", "--results-dir", str(blocker / "results"))
    assert_rejected(res, "is not writable", "--results-dir")
    assert_rejected(flctl("run", "two-moons", "--epochs", "1", "--results-dir", str(blocker)),
                    "is a file, not a folder")
    assert blocker.read_text() == "not a directory"


@pytest.mark.notorch
def test_corrupt_database(results: Path) -> None:
    results.mkdir(parents=True)
    db = results / "flctl.db"
    db.write_bytes(b"this is not sqlite" * 100)
    before = db.read_bytes()
    assert_rejected(flctl("run", "two-moons", "--epochs", "1"), "cannot open database", "file is not a database")
    assert db.read_bytes() == before
    assert [p.name for p in files_under(results)] == ["flctl.db"]


@pytest.mark.notorch
def test_unreachable_database(results: Path) -> None:
    with socket.socket() as s:            # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgresql://flctl:secret@127.0.0.1:{port}/flctl"
    nested = results / "a" / "b"          # every folder the command would make is taken back
    for command in (["run", "two-moons", "--epochs", "1"], ["sweep", "two-moons", "--seeds", "2", "--epochs", "1"],
                    ["paper", "--scale", "smoke", "--only", "figure:3"]):
        res = flctl(*command, "--db", url, "--results-dir", str(nested))
        assert_rejected(res, "cannot reach database", f"127.0.0.1:{port}")
        assert "secret" not in res.stderr and res.stdout == "", res.stdout      # no plan before the error
        assert not results.exists()


@pytest.mark.notorch
def test_foreign_database_is_not_touched(results: Path) -> None:
    results.mkdir(parents=True)
    db = results / "other.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE notes (x TEXT)")
    assert_rejected(flctl("run", "two-moons", "--epochs", "1", "--db", f"sqlite:///{db}"), "not an flctl database")
    with sqlite3.connect(db) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    assert tables == ["notes"]


def test_schema_version_mismatch_is_reported(results: Path) -> None:
    assert flctl("run", "polyfit", "-m", "erm").exit_code == 0
    with sqlite3.connect(results / "flctl.db") as conn:
        conn.execute("UPDATE flctl_meta SET value = '99' WHERE key = 'schema_version'")
    assert_rejected(flctl("runs"), "schema v99 is newer than this flctl (v2)", "upgrade flctl")


def test_show_unknown_run_and_listing_without_database(results: Path) -> None:
    assert_rejected(flctl("runs"), "no run database", "--results-dir or FLCTL_RESULTS", "--db or FLCTL_DB")
    assert flctl("run", "polyfit", "-m", "erm").exit_code == 0
    assert_rejected(flctl("show", "ffffffff"), "no run 'ffffffff'")
    run_id = json.loads(flctl("runs", "--json").stdout)[0]["id"]
    assert json.loads(flctl("show", run_id[:4].upper(), "--json").stdout)["id"] == run_id
    # ids are hex prefixes matched literally: no LIKE wildcards, no 100,000-character queries
    for bad in ("_" + run_id[1:8], "%", "", run_id[:3], run_id[:3] + "%", "x" * 100_000):
        res = flctl("show", bad)
        assert_rejected(res, "give 4 to 64 hex digits")
        assert len(res.stderr) < 200
    for ref in ("%", "", "_"):
        assert_rejected(flctl("status", ref), "no sweep")
        assert_rejected(flctl("report", "--table", "main", "--sweep", ref),
                        "--sweep was given an empty value" if ref == "" else "no sweep")
    assert_rejected(flctl("runs", "--status", "done"), "unknown status")


def test_reads_never_write(results: Path, tmp_path: Path) -> None:
    import hashlib

    assert flctl("sweep", "polyfit", "-m", "erm,fl", "--executor", "debug").exit_code == 0
    db = results / "flctl.db"

    def content() -> str:
        # The database is in WAL mode: whichever connection closes last folds the log into the file, a reader's
        # included (it rewrites no row). Fold it here, so the file's bytes change only if a command wrote.
        with contextlib.closing(sqlite3.connect(db)) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return hashlib.sha256(db.read_bytes()).hexdigest()

    before = content()
    run_id = json.loads(flctl("runs", "--json").stdout)[0]["id"]
    for args in (["runs"], ["show", run_id], ["status"], ["sweeps"], ["report", "--table", "main"]):
        res = flctl(*args)
        assert res.exit_code == 0, (args, res.output)
    assert content() == before
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    for args in (["runs"], ["status"], ["report", "--table", "main"]):
        assert_rejected(flctl(*args, "--db", f"sqlite:///{empty}"), "empty: not an flctl database yet")
    assert empty.read_bytes() == b""


def test_dry_run_estimates_device_hours_from_finished_runs(results: Path) -> None:
    from flctl.cost import format_seconds, start_up
    from flctl.cost.reference import first_cell_extra

    plan = ["sweep", "two-moons", "-m", "fl", "--lr", "1e-3,1e-2", "--epochs", "40", "--workers", "1", "--dry-run"]
    assert "no finished two-moons runs on cpu" in flctl(*plan).output
    start = start_up("two-moons", "cpu")       # the committed benchmark's: no run's duration holds it
    assert flctl("run", "two-moons", "-m", "erm", "--epochs", "4").exit_code == 0
    run = json.loads(flctl("runs", "--json").stdout)[0]
    out = flctl(*plan).output.replace("\n", " ")
    per_epoch = run["duration_s"] / 4
    assert "80 epochs x " in out and "median of 1 finished two-moons runs on cpu" in out
    # two two-moons cells of one worker train together, as one grouped model: 2 cells at once
    assert f"about {format_cost((start + per_epoch * 80 / 2) / 3600, 'cpu')} (expected within " in out
    # Two epoch counts tell start-up from epochs: seconds = a + b * epochs through both runs (a 4-epoch run's
    # start-up no longer priced into every epoch of a long cell)
    with sqlite3.connect(results / "flctl.db") as conn:          # fixed durations: the fit is checked by hand
        conn.execute("UPDATE runs SET duration_s = 3.0")
    assert flctl("run", "two-moons", "-m", "erm", "--epochs", "44").exit_code == 0
    with sqlite3.connect(results / "flctl.db") as conn:
        conn.execute("UPDATE runs SET duration_s = 5.0 WHERE epochs_done = 44")
    out = flctl(*plan).output.replace("\n", " ")
    b = (5.0 - 3.0) / 40                                       # one slope; a = median(3 - 4b, 5 - 44b) = 2.8
    a = 2.8
    # each run its process's first: of a, a worker's first cell pays the committed benchmark's extra once
    extra = first_cell_extra("two-moons", "cpu")
    said = (f"(2 cell(s) x {format_seconds(a - extra, 'cpu')} + 80 epochs x {b:.3g} s) / 2 cells at once (fitted to 2 "
            "finished two-moons runs")
    once = f"{format_seconds(extra, 'cpu')} more for a worker's first cell + " if extra else ""
    assert (f"{format_seconds(start, 'cpu')} to start + " if start else "") + once + said in out, out
    # start + (2 x 2.8 + 80 x 0.05) / 2 s, as a person reads it; the fit passes through both runs: the narrowest interval
    total = start + 4.8
    assert f"cost: about {format_seconds(total, 'cpu')} (expected within {format_seconds(total / 1.25, 'cpu')} to " \
           f"{format_seconds(total * 1.25, 'cpu')}): " in out, out


def test_runs_says_how_many_it_left_out_and_limit_0_lists_all(results: Path) -> None:
    for seed in ("0", "1", "2"):
        assert flctl("run", "polyfit", "-m", "erm", "--seed", seed).exit_code == 0
    shown = runner.invoke(app, ["runs", "--limit", "2"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0 and shown.stdout.count("polyfit") == 2
    assert shown.stdout.endswith("2 of 3 runs; --limit N shows more (0: all)\n"), shown.stdout
    everything = runner.invoke(app, ["runs", "--limit", "0"], env={"COLUMNS": "200"})
    assert everything.stdout.count("polyfit") == 3 and everything.stdout.endswith("3 run(s)\n")
    assert runner.invoke(app, ["runs", "--limit", "3"]).stdout.endswith("3 run(s)\n")   # exactly all: nothing left


def test_a_solver_task_s_progress_bar_ends_full(results: Path) -> None:
    res = runner.invoke(app, ["run", "polyfit", "-m", "fl"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    # no terminal here: the log's lines stand for the bar, and the last one says 1 of 1
    line = [line for line in res.stdout.splitlines() if "): epoch " in line][-1]
    assert "(polyfit · fl" in line and " epoch 1/1 " in line and "avg " in line, res.stdout


@pytest.mark.notorch
def test_help_shows_no_value_for_flags_and_every_option_has_help() -> None:
    import re

    for command in (["sweep"], ["run"], ["runs"], ["report"], ["cancel"], ["status"]):
        res = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
        assert res.exit_code == 0
        assert "<bool>" not in res.output, command
        for line in res.output.splitlines():                 # an option row: name, type, then its help
            m = re.match(r"│\s+(--[a-z-]+)\s+(?:-\w\s+)?(<[^>]+>)?\s*(.*?)\s*│$", line)
            if m and not m.group(1).startswith("--no-"):
                assert m.group(3), f"{command[0]} {m.group(1)} has no help"


@pytest.mark.slow    # a completion process per word completed: 5 s
def test_shell_completion_offers_tasks_methods_kinds_and_ids(results: Path) -> None:
    import sys

    from tests import warm

    def complete(words: str) -> list[str]:
        env = {**os.environ, "_FLCTL_COMPLETE": "complete_bash", "COMP_WORDS": words,
               "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1))}
        script = Path(sys.executable).parent / "flctl"          # completion keys on the program's name
        out = warm.run([sys.executable, str(script)], env=env, capture_output=True, timeout=60)
        assert out.returncode == 0 and not out.stderr, out.stderr
        return out.stdout.split()

    assert complete("flctl run tw") == ["two-moons"]
    assert "orca-dpo" in complete("flctl sweep o")
    assert complete("flctl report --plot c") == ["cdf", "cvar"]
    assert complete("flctl run two-moons -m ") == ["erm", "fl", "rfl", "cserm"]
    assert complete("flctl sweep two-moons --method erm,r") == ["erm,rfl"]     # an axis: the last item
    assert complete("flctl run two-moons --dual-optimizer n") == ["nupi"]
    assert complete("flctl runs --status c") == ["completed"]
    assert complete("flctl report --methods erm,c") == ["erm,cserm"]
    assert complete("flctl show ") == [] and complete("flctl status ") == []   # no database: nothing, no error
    res = CliRunner().invoke(app, ["sweep", "two-moons", "-m", "erm,fl", "--epochs", "1", "--executor", "debug",
                                   "--name", "tiny"])
    assert res.exit_code == 0, res.output
    ids = [r["id"] for r in json.loads(CliRunner().invoke(app, ["runs", "--json"]).stdout)]
    assert sorted(complete("flctl show ")) == sorted(ids)
    assert complete(f"flctl show {ids[0][:6]}") == [i for i in ids if i.startswith(ids[0][:6])]
    (sweep,) = json.loads(CliRunner().invoke(app, ["sweeps", "--json"]).stdout)
    assert sorted(complete("flctl status ")) == sorted([sweep["id"], "tiny"])
    assert complete("flctl cancel ti") == ["tiny"]
    assert complete(f"flctl report --sweep {sweep['id'][:3]}") == [sweep["id"]]


@pytest.mark.notorch
def test_an_empty_results_dir_is_refused_not_the_current_folder(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)            # `--results-dir "$UNSET"` once filled the current folder
    for command in (["run", "two-moons", "--epochs", "1"], ["runs"]):
        assert_rejected(flctl(*command, "--results-dir", ""), "--results-dir was given an empty value")
    assert list(tmp_path.iterdir()) == []


def test_a_rerun_starts_its_time_and_attempts_afresh(results: Path) -> None:
    """--rerun trains from scratch, so the earlier life's seconds and attempts stop counting (they fed the cost
    estimates' seconds per epoch, and rose with every rerun)."""
    assert flctl("run", "two-moons", "--epochs", "1").exit_code == 0
    with sqlite3.connect(results / "flctl.db") as conn:     # as if the first life had been long and retried
        conn.execute("UPDATE runs SET duration_s = 1e6, attempts = 3")
    res = flctl("run", "two-moons", "--epochs", "1", "--rerun")
    assert res.exit_code == 0, res.output
    (run,) = json.loads(flctl("runs", "--json").stdout)
    assert run["attempts"] == 1 and 0 < run["duration_s"] < 1e5


def test_a_task_named_in_another_case_is_that_task(results: Path) -> None:
    """`flctl run Two-Moons` is `flctl run two-moons`, as `-m FL` is `-m fl`: the same run id, the task's own spelling
    in the config and the sweep; a name no task has in any case is still refused."""
    said = [flctl("run", name, "--epochs", "1", "--dry-run").stdout for name in ("two-moons", "Two-Moons")]
    assert said[0] == said[1] and "two-moons" in said[0]
    sweep = flctl("sweep", "TWO-MOONS", "-m", "erm", "--epochs", "1", "--executor", "debug", "--dry-run")
    assert sweep.exit_code == 0 and "runs of two-moons" in sweep.stdout and "TWO" not in sweep.stdout, sweep.output
    assert_rejected(flctl("run", "Two-Moon"), "unknown task 'Two-Moon'")


def test_a_dry_run_plans_without_the_data(results: Path, tmp_path: Path) -> None:
    """`flctl run cifar10 ... --dry-run` on a machine without CIFAR-10 shows the run id and its configuration, as
    `sweep --dry-run` and `paper --dry-run` plan without the data (before: it tried the download and exited 2)."""
    res = flctl("run", "cifar10", "-m", "fl", "--eps", "0.51", "--data-dir", str(tmp_path / "no-cifar"), "--dry-run")
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("run ") and "cifar10 · fl" in res.stdout and "looked for when it trains" in res.stdout
    assert not (tmp_path / "no-cifar").exists() and not results.exists()


def test_a_report_over_runs_of_several_sweeps_says_so_and_how_to_choose(results: Path) -> None:
    """The one rule of reports: without --sweep, every finished run of the task; where they come from several sweeps
    (or runs of their own), one note on stderr names the latest sweep for --sweep (before: 15 rows, 10 of them
    daggered, and nothing said). A report of one sweep says nothing of the kind, and a CSV stays a CSV."""
    for args in (["-m", "erm,fl", "--epochs", "2", "--name", "small"], ["-m", "fl", "--seeds", "2", "--epochs", "3"]):
        assert flctl("sweep", "two-moons", *args, "--executor", "debug").exit_code == 0
    latest = json.loads(flctl("sweeps", "--json").stdout)[0]["id"]
    mixed = flctl("report", "--table", "main", "--task", "two-moons", "--format", "csv")
    assert mixed.exit_code == 0 and mixed.stdout.startswith("Method,"), mixed.output
    assert [line for line in mixed.stderr.splitlines() if line.startswith("note:")] == [
        f"note: these 4 runs come from 2 sweep(s), shown together; `--sweep ID` shows one (the latest: {latest}; "
        "`flctl sweeps` lists them)"], mixed.stderr
    one = flctl("report", "--table", "main", "--sweep", latest)
    assert one.exit_code == 0 and "note:" not in one.stderr, one.output


def test_a_subset_cell_is_priced_at_its_samples_not_the_full_datas(results: Path) -> None:
    """One cost model for a smoke run, a subset and a full run: a run's work is its epochs x the samples each epoch
    trained on (its train.samples_seen), so a --subset cell is priced at its own size (before: a --subset 5000
    Fashion-MNIST sweep was priced at the full data's seconds per epoch, 8.6 cpu-hours for 16 minutes' work)."""
    from flctl.cost import estimate_cost

    assert flctl("run", "two-moons", "-m", "erm", "--epochs", "4").exit_code == 0        # 1,000 samples an epoch
    with sqlite3.connect(results / "flctl.db") as conn:
        conn.execute("UPDATE runs SET duration_s = 2.0")
    [run] = api.runs(results_dir=results)
    assert run.metrics["train.samples_seen"] == 4 * 1000
    full, tenth = (api.config("two-moons", "fl", epochs=40, subset=n, lr=1e-2) for n in (0, 100))
    cost = estimate_cost([run], [full, tenth], 1)
    assert cost is not None and cost.scale(full) == 1.0 and cost.scale(tenth) == 0.1
    start = cost.s_per_start / 3600          # once, whatever the cells: the processes' start-up
    assert (cost.hours([tenth]) - start) * 10 == pytest.approx(cost.hours([full]) - start)   # 40 epochs of 100: a tenth
    assert cost.work == pytest.approx(40 + 4)
