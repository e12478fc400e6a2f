"""Issue 69's campaign of faults, by someone who wrote none of its code: its paths tried the way they break, as a new
user and an operator would (bad input, pipes, signals at each step of a run, a frozen or killed process, a database or
its server gone, damaged files, a second process doing the same thing, a task that raises). Each case is what a user
would expect; a case that was not clean is a strict xfail naming its defect, for the owners to fix.

Steps of a run are reached on purpose, not by a sleep: the task `campaign-moons` (two-moons) touches a marker file as
it enters each step (data, build, forward, extras: the final write) and naps or raises there when told by C69_*."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from flctl import api
from tests import warm
from tests.helpers import config, in_process
from tests.test_concurrency import pg_database
from tests.test_streams_signals import shell

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
FLCTL = [sys.executable, "-m", "flctl"]
SMALL = ["-o", "n_train=200", "-o", "n_test=200", "--batch-size", "50"]
TASK = textwrap.dedent('''
    import dataclasses, os, pathlib, time
    import torch
    from flctl_tasks.two_moons import TASK as MOONS

    def step(name):
        marks = os.environ.get("C69_MARKS")
        if marks:
            pathlib.Path(marks, name).touch()
        time.sleep(float(os.environ.get("C69_NAP_" + name.upper(), "0")))
        seeds = os.environ.get("C69_SEEDS")
        if os.environ.get("C69_FAIL") == name and (not seeds or torch.initial_seed() in {int(s) for s in seeds.split(",")}):
            raise ValueError(f"planted failure in {name}")

    def load(options, data_dir):
        step("data")
        return MOONS.load(options, data_dir)

    class Slow(torch.nn.Module):
        def __init__(self, body):
            super().__init__()
            self.body = body

        def forward(self, x):
            if self.training:
                step("forward")
            return self.body(x)

    def build_model(options, data):
        step("build")
        return Slow(MOONS.build_model(options, data))

    def extras(model, data, options):
        step("extras")
        return MOONS.extras(getattr(model, "body", model), data, options)

    TASK = dataclasses.replace(MOONS, name="campaign-moons", description="two moons that naps or fails at a step",
                               load=load, build_model=build_model, extras=extras, batched=False)
''')


# ---------------------------------------------------------------- helpers

def env_of(tmp: Path, **knobs: str) -> dict[str, str]:
    task = tmp / "campaign_moons.py"
    if not task.exists():
        task.write_text(TASK)
    (tmp / "marks").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("FLCTL_DB", "FLCTL_RESULTS", "PYTHONPATH")}
    return env | {"FLCTL_TASKS": str(task), "C69_MARKS": str(tmp / "marks"), "COLUMNS": "200",
                  "FLCTL_RESULTS": str(tmp / "results")} | knobs


def start(tmp: Path, *args: str, **knobs: str) -> warm.Popen:
    return warm.Popen([*FLCTL, *args], stdout=warm.PIPE, stderr=warm.PIPE, env=env_of(tmp, **knobs), cwd=str(tmp))


def flctl(tmp: Path, *args: str, timeout: float = 300, **knobs: str) -> subprocess.CompletedProcess:
    return warm.run([*FLCTL, *args], capture_output=True, env=env_of(tmp, **knobs), cwd=str(tmp), timeout=timeout)


def reached(tmp: Path, mark: str, proc: warm.Popen | None = None, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not (tmp / "marks" / mark).exists():
        assert proc is None or proc.poll() is None, ("ended before", mark, proc.communicate(5))
        assert time.monotonic() < deadline, f"never reached {mark}"
        time.sleep(0.02)


def rows(tmp: Path) -> list[dict]:
    res = in_process("runs", "--json", "--results-dir", str(tmp / "results"))
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def clean_end(out: str, err: str) -> None:
    assert "Traceback" not in out + err and "Exception ignored" not in out + err, (out, err)


def one_line(res, *codes: int) -> str:
    lines = [line for line in res.stderr.strip().splitlines() if line.strip()]
    assert res.returncode in codes and len(lines) == 1, (res.returncode, res.stdout, res.stderr)
    clean_end(res.stdout, res.stderr)
    return lines[0]


RUN = ["run", "campaign-moons", "-m", "fl", *SMALL]


# ---------------------------------------------------------------- signals at each step of `flctl run`

@pytest.mark.parametrize("sig,code", [(signal.SIGHUP, 129), (signal.SIGTERM, 143), (signal.SIGINT, 130)])
@pytest.mark.parametrize("where", ["data", "forward", "extras"])
def test_a_signal_at_each_step_of_a_run_leaves_no_row_running(tmp_path: Path, where: str, sig: int, code: int) -> None:
    """Cases 1-9: SIGHUP, SIGTERM, SIGINT during data loading, mid-epoch and during the final write."""
    naps = {"data": {"C69_NAP_DATA": "2"}, "forward": {"C69_NAP_FORWARD": "0.2"}, "extras": {"C69_NAP_EXTRAS": "2"}}
    proc = start(tmp_path, *RUN, "--epochs", "3", **naps[where])
    reached(tmp_path, where, proc)
    proc.send_signal(sig)
    out, err = proc.communicate(180)
    clean_end(out, err)
    [row] = rows(tmp_path)
    if where == "extras":             # training was over: recorded completed, or handed back; never left running
        assert (proc.returncode, row["status"]) in {(0, "completed"), (code, "completed"), (code, "interrupted")}, \
            (proc.returncode, row, err)
    else:
        assert proc.returncode == code and row["status"] == "interrupted", (proc.returncode, row, err)
        assert "interrupted after" in out + err, (out, err)                      # one line says so


def test_the_line_of_a_stopped_run_goes_to_stderr(tmp_path: Path) -> None:
    """Case 10b: SIGTERM mid-epoch under `flctl run ... > log`: the stop line is on stderr, as documented."""
    proc = start(tmp_path, *RUN, "--epochs", "3", C69_NAP_FORWARD="0.2")
    reached(tmp_path, "forward", proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(180)
    assert proc.returncode == 143 and "interrupted after" in err, (out, err)


def test_a_signal_before_the_claim_leaves_nothing_half_made(tmp_path: Path) -> None:
    """Case 10: SIGTERM while `flctl run` is still starting (before any row or claim)."""
    proc = start(tmp_path, *RUN, "--epochs", "2")
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(120)
    assert proc.returncode in (143, -signal.SIGTERM, 0), (proc.returncode, err)
    assert all(r["status"] in ("interrupted", "completed", "queued") for r in (rows(tmp_path)
               if (tmp_path / "results" / "flctl.db").exists() else [])), rows(tmp_path)


def test_two_signals_mid_epoch_stop_at_once_and_the_run_resumes(tmp_path: Path) -> None:
    """Case 11: SIGTERM twice mid-epoch (a second signal stops at once), then the same command again."""
    proc = start(tmp_path, *RUN, "--epochs", "3", C69_NAP_FORWARD="0.3")
    reached(tmp_path, "forward", proc)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(120)
    assert proc.returncode == 143, (proc.returncode, err)
    clean_end(out, err)
    assert rows(tmp_path)[0]["status"] != "running", rows(tmp_path)
    again = flctl(tmp_path, *RUN, "--epochs", "3")
    assert again.returncode == 0 and rows(tmp_path)[0]["status"] == "completed", again.stderr


@pytest.mark.parametrize("where", ["data", "forward", "extras"])
def test_a_run_killed_at_each_step_is_taken_up_by_the_same_command(tmp_path: Path, where: str) -> None:
    """Cases 12-14: kill -9 during data loading, mid-epoch, during the final write; then `flctl run` again."""
    naps = {"data": {"C69_NAP_DATA": "3"}, "forward": {"C69_NAP_FORWARD": "0.3"}, "extras": {"C69_NAP_EXTRAS": "3"}}
    proc = start(tmp_path, *RUN, "--epochs", "2", "--eval-every", "1", **naps[where])
    reached(tmp_path, where, proc)
    proc.kill()
    proc.wait(30)
    again = flctl(tmp_path, *RUN, "--epochs", "2", "--eval-every", "1")
    assert again.returncode == 0, again.stdout + again.stderr
    [row] = rows(tmp_path)
    assert row["status"] == "completed" and row["epochs_done"] == 2, row
    verified = in_process("verify", row["id"], "--results-dir", str(tmp_path / "results"))
    assert verified.returncode == 0, verified.stdout + verified.stderr


@pytest.mark.parametrize("where", ["data", "forward"])
def test_a_frozen_run_is_named_by_a_second_run_of_its_config(tmp_path: Path, where: str) -> None:
    """Cases 15-16: `flctl run` frozen (SIGSTOP) loading data or mid-epoch; the same command from another shell says
    who holds it (exit 1) and writes nothing; woken, the first completes."""
    naps = {"data": {"C69_NAP_DATA": "1"}, "forward": {"C69_NAP_FORWARD": "0.05"}}
    proc = start(tmp_path, *RUN, "--epochs", "2", **naps[where])
    reached(tmp_path, where, proc)
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        second = flctl(tmp_path, *RUN, "--epochs", "2")
        line = one_line(second, 1)
        assert str(proc.pid) in line or "being trained" in line or "another process" in line, line
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    out, err = proc.communicate(180)
    assert proc.returncode == 0 and rows(tmp_path)[0]["status"] == "completed", (err, rows(tmp_path))


def test_two_runs_of_one_config_started_together(tmp_path: Path) -> None:
    """Case 17: two `flctl run` of one configuration at the same moment: one trains, the other names it."""
    a = start(tmp_path, *RUN, "--epochs", "2")
    b = start(tmp_path, *RUN, "--epochs", "2")
    (_, ea), (_, eb) = a.communicate(240), b.communicate(240)
    clean_end("", ea + eb)
    assert sorted([a.returncode, b.returncode]) in ([0, 0], [0, 1]), (a.returncode, ea, b.returncode, eb)
    [row] = rows(tmp_path)
    assert row["status"] == "completed" and row["attempts"] == 1, row


@pytest.mark.parametrize("where,status", [("data", "failed"), ("build", "failed"), ("forward", "failed"),
                                          ("extras", "failed")])
def test_a_task_that_raises_at_each_step_fails_its_run_in_one_line(tmp_path: Path, where: str, status: str) -> None:
    """Cases 18-21: the task raises in data loading, model build, forward, extras: exit 1, the error named, the run
    failed (not running, not queued)."""
    res = flctl(tmp_path, *RUN, "--epochs", "2", C69_FAIL=where)
    assert res.returncode == 1 and f"planted failure in {where}" in res.stderr, res.stdout + res.stderr
    clean_end(res.stdout, res.stderr)
    assert [r["status"] for r in rows(tmp_path)] == [status], rows(tmp_path)


# ---------------------------------------------------------------- sweeps beside other processes and faults

SWEEP = ["sweep", "campaign-moons", "-m", "erm", *SMALL, "--seeds", "2"]


@pytest.mark.parametrize("sig,code,times", [(signal.SIGTERM, 143, 1), (signal.SIGINT, 130, 2)])
def test_a_waiting_sweep_stopped_mid_cell_hands_its_cells_back(tmp_path: Path, sig: int, code: int,
                                                                times: int) -> None:
    """Cases 22-23: `sweep --wait` SIGTERM once, SIGINT twice, mid-cell: its code, no cell left running."""
    proc = start(tmp_path, *SWEEP, "--epochs", "50", "--workers", "1", "--wait", C69_NAP_FORWARD="0.05")
    reached(tmp_path, "forward", proc)
    for _ in range(times):
        proc.send_signal(sig)
        time.sleep(0.2)
    out, err = proc.communicate(180)
    clean_end(out, err)
    assert proc.returncode == code, (proc.returncode, err)
    time.sleep(1)
    assert not [r for r in rows(tmp_path) if r["status"] == "running"], rows(tmp_path)


def test_two_waiting_sweeps_of_one_grid_on_sqlite_both_end_well(tmp_path: Path) -> None:
    """Case 24: two `flctl sweep --wait` of the same axes at once: both 0, each cell trained once."""
    a = start(tmp_path, *SWEEP, "--epochs", "2", "--workers", "1", "--wait")
    b = start(tmp_path, *SWEEP, "--epochs", "2", "--workers", "1", "--wait")
    (oa, ea), (ob, eb) = a.communicate(300), b.communicate(300)
    clean_end(oa + ob, ea + eb)
    assert (a.returncode, b.returncode) == (0, 0), (ea, eb)
    assert sorted((r["status"], r["attempts"]) for r in rows(tmp_path)) == [("completed", 1)] * 2, rows(tmp_path)


def test_two_sweeps_of_one_grid_on_postgresql_both_end_well(tmp_path: Path) -> None:
    """Case 25: the same on PostgreSQL (the launch's new-runs lock)."""
    url = pg_database()
    a = start(tmp_path, *SWEEP, "--epochs", "2", "--executor", "debug", "--wait", "--db", url)
    b = start(tmp_path, *SWEEP, "--epochs", "2", "--executor", "debug", "--wait", "--db", url)
    (oa, ea), (ob, eb) = a.communicate(300), b.communicate(300)
    clean_end(oa + ob, ea + eb)
    assert (a.returncode, b.returncode) == (0, 0), (ea, eb)
    runs = json.loads(in_process("runs", "--json", "--db", url).stdout)
    assert sorted(r["status"] for r in runs) == ["completed"] * 2, runs


def test_a_sweep_and_a_rerun_of_its_cell_at_once(tmp_path: Path) -> None:
    """Case 26: `flctl run --rerun` of a cell while a sweep trains it: neither a traceback, the cell completed."""
    first = flctl(tmp_path, *SWEEP, "--epochs", "2", "--executor", "debug", "--wait")
    assert first.returncode == 0, first.stderr
    seed0 = next(r for r in rows(tmp_path) if r["seed"] == 0)
    sweep = start(tmp_path, *SWEEP, "--epochs", "3", "--executor", "debug", "--wait", C69_NAP_FORWARD="0.05")
    reached(tmp_path, "forward", sweep)
    rerun = flctl(tmp_path, "run", "campaign-moons", "-m", "erm", *SMALL, "--epochs", "2", "--seed", "0", "--rerun")
    out, err = sweep.communicate(300)
    clean_end(out + rerun.stdout, err + rerun.stderr)
    assert sweep.returncode == 0 and rerun.returncode in (0, 1), (err, rerun.stderr)
    assert {r["status"] for r in rows(tmp_path)} == {"completed"}, rows(tmp_path)
    assert any(r["id"] == seed0["id"] for r in rows(tmp_path))


def test_a_killed_waiting_sweep_is_finished_by_the_same_command(tmp_path: Path) -> None:
    """Case 27: kill -9 of `sweep --wait --executor debug` mid-cell, then the same command: every cell completed."""
    proc = start(tmp_path, *SWEEP, "--epochs", "2", "--executor", "debug", "--wait", C69_NAP_FORWARD="0.2")
    reached(tmp_path, "forward", proc)
    proc.kill()
    proc.wait(30)
    again = flctl(tmp_path, *SWEEP, "--epochs", "2", "--executor", "debug", "--wait")
    assert again.returncode == 0, again.stdout + again.stderr
    assert {r["status"] for r in rows(tmp_path)} == {"completed"}, rows(tmp_path)


@pytest.mark.parametrize("where", ["data", "build", "forward"])
def test_a_sweep_whose_task_raises_exits_3_with_one_line_per_error(tmp_path: Path, where: str) -> None:
    """Cases 28-30: a task raising in data/build/forward under `sweep --wait`: exit 3, the error counted once."""
    res = flctl(tmp_path, *SWEEP, "--epochs", "2", "--executor", "debug", "--wait", C69_FAIL=where)
    clean_end(res.stdout, res.stderr)
    assert res.returncode == 3 and f"2 × ValueError: planted failure in {where}" in res.stdout, res.stdout + res.stderr
    assert {r["status"] for r in rows(tmp_path)} == {"failed"}


def test_one_cell_raising_in_a_group_fails_it_alone(tmp_path: Path) -> None:
    """Case 31: two cells in one worker's group, one raises mid-epoch: it fails, its sibling completes."""
    res = flctl(tmp_path, *SWEEP, "--epochs", "2", "--workers", "1", "--batch-runs", "2", "--wait",
                C69_FAIL="forward", C69_SEEDS="1")
    clean_end(res.stdout, res.stderr)
    assert res.returncode == 3, res.stdout + res.stderr
    assert sorted((r["seed"], r["status"]) for r in rows(tmp_path)) == [(0, "completed"), (1, "failed")]


# ---------------------------------------------------------------- pipes and closed or full streams

@pytest.fixture(scope="module")
def done(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("done")
    res = in_process("sweep", "two-moons", "-m", "erm", "--epochs", "2", "--seeds", "3", "--executor", "debug",
                     "--wait", "--results-dir", str(root))
    assert res.returncode == 0, res.stderr
    return root, json.loads(in_process("runs", "--json", "--results-dir", str(root)).stdout)[0]["id"]


PIPED = [
    (["sweeps"], "pipe", 0), (["runs", "--json"], "pipe", 0), (["sweep", "two-moons", "--seeds", "3", "--dry-run"],
                                                              "pipe", 0),
    (["status", "--json"], "closed", 0), (["verify"], "full", 0), (["tasks"], "full", 0), (["methods"], "closed", 0),
    (["show", "nosuchrun"], "closed", 2), (["run", "nosuchtask"], "full", 2), (["runs", "--status", "bogus"], "pipe", 2),
]


@pytest.mark.parametrize("args,mode,code", PIPED, ids=[f"{' '.join(a[:2])}-{m}" for a, m, _ in PIPED])
def test_a_cut_closed_or_full_stdout_for_other_commands(done, tmp_path: Path, args: list[str], mode: str,
                                                        code: int) -> None:
    """Cases 32-41: commands test_streams_signals does not walk, and bad input, through | head -1, >&-, > /dev/full:
    the code of the work, no traceback; bad input's line still reaches stderr."""
    import shutil

    root = tmp_path / "results"
    shutil.copytree(done[0], root)
    where = [] if args[0] in ("tasks", "methods") else ["--results-dir", str(root)]
    proc = shell([*args, *where], mode, tmp_path / "head")
    _, err = proc.communicate(120)
    clean_end("", err)
    assert proc.returncode == code, (proc.returncode, err)
    if code == 2:
        assert err.strip().startswith("error:"), err


def test_a_closed_stderr_does_not_stop_training(tmp_path: Path) -> None:
    """Case 42: `flctl run ... 2>&-`: the run trains to completed, exit 0."""
    code = ("import os, runpy, sys\nos.close(2)\nsys.stderr = None\n"
            f"sys.argv = ['flctl', *{[*RUN, '--epochs', '2']!r}]\nrunpy.run_module('flctl', run_name='__main__')")
    proc = warm.Popen([sys.executable, "-c", code], stdout=warm.PIPE, env=env_of(tmp_path), cwd=str(tmp_path))
    proc.communicate(180)
    assert proc.returncode == 0 and rows(tmp_path)[0]["status"] == "completed", (proc.returncode, rows(tmp_path))


def test_a_run_through_head_then_sighup(tmp_path: Path) -> None:
    """Case 43: `flctl run ... | head -1` whose terminal then closes (SIGHUP): 129, checkpointed and handed back."""
    code = ("import os, runpy, subprocess, sys\n"
            "head = subprocess.Popen(['head', '-1'], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)\n"
            "os.dup2(head.stdin.fileno(), 1)\nhead.stdin.close()\nsys.stdout = open(1, 'w', closefd=False)\n"
            f"sys.argv = ['flctl', *{[*RUN, '--epochs', '40']!r}]\nrunpy.run_module('flctl', run_name='__main__')")
    proc = warm.Popen([sys.executable, "-c", code], stderr=warm.PIPE, env=env_of(tmp_path, C69_NAP_FORWARD="0.03"),
                      cwd=str(tmp_path))
    deadline = time.monotonic() + 180
    while not any((tmp_path / "results" / "records").glob("*/*.parquet")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate(5)
        time.sleep(0.05)
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(120)
    clean_end("", err)
    assert proc.returncode == 129 and rows(tmp_path)[0]["status"] == "interrupted", (proc.returncode, err)


# ---------------------------------------------------------------- damaged files and foreign state

def completed_db(tmp: Path) -> Path:
    from tests.test_foreign_state import completed

    db = tmp / "results" / "flctl.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    completed(f"sqlite:///{db}", config("two-moons", "erm", epochs=1))
    return db


@pytest.mark.parametrize("damage", ["garbage", "truncated", "directory", "newer-sweeps", "newer-show"])
def test_a_damaged_or_foreign_database_file_is_one_line(tmp_path: Path, damage: str) -> None:
    """Cases 44-48: flctl.db of random bytes, cut in half, a directory; a newer flctl's database read by `sweeps`
    and `show` (commands test_foreign_state does not walk)."""
    db = completed_db(tmp_path)
    args = ["runs"]
    if damage == "garbage":
        db.write_bytes(os.urandom(8192))
    elif damage == "truncated":
        db.write_bytes(db.read_bytes()[: db.stat().st_size // 2])
    elif damage == "directory":
        db.unlink()
        db.mkdir()
    else:
        with sqlite3.connect(db) as conn:
            conn.execute("UPDATE flctl_alembic_version SET version_num = '0099'")
        args = ["sweeps"] if damage == "newer-sweeps" else ["show", "0"]
    res = in_process(*args, "--results-dir", str(tmp_path / "results"))
    line = one_line(res, 1, 2)
    if damage.startswith("newer"):
        assert "newer than this flctl" in line, line


def test_a_zero_byte_database_file_names_migrate(tmp_path: Path) -> None:
    """Case 49: `touch results/flctl.db` then `flctl runs`: one line naming `flctl migrate`, nothing written."""
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "flctl.db").touch()
    res = in_process("runs", "--results-dir", str(tmp_path / "results"))
    assert "flctl migrate" in one_line(res, 2)
    assert (tmp_path / "results" / "flctl.db").stat().st_size == 0


def test_a_damaged_row_status_is_one_line_for_runs_and_status(tmp_path: Path) -> None:
    """Case 50: a row whose status is not one flctl knows (another tool's write): one line, no traceback."""
    db = completed_db(tmp_path)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE runs SET status = 'bogus'")
    for args in (["runs"], ["status"]):
        res = in_process(*args, "--results-dir", str(tmp_path / "results"))
        clean_end(res.stdout, res.stderr)
        assert res.returncode in (0, 1, 2) and len(res.stderr.strip().splitlines()) <= 1, res.stderr


def test_a_damaged_checkpoint_of_an_interrupted_run(tmp_path: Path) -> None:
    """Case 51: a run interrupted mid-training, its checkpoint.pt overwritten with garbage, then `flctl run` again:
    one line, or trained afresh; never a traceback."""
    proc = start(tmp_path, *RUN, "--epochs", "40", C69_NAP_FORWARD="0.03")
    reached(tmp_path, "forward", proc)
    time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(120)
    [row] = rows(tmp_path)
    ckpt = tmp_path / "results" / "runs" / row["id"] / "checkpoint.pt"
    assert row["status"] == "interrupted" and ckpt.exists(), row
    ckpt.write_bytes(b"not a checkpoint" * 10)
    again = flctl(tmp_path, *RUN, "--epochs", "40")
    clean_end(again.stdout, again.stderr)
    assert again.returncode == 0 and "cannot be loaded" in one_line(again, 0), again.stderr   # moved aside, afresh
    assert rows(tmp_path)[0]["status"] == "completed"


def test_a_damaged_record_file_is_found_by_verify_and_refused_by_readers(done, tmp_path: Path) -> None:
    """Case 52: a parquet record overwritten: verify exits 1 naming it; api.records refuses in its one error."""
    import shutil

    from flctl.errors import ConfigError

    root = tmp_path / "results"
    shutil.copytree(done[0], root)
    victim = next((root / "records" / f"run_id={done[1]}").glob("epoch=*.parquet"))
    victim.write_bytes(b"PAR1garbagePAR1")
    res = in_process("verify", done[1], "--results-dir", str(root))
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stdout + res.stderr
    with pytest.raises((ConfigError, OSError, ValueError)) as raised:
        api.records([done[1]], results_dir=root)
    assert "verify" in str(raised.value) or "flctl" in str(raised.value), raised.value


def test_a_damaged_study_attribute_is_a_warning_on_the_next_launch(tmp_path: Path) -> None:
    """Case 53: the Optuna study's grid attribute overwritten with broken JSON, then the sweep launched again."""
    root = tmp_path / "results"
    grid = ["sweep", "two-moons", "-m", "erm", "--lr", "0.01,0.1", "--epochs", "1", "--executor", "debug", "--wait",
            "--results-dir", str(root)]
    assert in_process(*grid).returncode == 0
    with sqlite3.connect(root / "flctl.db") as conn:
        conn.execute("UPDATE study_user_attributes SET value_json = '{broken'")
    res = in_process(*grid, "--seeds", "2")
    clean_end(res.stdout, res.stderr)
    assert res.returncode == 0, res.stdout + res.stderr


def test_a_direction_other_than_the_studys_is_refused_through_the_cli(tmp_path: Path) -> None:
    """Case 54: `flctl sweep --direction max` of a grid first swept with the default direction: one line, exit 2,
    nothing written."""
    root = tmp_path / "results"
    grid = ["sweep", "two-moons", "-m", "erm", "--lr", "0.01,0.1", "--epochs", "1", "--executor", "debug", "--wait",
            "--results-dir", str(root), "--objective", "test.accuracy"]
    assert in_process(*grid, "--direction", "min").returncode == 0
    before = (root / "flctl.db").read_bytes()
    one_line(in_process(*grid, "--direction", "max"), 2)
    assert (root / "flctl.db").read_bytes() == before


# ---------------------------------------------------------------- bad input, as a new user types it

def test_a_key_twice_in_a_sweep_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    """Case 55: `flctl sweep -o n_train=100 -o n_train=200`: one line, exit 2, no results folder."""
    res = in_process("sweep", "two-moons", "-o", "n_train=100", "-o", "n_train=200", "--epochs", "1",
                     "--results-dir", str(tmp_path / "r"))
    one_line(res, 2)
    assert not (tmp_path / "r").exists()


def test_an_upper_case_method_in_a_sweep_and_in_api_runs(tmp_path: Path) -> None:
    """Case 56: `flctl sweep -m ERM,FL --dry-run` and api.runs(method='ERM') read as erm,fl."""
    res = in_process("sweep", "two-moons", "-m", "ERM,FL", "--epochs", "1", "--dry-run",
                     "--results-dir", str(tmp_path / "r"))
    assert res.returncode == 0, res.stderr
    completed_db(tmp_path)
    assert len(api.runs(method="ERM", results_dir=tmp_path / "results")) == 1


def test_a_read_only_url_through_the_api(tmp_path: Path) -> None:
    """Case 57: api.run against `sqlite:///...?mode=ro`: refused before training, the file unchanged."""
    from flctl.errors import StoreError

    db = completed_db(tmp_path)
    before = db.read_bytes()
    with pytest.raises(StoreError, match="read-only"):
        api.run("two-moons", "erm", epochs=2, db=f"sqlite:///{db}?mode=ro", results_dir=tmp_path / "results")
    assert db.read_bytes() == before and not (tmp_path / "results" / "runs").exists()


def test_a_newer_database_through_the_api(tmp_path: Path) -> None:
    """Case 58: api.runs and api.run of a newer flctl's database: a StoreError naming the upgrade."""
    from flctl.errors import StoreError

    db = completed_db(tmp_path)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE flctl_alembic_version SET version_num = '0099'")
    for call in (lambda: api.runs(results_dir=tmp_path / "results"),
                 lambda: api.run("two-moons", "erm", epochs=1, results_dir=tmp_path / "results")):
        with pytest.raises(StoreError, match="newer"):
            call()


def test_a_task_raising_through_the_api_is_raised_as_is_and_recorded(tmp_path: Path, clean_plugins) -> None:
    """Case 59: api.run of a task raising in forward: its ValueError, the run failed."""
    env_of(tmp_path)
    os.environ["C69_FAIL"] = "forward"
    try:
        api.use_tasks(tmp_path / "campaign_moons.py")
        with pytest.raises(ValueError, match="planted failure in forward"):
            api.run("campaign-moons", "fl", epochs=1, results_dir=tmp_path / "results",
                    options={"n_train": 200})
    finally:
        del os.environ["C69_FAIL"]
    assert [r.status for r in api.runs(results_dir=tmp_path / "results")] == ["failed"]


def test_a_dry_run_against_a_stopped_server(tmp_path: Path) -> None:
    """Case 60: a dry run against a PostgreSQL whose server is gone says it cannot reach it (not 'not trained
    yet')."""
    gone = "postgresql://flctl@127.0.0.1:1/flctl"
    line = one_line(in_process("sweep", "two-moons", "--epochs", "1", "--dry-run", "--db", gone), 2)
    assert "cannot reach" in line


# ---------------------------------------------------------------- the database server gone mid-run

@pytest.fixture
def own_server(tmp_path: Path):
    """A throwaway PostgreSQL of this test's own (.ci/postgres.sh), on a port of its own, stopped at the end."""
    if not any(Path("/usr/lib/postgresql").glob("*/bin")) or os.geteuid() != 0:
        pytest.skip("needs Debian's postgresql package and root (runuser)")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import tempfile

    where = Path(tempfile.mkdtemp(prefix="c69-pg-", dir="/tmp")) / "pg"     # the postgres user must reach it
    where.parent.chmod(0o755)
    env = {**os.environ, "FLCTL_PG_PORT": str(port)}
    up = subprocess.run(["bash", str(ROOT / ".ci" / "postgres.sh"), str(where)], env=env, capture_output=True,
                        text=True, timeout=120)
    assert up.returncode == 0, up.stderr
    yield f"postgresql://postgres@127.0.0.1:{port}/flctl", where, env
    subprocess.run(["bash", str(ROOT / ".ci" / "postgres.sh"), "stop", str(where)], timeout=120)
    subprocess.run(["rm", "-rf", str(where.parent)], timeout=60)


def test_the_server_stopped_mid_run_then_back(tmp_path: Path, own_server) -> None:
    """Case 61: the PostgreSQL server stops while `flctl run` trains: exit 1 in a line, what was recorded kept;
    `flctl runs` meanwhile is one line; the server back, the same command finishes the run."""
    url, where, env = own_server
    proc = start(tmp_path, *RUN, "--epochs", "30", "--db", url, C69_NAP_FORWARD="0.05")
    reached(tmp_path, "forward", proc)
    time.sleep(1)
    subprocess.run(["bash", str(ROOT / ".ci" / "postgres.sh"), "stop", str(where)], timeout=120, check=True)
    out, err = proc.communicate(240)
    clean_end(out, err)
    assert proc.returncode == 1, (proc.returncode, err)
    one_line(in_process("runs", "--db", url), 1, 2)
    subprocess.run(["bash", str(ROOT / ".ci" / "postgres.sh"), str(where)], env=env, timeout=120, check=True)
    again = flctl(tmp_path, *RUN, "--epochs", "30", "--db", url)
    assert again.returncode == 0, again.stdout + again.stderr
    assert [r["status"] for r in json.loads(in_process("runs", "--json", "--db", url).stdout)] == ["completed"]



# ---------------------------------------------------------------- inputs read two ways (found in the campaign)

@pytest.mark.parametrize("twice", [["-m", "fl", "-m", "erm"], ["--lr", "0.1", "--lr", "0.2"]], ids=["method", "lr"])
def test_a_sweep_axis_given_twice_is_refused_or_swept(tmp_path: Path, twice: list[str]) -> None:
    """Cases 62-63: `flctl sweep -m fl -m erm` / `--lr 0.1 --lr 0.2 --dry-run`: one line exit 2, or both swept."""
    res = in_process("sweep", "two-moons", *twice, "--epochs", "1", "--dry-run", "--results-dir", str(tmp_path / "r"))
    assert (res.returncode == 2 and "twice" in res.stderr) or "2 runs" in res.stdout, res.stdout[-300:] + res.stderr


def test_the_same_value_written_two_ways_and_an_upper_case_key_are_one_line(tmp_path: Path) -> None:
    """Cases 64-65: `-o n_train=200 -o n_train=0200` (refused: written two ways) and `-o N_TRAIN=200` (unknown)."""
    for options in (["-o", "n_train=200", "-o", "n_train=0200"], ["-o", "N_TRAIN=200"]):
        one_line(in_process("run", "two-moons", *options, "--dry-run", "--results-dir", str(tmp_path / "r")), 2)
    assert not (tmp_path / "r").exists()


def test_a_sweep_name_that_is_another_sweeps_id_prefix_is_refused_at_launch(tmp_path: Path) -> None:
    """Case 66: `flctl sweep --name <the start of another sweep's id>`: refused at launch, or usable after."""
    root = str(tmp_path / "r")
    assert in_process("sweep", "two-moons", "-m", "erm", "--epochs", "1", "--executor", "debug", "--wait",
                      "--results-dir", root).returncode == 0
    first = json.loads(in_process("sweeps", "--json", "--results-dir", root).stdout)[0]["id"]
    named = in_process("sweep", "two-moons", "-m", "fl", "--epochs", "1", "--dry-run", "--name", first[:5],
                       "--results-dir", root)
    if named.returncode == 2:
        return
    assert in_process("sweep", "two-moons", "-m", "fl", "--epochs", "1", "--executor", "debug", "--wait", "--name",
                      first[:5], "--results-dir", root).returncode == 0
    assert in_process("status", first[:5], "--results-dir", root).returncode == 0


def test_a_task_name_in_upper_case_is_read_alike_by_run_and_runs(tmp_path: Path) -> None:
    """Case 67: `flctl run TWO-MOONS --dry-run` works; so must `flctl runs --task TWO-MOONS`."""
    completed_db(tmp_path)
    assert in_process("run", "TWO-MOONS", "--epochs", "1", "--dry-run").returncode == 0
    res = in_process("runs", "--task", "TWO-MOONS", "--json", "--results-dir", str(tmp_path / "results"))
    assert res.returncode == 0 and len(json.loads(res.stdout)) == 1, res.stderr


def test_migrate_of_an_up_to_date_read_only_url_says_so(tmp_path: Path) -> None:
    """Case 68: `flctl migrate --db sqlite:///...?mode=ro` of an up-to-date database: up to date, nothing written."""
    db = completed_db(tmp_path)
    before = db.read_bytes()
    res = in_process("migrate", "--db", f"sqlite:///{db}?mode=ro")
    assert res.returncode == 0 and "up to date" in res.stdout and db.read_bytes() == before, res.stderr


def test_status_watch_stopped_by_sighup_says_so(tmp_path: Path) -> None:
    """Case 69: `flctl status --watch` of a sweep training, its terminal closed (SIGHUP): 129, no traceback, and the
    sweep's own cells go on (the watch owns none)."""
    sweep = start(tmp_path, *SWEEP, "--epochs", "30", "--workers", "1", C69_NAP_FORWARD="0.05")
    assert sweep.wait(240) == 0, sweep.communicate(5)
    reached(tmp_path, "forward")
    watch = start(tmp_path, "status", "--watch")
    time.sleep(2)
    watch.send_signal(signal.SIGHUP)
    out, err = watch.communicate(60)
    clean_end(out, err)
    assert watch.returncode == 129, (watch.returncode, err)
    assert any(r["status"] in ("running", "queued", "completed") for r in rows(tmp_path))
    sid = json.loads(in_process("sweeps", "--json", "--results-dir", str(tmp_path / "results")).stdout)[0]["id"]
    in_process("cancel", sid, "--results-dir", str(tmp_path / "results"))


def test_cancel_of_a_sweep_whose_worker_is_frozen(tmp_path: Path) -> None:
    """Case 70: `flctl cancel SWEEP --timeout 3` while the sweep's worker is frozen (SIGSTOP): it ends within the
    timeout and a bit, the worker gone, no cell left running."""
    from flctl.procs import pid_alive
    from tests.test_sweep_neighbours import freeze_outside_a_write

    sweep = start(tmp_path, *SWEEP, "--epochs", "200", "--workers", "1", C69_NAP_FORWARD="0.02")
    assert sweep.wait(240) == 0, sweep.communicate(5)
    reached(tmp_path, "forward")
    db = tmp_path / "results" / "flctl.db"
    with sqlite3.connect(db) as conn:
        [pid] = {p for (p,) in conn.execute("SELECT pid FROM runs WHERE status = 'running'")}
    freeze_outside_a_write(pid, db)
    sid = json.loads(in_process("sweeps", "--json", "--results-dir", str(tmp_path / "results")).stdout)[0]["id"]
    began = time.monotonic()
    res = flctl(tmp_path, "cancel", sid, "--timeout", "3")
    clean_end(res.stdout, res.stderr)
    assert res.returncode == 0 and time.monotonic() - began < 60, (res.returncode, res.stdout, res.stderr)
    deadline = time.monotonic() + 30
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if pid_alive(pid):
        os.kill(pid, signal.SIGKILL)
        pytest.fail("the frozen worker outlived cancel")
    assert not [r for r in rows(tmp_path) if r["status"] == "running"], rows(tmp_path)


def test_migrate_makes_a_new_sqlite_file_an_operator_names(tmp_path: Path) -> None:
    """Case 71: an operator's `flctl migrate --db sqlite:///shared/flctl.db` before starting workers: the schema made,
    `flctl runs` then says no runs yet."""
    url = f"sqlite:///{tmp_path / 'flctl.db'}"
    res = in_process("migrate", "--db", url)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "no runs yet" in in_process("runs", "--db", url).stdout


def test_migrate_of_a_missing_folder_is_one_line(tmp_path: Path) -> None:
    """Case 72: `flctl migrate --db sqlite:///<missing folder>/x.db`: one line, exit 2, no folder made."""
    one_line(in_process("migrate", "--db", f"sqlite:///{tmp_path / 'no' / 'such' / 'x.db'}"), 2)
    assert not (tmp_path / "no").exists()


@pytest.fixture
def one_run(tmp_path: Path) -> tuple[Path, str]:
    root = tmp_path / "results"
    assert in_process("run", "two-moons", "-m", "erm", "--epochs", "2", "-o", "n_train=200",
                      "--results-dir", str(root)).returncode == 0
    return root, json.loads(in_process("runs", "--json", "--results-dir", str(root)).stdout)[0]["id"]


def test_reproduce_of_a_run_whose_records_are_gone_refuses_before_training(one_run) -> None:
    """Case 73: a run's records folder deleted, then `flctl reproduce RUN`: one line, before any training."""
    import shutil

    root, run_id = one_run
    shutil.rmtree(root / "records" / f"run_id={run_id}")
    res = in_process("reproduce", run_id, "--results-dir", str(root))
    assert "no records" in one_line(res, 2) and "starting (data, model)" not in res.stdout, res.stdout


def test_a_row_with_broken_json_is_named(one_run) -> None:
    """Case 74: one run's metrics column overwritten with broken JSON: the line names that run (or it reads as
    unknown with a warning, issue 69's 'damaged rows')."""
    root, run_id = one_run
    with sqlite3.connect(root / "flctl.db") as conn:
        conn.execute("UPDATE runs SET metrics = '{broken'")
    res = in_process("runs", "--results-dir", str(root))
    clean_end(res.stdout, res.stderr)
    assert res.returncode == 0 or run_id in res.stderr, res.stderr


def test_show_and_verify_of_a_run_whose_records_are_gone(one_run) -> None:
    """Case 75: records deleted: `show` still shows the row (exit 0); `verify` exits 1 naming the command that
    trains it again."""
    import shutil

    root, run_id = one_run
    shutil.rmtree(root / "records" / f"run_id={run_id}")
    assert in_process("show", run_id, "--results-dir", str(root)).returncode == 0
    res = in_process("verify", run_id, "--results-dir", str(root))
    assert res.returncode == 1 and "--rerun" in res.stdout, res.stdout + res.stderr
