"""Every bad input, in one table: exit code 2, one `error:` line on stderr, no traceback, and the results folder
(database bytes included) exactly as it was. The commands run against a folder such as a user has: runs of three
tasks and a finished sweep. Cases that need a dataset on disk live with their task (test_cifar10, test_utkface);
report output paths in test_report_tables.
"""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flctl.cli import app
from flctl.db import Store

# Slow (pyproject.toml's markers; `pytest -m "not slow"` is the fast loop): 160 flctl processes, each given one bad
# input: 50 s of the suite's 904 s of test time (2 cores, xdist -n 2).
pytestmark = pytest.mark.slow

runner = CliRunner()


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("populated") / "results"
    for args in (["sweep", "two-moons", "-m", "erm,fl", "--epochs", "2", "--executor", "debug", "--name", "moons"],
                 ["run", "digits", "-m", "fl", "--epochs", "1"], ["run", "diabetes", "-m", "erm", "--epochs", "1"]):
        res = runner.invoke(app, [*args, "--results-dir", str(root)])
        assert res.exit_code == 0, res.output
    # The commands ran in this process, which may still hold the database open: move every commit into the
    # database file, so that a copy of the folder without the -wal file is whole.
    with sqlite3.connect(root / "flctl.db") as conn:
        assert conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
    conn.close()
    return root


@pytest.fixture
def populated(template: Path, tmp_path: Path) -> Path:
    """A fresh copy of the template folder for each case, with no -wal or -shm file (as a folder is when no
    command has its database open): a case that writes, or adds a file, cannot hide behind an earlier one."""
    root = tmp_path / "results"
    shutil.copytree(template, root, ignore=shutil.ignore_patterns("flctl.db-wal", "flctl.db-shm"))
    return root


def snapshot(root: Path) -> dict[str, str]:
    """Every file and folder under ``root`` with a hash of its bytes (folders: 'dir')."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


def first_run(root: Path) -> str:
    store = Store.open(f"sqlite:///{root / 'flctl.db'}", readonly=True)
    try:
        return store.list_runs()[0].id
    finally:
        store.close()


CASES: list[tuple[list[str], str]] = [
    # tasks, methods, run fields
    (["run", "mnist"], "unknown task 'mnist'"),
    (["sweep", "sweeps/two-moons.toml"], "a sweep spec is given as --spec sweeps/two-moons.toml"),
    (["run", "two-moons", "-m", "sgd"], "unknown method 'sgd'"),
    (["run", "two-moons", "--eps", "-0.1"], "--eps must be"),
    (["run", "two-moons", "-m", "rfl", "--alpha", "0"], "--alpha must be"),
    (["run", "two-moons", "-m", "cserm", "--alpha", "-1"], "--alpha must be"),
    (["run", "two-moons", "--p-min", "0"], "--p-min must be in (0, 1]"),
    (["run", "two-moons", "--p-min", "1.5"], "--p-min must be in (0, 1]"),
    (["run", "diabetes", "--p-min", "0.6"], "--p-min applies to classification"),
    (["run", "two-moons", "--eps", "0.1", "--p-min", "0.6"], "either --eps or --p-min"),
    (["run", "two-moons", "--lr", "-1e-3"], "--lr must be"),
    (["run", "two-moons", "--dual-lr", "-1"], "--dual-lr must be"),
    (["run", "two-moons", "--epochs", "0"], "--epochs must be at least 1"),
    (["run", "two-moons", "--epochs", "2000000"], "--epochs must be at most 1,000,000"),
    (["run", "two-moons", "--batch-size", "0"], "--batch-size must be at least 1"),
    (["run", "two-moons", "--batch-size", "1000000000"], "--batch-size must be at most"),
    (["run", "two-moons", "--seed", "99999999999"], "--seed must be at most 2,147,483,647"),
    (["run", "two-moons", "--optimizer", "lbfgs"], "unknown optimizer"),
    (["run", "two-moons", "--checkpoint-every", "-1"], "--checkpoint-every must be"),
    (["run", "two-moons", "--device", "tpu"], "unknown device 'tpu'"),
    (["run", "two-moons", "--device", "cuda"], "CUDA is not available"),
    (["run", "polyfit", "-m", "rfl"], "supports methods erm, fl"),
    # values a method ignores are checked too
    (["run", "two-moons", "-m", "erm", "--eps", "-5"], "--eps must be"),
    (["run", "two-moons", "-m", "fl", "--alpha", "0"], "--alpha must be"),
    # the dual optimizer and its gains (checked for gd too, where they are then dropped)
    (["run", "two-moons", "--dual-optimizer", "adam"], "unknown dual optimizer 'adam'"),
    (["run", "two-moons", "--engine", "warp"], "unknown engine 'warp'"),
    (["run", "two-moons", "--engine", "captured"], "--engine captured replays CUDA graphs"),
    (["run", "two-moons", "--engine", "compiled-captured"], "--engine compiled-captured replays CUDA graphs"),
    (["run", "two-moons", "--engine", "captured-streams"], "--engine captured-streams replays CUDA graphs"),
    (["run", "two-moons", "--dual-optimizer", "nupi", "--kp", "-1"], "--kp must be a finite number >= 0"),
    (["run", "two-moons", "--kp", "-1"], "--kp must be a finite number >= 0"),
    (["run", "two-moons", "--dual-optimizer", "nupi", "--nu", "1"], "--nu must be in [0, 1)"),
    (["run", "two-moons", "--dual-optimizer", "nupi", "--ki", "nan"], "--ki must be a finite number"),
    (["run", "two-moons", "-m", "erm", "--dual-optimizer", "nupi"], "erm has none (use fl or rfl)"),
    (["sweep", "two-moons", "-m", "fl,cserm", "--dual-optimizer", "nupi", "--dry-run"], "cserm has none"),
    # pruning
    (["run", "two-moons", "--prune-after", "-1"], "--prune-after must be a number of epochs in 0..1,000,000"),
    (["run", "two-moons", "--prune-after", "5", "--prune-patience", "0"], "--prune-patience must be at least 1"),
    (["run", "two-moons", "--prune-patience", "0"], "--prune-patience must be at least 1"),
    (["run", "two-moons", "-m", "erm", "--prune-after", "5"], "erm has no ε (use fl, rfl or cserm)"),
    # typer's own parse errors: one line as well
    (["run", "two-moons", "--epochs", "1e23"], "Invalid value for '--epochs'"),
    (["run", "two-moons", "--seed", "1e23"], "Invalid value for '--seed'"),
    (["run", "two-moons", "--seed", "2.5"], "Invalid value for '--seed'"),
    (["run", "two-moons", "--bogus", "3"], "No such option: --bogus"),
    (["run"], "Missing argument 'TASK'"),
    (["bogus"], "No such command 'bogus'"),
    # task options: names, types and each task's bounds
    (["run", "two-moons", "-o", "width=3"], "unknown option(s) width"),
    (["run", "two-moons", "-o", "hidden"], "--option expects KEY=VALUE"),
    (["run", "two-moons", "-o", "hidden=wide"], "hidden='wide' is not a valid int"),
    (["run", "two-moons", "-o", "hidden=0"], "hidden at least 1"),
    (["run", "two-moons", "-o", "n_train=0"], "n_train at least 2"),
    (["run", "two-moons", "-o", "noise=-1"], "noise at least 0"),
    (["run", "polyfit", "-m", "erm", "-o", "degree=-3"], "degree in [0, 100]"),
    (["run", "digits", "-o", "width=0"], "width"),
    # sweeps: axes, grid size, Slurm options (checked before anything reaches sbatch)
    (["sweep", "two-moons", "--lr", "1e-4..1:1000000", "--dry-run"], "at most 10,000 points"),
    (["sweep", "two-moons", "--lr", "1e-4..1:100", "--dual-lr", "1e-4..1:101", "--dry-run"], "--yes"),
    (["sweep", "two-moons", "-m", "erm", "--alpha", "0", "--dry-run"], "--alpha must be"),
    (["sweep", "diabetes", "-m", "rfl", "--tune", "3"], "--tune needs at least one axis"),
    (["sweep", "two-moons", "-m", "rfl", "--alpha", "0.1,,0.2", "--dry-run"], "an empty item between commas"),
    (["sweep", "two-moons", "-m", "rfl", "--seed", "0,", "--dry-run"], "an empty item between commas"),
    # a --data the task does not read would be recorded as the run's data: refused, in a dry run too
    (["run", "two-moons", "--data", "/no/such/folder"], "two-moons reads no --data"),
    (["sweep", "digits", "-m", "fl", "--seeds", "2", "--data", ".", "--dry-run"], "digits reads no --data"),
    (["run", "two-moons", "--optimizer", "adam"], "unknown optimizer 'adam'; choose one of: sgd, adamw"),
    (["run", "two-moons", "--dual-optimizer", "pid"], "unknown dual optimizer 'pid'"),
    (["sweep", "polyfit", "-m", "erm", "-o", "degree=10,-1", "--dry-run"], "degree in [0, 100]"),
    (["sweep", "two-moons", "--seeds", "0"], "seeds must be a whole number of seeds in 1..10,000"),
    (["sweep", "two-moons", "--executor", "slurm", "--gpus", "-1", "--epochs", "1"], "--gpus must be"),
    (["sweep", "two-moons", "--executor", "slurm", "--mem-gb", "0", "--epochs", "1"], "--mem-gb must be"),
    (["sweep", "two-moons", "--executor", "slurm", "--time-min", "0", "--epochs", "1"], "--time-min must be"),
    (["sweep", "two-moons", "--executor", "slurm", "--partition", "a b", "--epochs", "1"], "one word"),
    (["sweep", "two-moons", "--executor", "cloud", "--epochs", "1"], "cloud"),
    # what lands in the Slurm batch script stays on its line; names print as text (tests/test_untrusted_text.py)
    (["sweep", "two-moons", "--executor", "slurm", "--sbatch", "comment=a\ntouch /tmp/x", "--epochs", "1"],
     "the value holds a control character (U+000A)"),
    (["sweep", "two-moons", "--executor", "slurm", "--sbatch", "comm\nent=a", "--epochs", "1"], "an sbatch option name"),
    (["sweep", "two-moons", "--executor", "slurm", "--partition", "gpu\x1b", "--epochs", "1"], "one word"),
    (["sweep", "two-moons", "--name", "a\x1b]0;x\x07", "--epochs", "1"], "holds a control character (U+001B)"),
    (["sweep", "two-moons", "--name", "a\u202eb", "--epochs", "1", "--dry-run"], "holds a control character (U+202E)"),
    # devices: known kinds only, checked before a run or sweep is recorded (a worker would fail on each cell)
    (["run", "two-moons", "--device", "cuda:x"], "unknown device 'cuda:x'; choose cpu, cuda, cuda:N or auto"),
    (["run", "two-moons", "--device", "mps"], "unknown device 'mps'"),
    (["run", "two-moons", "--device", "cuda:99"], "--device cuda:99"),
    (["sweep", "two-moons", "--device", "tpu", "--epochs", "1"], "unknown device 'tpu'"),
    (["sweep", "two-moons", "--device", "mps", "--epochs", "1"], "unknown device 'mps'"),
    (["sweep", "two-moons", "--device", "cuda:x", "--epochs", "1"], "unknown device 'cuda:x'"),
    (["sweep", "two-moons", "--device", "cuda:99", "--epochs", "1"], "--device cuda:99"),
    (["sweep", "two-moons", "--device", "tpu", "--dry-run"], "unknown device 'tpu'"),
    (["sweep", "two-moons", "--executor", "slurm", "--device", "auto", "--epochs", "1"],
     "--device auto is resolved on this machine"),
    # an α (or ε, or gain) axis that no planned run reads is not silently collapsed to one run
    (["sweep", "two-moons", "-m", "erm", "--alpha", "1e-2..1", "--dry-run"],
     "--alpha sweeps 3 values, but no planned method reads it (erm); rfl, cserm do"),
    (["sweep", "two-moons", "-m", "erm", "--p-min", "0.5,0.6", "--epochs", "1"], "--p-min sweeps 2 values"),
    (["sweep", "polyfit", "--alpha", "1,2", "--dry-run"], "--alpha: no method of task 'polyfit' (erm, fl) reads it"),
    (["sweep", "two-moons", "--kp", "0,1", "--dry-run"], "--kp sweeps 2 values, but every planned run ignores it"),
    # an in-memory database would train, then lose every row
    (["run", "two-moons", "--db", "sqlite://"], "--db 'sqlite://' is an in-memory database"),
    (["run", "two-moons", "--db", "sqlite:///:memory:"], "in-memory database"),
    (["sweep", "two-moons", "--db", "sqlite://", "--epochs", "1"], "in-memory database"),
    (["runs", "--db", "sqlite://"], "in-memory database"),
    (["runs", "--db", "postgresql://u:secret@127.0.0.1:abc/x"], "'postgresql://u:***@127.0.0.1:abc/x' is not a database URL"),
    # ids: hex prefixes of 4 to 64 digits, matched literally
    (["show", "%"], "give 4 to 64 hex digits"),
    (["show", ""], "give 4 to 64 hex digits"),
    (["show", "_{run1_7}"], "give 4 to 64 hex digits"),
    (["show", "{run0_3}"], "give 4 to 64 hex digits"),
    (["show", "x" * 100_000], "give 4 to 64 hex digits"),
    (["show", "ffffffffffff"], "no run 'ffffffffffff'"),
    (["status", "%"], "no sweep"),
    (["status", ""], "no sweep"),
    (["status", "nope"], "no sweep"),
    (["cancel", "nope"], "no sweep"),
    (["runs", "--status", "done"], "unknown status 'done'"),
    (["runs", "--limit", "x"], "Invalid value for '--limit'"),
    (["runs", "--limit", "-3"], "--limit must be a number of runs >= 0 (0: all)"),
    # missing datasets: where they come from and the layout expected
    (["run", "utkface"], "https://susanqq.github.io/UTKFace/) extracts to UTKFace/"),
    (["run", "cifar10", "--data-dir", "/nonexistent-flctl"], "(the python version from https://www.cs.toronto.edu"),
    # reports
    (["report", "--table", "main"], "3 tasks (diabetes, digits, two-moons); pick one with --task or --sweep"),
    (["report", "--plot", "reliability", "--task", "diabetes"], "need a classifier's confidences"),
    (["report", "--table", "groups", "--by", "race", "--task", "digits"], "--by race: its runs label no groups"),
    (["report", "--table", "groups", "--task", "digits"], "--table groups needs --by ATTRIBUTE"),
    (["report", "--table", "main", "--by", "race", "--task", "digits"], "--by applies to --table groups"),
    (["report", "--table", "figure"], "unknown table 'figure'"),
    (["report", "--table", "main", "--task", "cifar10"], "no finished runs match"),
    (["report", "--table", "main", "--sweep", "%"], "no sweep"),
    (["report", "--table", "main", "--sweep", "nope"], "no sweep 'nope'"),
    (["report", "--table", "main", "--task", "digits", "--format", "html"], "unknown format 'html'"),
    (["report", "--table", "main", "--task", "digits", "--digits", "-1"], "--digits must be in 0..12"),
    (["report", "--table", "main", "--task", "digits", "--columns", ","], "--columns is empty"),
    (["report", "--table", "main", "--plot", "cdf"], "exactly one of"),
    (["report", "--samples", "diff", "--methods", "erm"], "needs --methods A,B"),
    (["report", "--samples", "diff", "--methods", "erm,fl", "--top", "-5"], "--top must be at least 1"),
    (["report", "--samples", "violators", "--min-seeds", "0"], "--min-seeds must be at least 1"),
    # a sample id names a sample of one task: per-sample queries take one task, as tables do
    (["report", "--samples", "violators", "--min-seeds", "3"], "3 tasks (diabetes, digits, two-moons); pick one with --task"),
    (["report", "--samples", "diff", "--methods", "erm,fl", "--top", "5"], "3 tasks (diabetes, digits, two-moons)"),
    (["report", "--samples", "diff", "--methods", "fl,fl", "--task", "two-moons"], "names fl twice"),
    (["report", "--plot", "heatmap", "--task", "two-moons"], "--sweep"),
]


# Every case runs as on a machine without CUDA (`--device cuda` is refused there; on a GPU the run trains).
@pytest.mark.usefixtures("no_cuda")
@pytest.mark.parametrize("args,needle", CASES, ids=[" ".join(a)[:60] for a, _ in CASES])
def test_bad_input_is_one_line_and_changes_nothing(template: Path, populated: Path, args: list[str],
                                                    needle: str) -> None:
    run_id = first_run(template)           # not the copy: the case alone touches it
    args = [a.format(run1_7=run_id[1:8], run0_3=run_id[:3]) if "{" in a else a for a in args]
    before = snapshot(populated)
    res = runner.invoke(app, args, env={"FLCTL_RESULTS": str(populated), "COLUMNS": "200"})
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2, res.output
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], res.stderr
    assert "Traceback" not in res.output and len(lines[0]) < 400, res.output
    assert snapshot(populated) == before


def test_bad_input_creates_no_results_folder(results: Path, no_cuda: None) -> None:
    for args, _ in CASES:
        if args[0] in ("run", "sweep") and "{" not in "".join(args):
            assert runner.invoke(app, args).exit_code == 2, args
    assert not results.exists()


SPECS = [
    ('seeds = "three"', "seeds must be an integer, got 'three'"),
    ("seeds = 2.5", "seeds must be an integer, got 2.5"),
    ("seeds = 0", "seeds must be a whole number of seeds in 1..10,000"),
    ('options = "x"', "options must be a table ([options]), got 'x'"),
    ('launch = "local"', "launch must be a table ([launch]), got 'local'"),
    ("epochs = 1e23", "epochs"),
    ('method = ["fl", "nope"]', "unknown method 'nope'"),
    ("[axes]\nlr = [0.1", "spec"),
    ('name = "a\\u001b[2Jb"', "holds a control character (U+001B)"),
    ('[launch]\nexecutor = "slurm"\n[launch.sbatch]\ncomment = "a\\ntouch /tmp/x"',
     "the value holds a control character (U+000A)"),
    ('[launch]\nexecutor = "slurm"\nsbatch = "x"', "sbatch must be a table"),
    ('[launch]\npartition = "gpu"', "--partition is not an option of --executor local"),
    ("[launch]\nworkers = true", "--workers must be an integer of at least 1, got True"),
    ("[launch]\ncheckpoint_every = true", "--checkpoint-every must be a number of seconds >= 0, got True"),
    ('device = "tpu"', "unknown device 'tpu'"),
    ('device = "cuda:x"', "unknown device 'cuda:x'"),
    ('method = ["erm"]\nalpha = [0.1, 1.0]', "--alpha sweeps 2 values"),
]


@pytest.mark.parametrize("body,needle", SPECS, ids=[b[:30] for b, _ in SPECS])
def test_bad_spec_is_one_line_and_changes_nothing(populated: Path, tmp_path: Path, body: str, needle: str) -> None:
    spec = tmp_path / "bad.toml"
    spec.write_text(f'task = "two-moons"\n{body}\n')
    before = snapshot(populated)
    res = runner.invoke(app, ["sweep", "--spec", str(spec)], env={"FLCTL_RESULTS": str(populated)})
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], res.output
    assert snapshot(populated) == before


# Spec files that are not TOML text at all: read as bytes, refused before parsing.
SPEC_FILES = [
    ("latin-1", lambda p: p.write_bytes('task = "two-moons"\nname = "café"\n'.encode("latin-1")), "is not UTF-8 text"),
    ("binary", lambda p: p.write_bytes(bytes(range(256)) * 4), "is not UTF-8 text"),
    ("folder", lambda p: p.mkdir(), "is a folder"),
    ("nested 900 deep", lambda p: p.write_text('task = "two-moons"\nseed = ' + "[" * 900 + "]" * 900 + "\n"),
     "nests its values too deeply"),
    ("nested tables", lambda p: p.write_text('task = "two-moons"\nx = ' + "{a=" * 900 + "1" + "}" * 900 + "\n"),
     "nests its values too deeply"),
]


@pytest.mark.parametrize("make,needle", [c[1:] for c in SPEC_FILES], ids=[c[0] for c in SPEC_FILES])
def test_spec_file_that_is_not_text_is_one_line(populated: Path, tmp_path: Path, make, needle: str) -> None:
    spec = tmp_path / "bad.toml"
    make(spec)
    before = snapshot(populated)
    res = runner.invoke(app, ["sweep", "--spec", str(spec)], env={"FLCTL_RESULTS": str(populated)})
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], res.output
    assert snapshot(populated) == before


def _fake_slurm(folder: Path, commands: dict[str, str]) -> str:
    """A PATH of stand-ins for Slurm's commands: each name a shell script with the given body."""
    folder.mkdir()
    for name, body in commands.items():
        (folder / name).write_text(f"#!/bin/sh\n{body}\n")
        (folder / name).chmod(0o755)
    return str(folder)


NO_CLUSTER = "echo 'sinfo: fatal: Could not establish a configuration source' >&2; exit 1"
SLURM_CASES = [
    ("sbatch without srun", {"sbatch": "exit 0"}, "srun, sacct, squeue, scancel, sinfo are missing"),
    ("no cluster answers", {c: "exit 0" for c in ("sbatch", "srun", "sacct", "squeue", "scancel")} | {"sinfo": NO_CLUSTER},
     "no Slurm cluster answers here (sinfo: sinfo: fatal: Could not establish a configuration source)"),
]


@pytest.mark.parametrize("commands,needle", [c[1:] for c in SLURM_CASES], ids=[c[0] for c in SLURM_CASES])
def test_slurm_that_cannot_submit_is_one_line_before_the_sweep_is_recorded(
        populated: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, commands: dict, needle: str) -> None:
    monkeypatch.setenv("PATH", _fake_slurm(tmp_path / "bin", commands))
    before = snapshot(populated)
    res = runner.invoke(app, ["sweep", "two-moons", "--epochs", "3", "--executor", "slurm"],
                        env={"FLCTL_RESULTS": str(populated)})
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and needle in lines[0], res.output
    assert snapshot(populated) == before        # no sweep row, no results/jobs folder


# Read once at import, so each case is a fresh process.
ENVIRONMENTS = [
    ({"FLCTL_HEARTBEAT": "30s"}, "FLCTL_HEARTBEAT must be a positive number of seconds (e.g. 30), got '30s'"),
    ({"FLCTL_HEARTBEAT": ""}, "FLCTL_HEARTBEAT must be a positive number of seconds (e.g. 30), got ''"),
    ({"FLCTL_HEARTBEAT": "inf"}, "FLCTL_HEARTBEAT must be a positive number of seconds"),
    ({"FLCTL_HEARTBEAT": "nan"}, "FLCTL_HEARTBEAT must be a positive number of seconds"),
    ({"FLCTL_HEARTBEAT": "-5"}, "FLCTL_HEARTBEAT must be a positive number of seconds"),
    ({"FLCTL_HEARTBEAT": "0"}, "FLCTL_HEARTBEAT must be a positive number of seconds"),
    ({"FLCTL_HEARTBEAT": "1e-9"}, "FLCTL_HEARTBEAT must be at least 0.05 s"),
    ({"FLCTL_HEARTBEAT": "600"}, "FLCTL_HEARTBEAT (600 s) must be shorter than FLCTL_STALE_AFTER (300 s)"),
    ({"FLCTL_STALE_AFTER": "abc"}, "FLCTL_STALE_AFTER must be a positive number of seconds"),
    ({"FLCTL_DB": "sqlite://"}, "FLCTL_DB 'sqlite://' is an in-memory database"),
]


@pytest.mark.parametrize("env,needle", ENVIRONMENTS, ids=[f"{k}={v}" for e, _ in ENVIRONMENTS for k, v in e.items()])
def test_bad_environment_is_one_line_and_changes_nothing(populated: Path, env: dict, needle: str) -> None:
    import os
    import subprocess
    import sys

    before = snapshot(populated)
    res = subprocess.run([sys.executable, "-m", "flctl", "run", "two-moons", "--epochs", "1"], capture_output=True,
                         text=True, timeout=120,
                         env={**os.environ, "FLCTL_RESULTS": str(populated), **env})
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], \
        res.stderr
    assert snapshot(populated) == before
