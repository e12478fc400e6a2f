"""Signals and streams as a user's shell delivers them (flctl.shell): every command through a real pipe cut short
(`| head -1`), a closed stdout (`>&-`) and a full one (`> /dev/full`) ends with the exit code docs/reference.md's
table gives for its work, without a traceback, and a run trains to `completed` all the same; SIGHUP (the terminal
closed) stops `flctl run` and `flctl sweep --wait` as SIGTERM does: 129, checkpointed, handed back, no row left
running.

The matrix's processes are forked warm (tests/warm.py), each redirected as the shell would before flctl starts; a few
cases go through `bash -c` and a new interpreter as well. A terminal that really hangs up is a pseudo-terminal closed
under the session of the process it controls."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flctl.runner import stop_on_signals
from tests import warm
from tests.helpers import in_process, pty_child

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "reference.md"
FLCTL = [sys.executable, "-m", "flctl"]
TRAIN = ["two-moons", "--epochs", "2"]
# How the shell hands stdout over: a pipe whose reader reads one line and goes, closed, a full disk.
MODES = {"pipe": "| head -1", "closed": ">&-", "full": "> /dev/full"}
# The commands walked, each with what it reads or trains (RUN: the completed run of the fixture; `run` and `sweep`
# train afresh in a results folder of their own, so that they train under each mode).
COMMANDS = {
    "run": ["run", *TRAIN, "--seed", "7"],
    "sweep": ["sweep", *TRAIN, "--seeds", "2", "--workers", "1", "--wait"],
    "runs": ["runs"],
    "status": ["status"],
    "show": ["show", "RUN"],
    "reproduce": ["reproduce", "RUN"],
    "report": ["report", "--table", "runs"],
    "export": ["export", "RUN", "--to", "tensorboard"],
}
TRAINS = ("run", "sweep")
ENV = {k: v for k, v in os.environ.items() if k not in ("FLCTL_DB", "FLCTL_RESULTS")}


def documented_codes() -> dict[int, str]:
    """docs/reference.md's exit-code table: code -> meaning."""
    table = DOCS.read_text().split("**When something goes wrong.**", 1)[1].split("\n\n", 2)[1]
    codes: dict[int, str] = {}
    for row in table.splitlines()[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        for code in re.findall(r"\d+", cells[0]):
            codes[int(code)] = cells[1]
    return codes


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A results folder with a completed sweep of two two-moons runs, and one of its run ids."""
    root = tmp_path_factory.mktemp("trained")
    done = in_process("sweep", *TRAIN, "--seeds", "2", "--executor", "debug", "--wait", "--results-dir", str(root))
    assert done.returncode == 0, done.stderr
    return root, json.loads(in_process("runs", "--json", "--results-dir", str(root)).stdout)[0]["id"]


# Each mode as the shell makes it, done in the process before flctl starts (a warm fork: tests/warm.py), down to what
# a new interpreter makes of it: a real pipe into a real `head -1` (the line it reads goes to a file), fd 1 closed
# and no sys.stdout, fd 1 on /dev/full. test_the_shell_itself_gives_the_same runs a few through `bash -c`, unforked.
AS_THE_SHELL = {
    "pipe": ("import subprocess\n"
             "head = subprocess.Popen(['head', '-1'], stdin=subprocess.PIPE, stdout=open({head!r}, 'w'))\n"
             "os.dup2(head.stdin.fileno(), 1)\nhead.stdin.close()"),
    "closed": "os.close(1)",
    "full": "os.dup2(os.open('/dev/full', os.O_WRONLY), 1)",
}
START = ("import os, runpy, sys\n{redirect}\nsys.stdout = None if {closed} else open(1, 'w', closefd=False)\n"
         "sys.argv = ['flctl', *{args!r}]\nrunpy.run_module('flctl', run_name='__main__')")


def shell(args: list[str], mode: str, head: Path) -> warm.Popen:
    """`flctl *args` started with stdout as ``mode`` makes it (``head``: where `head -1` puts the line it reads)."""
    code = START.format(redirect=AS_THE_SHELL[mode].format(head=str(head)), closed=mode == "closed", args=args)
    return warm.Popen([sys.executable, "-c", code], stdout=warm.DEVNULL, stderr=warm.PIPE, cwd=head.parent, env=ENV)


@pytest.fixture(scope="module")
def matrix(trained: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], dict]:
    """Each command under each mode, three at a time: its exit code, stderr, what `head -1` read, its results folder.
    Started and polled from this thread only: multiprocessing's bookkeeping polls every child as one starts, and two
    threads reading one child's exit status get it once."""
    base, run_id = trained
    work = tmp_path_factory.mktemp("matrix")
    pending = sorted(((name, mode) for name in COMMANDS for mode in MODES), key=lambda c: c[0] not in TRAINS)
    running: dict[tuple[str, str], warm.Popen] = {}
    done: dict[tuple[str, str], dict] = {}
    while pending or running:
        while pending and len(running) < 3:          # the longest first
            name, mode = case = pending.pop(0)
            root = work / f"{name}-{mode}"
            if name not in TRAINS:                   # a copy of its own: export writes, and nothing else may meanwhile
                shutil.copytree(base, root)
            args = [run_id if a == "RUN" else a for a in COMMANDS[name]]
            running[case] = shell([*args, "--results-dir", str(root)], mode, root.with_suffix(".head"))
        for (name, mode), proc in list(running.items()):
            if proc.poll() is not None:
                _, err = proc.communicate()
                root = work / f"{name}-{mode}"
                head = root.with_suffix(".head")
                done[name, mode] = {"code": proc.returncode, "err": err, "root": root,
                                    "out": head.read_text() if head.exists() else ""}
                del running[name, mode]
        time.sleep(0.05)
    return done


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_cut_closed_or_full_stdout_leaves_the_exit_code_to_the_work(matrix: dict, name: str, mode: str) -> None:
    got = matrix[name, mode]
    said = f"{name} {MODES[mode]}: exit {got['code']}\n{got['err']}"
    assert "Traceback" not in got["err"] and "Exception ignored" not in got["err"], said
    assert got["code"] == 0 and got["code"] in documented_codes(), said      # the work succeeded: 0, as documented
    if mode == "pipe":
        assert len(got["out"].splitlines()) == 1, said
    lines = [line for line in got["err"].splitlines() if line.strip()]
    warned = [line for line in lines if "stdout could not be written" in line]
    if mode == "full":                     # output someone wanted was lost: one line says so, the code stands
        assert len(warned) == 1 and "(No space left on device)" in warned[0], said
    else:                                  # a reader that went away, or none: nothing was wanted, nothing to say
        assert not warned, said
    if name in TRAINS:
        rows = json.loads(in_process("runs", "--json", "--results-dir", str(got["root"])).stdout)
        assert rows and {r["status"] for r in rows} == {"completed"}, (said, rows)
        assert {r["epochs_done"] for r in rows} == {2}, rows


@pytest.mark.parametrize(("name", "mode"), [("show", "pipe"), ("runs", "closed"), ("status", "full")])
def test_the_shell_itself_gives_the_same(trained: tuple[Path, str], tmp_path: Path, name: str, mode: str) -> None:
    """A few of the cases above as a user types them: `bash -c`, a new interpreter, the shell's own redirection."""
    root = tmp_path / "results"
    if name not in TRAINS:
        shutil.copytree(trained[0], root)
    args = [trained[1] if a == "RUN" else a for a in COMMANDS[name]]
    line = " ".join([*FLCTL, *args, "--results-dir", str(root)])
    res = subprocess.run(["bash", "-c", f"{line} 2>{tmp_path / 'err'} {MODES[mode]}; exit ${{PIPESTATUS[0]}}"],
                         capture_output=True, text=True, timeout=300, env=ENV, cwd=tmp_path)
    err = (tmp_path / "err").read_text()
    assert res.returncode == 0 and "Traceback" not in err and "Exception ignored" not in err, (res.returncode, err)
    assert len(res.stdout.splitlines()) == (1 if mode == "pipe" else 0), res.stdout
    if name in TRAINS:
        assert [r["status"] for r in rows_of(root)] == ["completed"], rows_of(root)


def test_the_table_documents_every_code_a_command_exits_with() -> None:
    codes = documented_codes()
    assert {0, 1, 2, 3, 75, 129, 130, 143} <= set(codes), codes
    for signum in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        assert signum.name in codes[128 + signum], codes[128 + signum]


def started(root: Path) -> bool:
    """Whether a run under ``root`` has trained an epoch (its first records are written)."""
    return any((root / "records").glob("run_id=*/epoch=*.parquet"))


def rows_of(root: Path) -> list[dict]:
    return json.loads(in_process("runs", "--json", "--results-dir", str(root)).stdout)


def wait_until(what, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


# SIGHUP as a terminal leaves it to what it starts, whatever pytest's (`nohup pytest` ignores it, and flctl keeps it so)
DEFAULT_SIGHUP = "import signal\nsignal.signal(signal.SIGHUP, signal.SIG_DFL)\n"
# `flctl *ARGS` in a terminal of its own (pty.fork: a pseudo-terminal, the controlling terminal of the session the
# child leads), read until RECORDS exist, then closed: exit with the child's exit code.
IN_A_TERMINAL = DEFAULT_SIGHUP + """import atexit, glob, os, pty, runpy, select, sys, time
""" + pty_child() + """deadline = time.monotonic() + 120
while not glob.glob(RECORDS) and time.monotonic() < deadline:
    if select.select([master], [], [], 0.05)[0]:   # what it prints is read, so that the terminal never fills
        try:
            os.read(master, 65536)
        except OSError:                          # it ended: no one holds the terminal's other side
            break
os.close(master)                                 # the terminal closes: SIGHUP to its session's leader
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


def test_a_terminal_that_hangs_up_stops_a_run_checkpointed_and_handed_back(tmp_path: Path) -> None:
    """The terminal of `flctl run` closes: the kernel sends SIGHUP, and what is printed to the dead terminal fails
    (EIO) and is dropped; the run ends its epoch, checkpoints and is handed back, and flctl exits 129."""
    args = ["flctl", "run", "two-moons", "--epochs", "100000", "--results-dir", str(tmp_path)]
    code = IN_A_TERMINAL.replace("ARGS", repr(args)).replace("RECORDS", repr(str(tmp_path / "records/*/*.parquet")))
    proc = warm.Popen([sys.executable, "-c", code], stdout=warm.PIPE, stderr=warm.STDOUT, env=ENV)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 129, out
    [row] = rows_of(tmp_path)
    assert row["status"] == "interrupted" and row["attempts"] == 0 and row["epochs_done"] > 0, row
    import torch

    run_dir = tmp_path / "runs" / row["id"]
    assert torch.load(run_dir / "checkpoint.pt", weights_only=True)["epoch"] == row["epochs_done"]


def test_sighup_stops_a_waiting_sweep_with_one_line_and_no_cell_left_running(tmp_path: Path) -> None:
    args = ["flctl", "sweep", "two-moons", "--epochs", "100000", "--seeds", "1", "--workers", "1", "--wait",
            "--results-dir", str(tmp_path)]
    code = f"{DEFAULT_SIGHUP}import runpy, sys\nsys.argv = {args!r}\nrunpy.run_module('flctl', run_name='__main__')"
    proc = warm.Popen([sys.executable, "-c", code], stdout=warm.PIPE, stderr=warm.PIPE, env=ENV)
    wait_until(lambda: started(tmp_path) or proc.poll() is not None)
    proc.send_signal(signal.SIGHUP)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 129, (out, err)
    assert "Traceback" not in err and [line for line in err.splitlines() if line.startswith("stopped:")], err
    [row] = rows_of(tmp_path)
    assert row["status"] == "interrupted" and row["epochs_done"] > 0, row


def test_nohup_keeps_sighup_ignored_and_the_other_stop_signals_are_caught() -> None:
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with stop_on_signals() as stop:
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)
            assert not stop.is_set()
            os.kill(os.getpid(), signal.SIGTERM)
            assert stop.is_set() and stop.exit_code == 143
        signal.signal(signal.SIGHUP, lambda *_: None)     # not SIG_DFL: a SIGHUP not caught must not end pytest
        with stop_on_signals() as stop:
            os.kill(os.getpid(), signal.SIGHUP)
            assert stop.is_set() and stop.exit_code == 129
    finally:
        signal.signal(signal.SIGHUP, before)
