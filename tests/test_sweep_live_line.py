"""`flctl sweep --wait` in a terminal, as a person sees it: a live line (cells done of all, running, the time left)
redrawn in place while the command's own worker trains, and left whole when the wait ends: the sweep done, Ctrl-C,
SIGTERM, or the terminal gone. Each command runs under a real pseudo-terminal (pty.fork); what it drew is played
into a small terminal (``screen``) and read off it. Piped, the 30 s lines are unchanged (tests/test_failures_told.py,
tests/test_streams_signals.py)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests import warm
from tests.helpers import in_process, pty_child

# `flctl *ARGS` in a pseudo-terminal of its own, 150 columns wide; what it draws is read into OUT. ACT, once a cell has
# trained an epoch (RECORDS exist) and the line has been drawn: "ctrl-c" types it, "sigterm" sends it, "hangup"
# closes the terminal (SIGHUP); "" lets the sweep end. Exits with the command's exit code.
DRIVER = """import atexit, glob, os, pty, runpy, select, signal, sys, time
signal.signal(signal.SIGHUP, signal.SIG_DFL)
""" + pty_child({"COLUMNS": "150", "LINES": "40", "TERM": "xterm"}) + """out, acted, deadline = b'', False, time.monotonic() + 300
while time.monotonic() < deadline:
    if ACT and not acted and glob.glob(RECORDS) and out.count(b' done ') >= 2:
        acted = True
        if ACT == 'hangup':
            break
        os.write(master, b'\\x03') if ACT == 'ctrl-c' else os.kill(pid, signal.SIGTERM)
    if select.select([master], [], [], 0.05)[0]:
        try:
            chunk = os.read(master, 65536)
        except OSError:                          # it ended: no one holds the terminal's other side
            break
        if not chunk:
            break
        out += chunk
open(OUT, 'wb').write(out)
os.close(master)
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""
CSI = re.compile(r"\x1b\[([?0-9;]*)([A-Za-z])")
# the live line: `sweep SID: 1/3 done · 2 running · [...] · M:SS`
LINE = re.compile(r"^sweep (\w+): (\d+)/(\d+) done · (\d+) running( · .*)? · \d+:\d\d$")


def screen(raw: str) -> tuple[list[str], bool]:
    """What a terminal shows once ``raw`` is written to it: its lines, and whether the cursor is shown. It knows what
    rich draws with (colours, erase line, cursor up, cursor shown or hidden); any other sequence fails the test."""
    lines: list[list[str]] = [[]]
    row = col = 0
    shown, i = True, 0
    while i < len(raw):
        if m := CSI.match(raw, i):
            arg, op = m.groups()
            if op == "K" and arg == "2":
                lines[row] = []
            elif op == "A":
                row = max(0, row - int(arg or 1))
            elif arg == "?25" and op in "lh":
                shown = op == "h"
            elif op != "m":
                raise AssertionError(f"an escape sequence this terminal does not know: {m.group(0)!r}")
            i = m.end()
            continue
        ch, i = raw[i], i + 1
        if ch == "\r":
            col = 0
        elif ch == "\n":
            row += 1
            lines += [[] for _ in range(row + 1 - len(lines))]
        else:
            line = lines[row]
            line += [" "] * (col + 1 - len(line))
            line[col], col = ch, col + 1
    return ["".join(line).rstrip() for line in lines], shown


def in_a_terminal(tmp_path: Path, args: list[str], act: str = "") -> tuple[int, str]:
    out = tmp_path / "drawn.bin"
    code = (DRIVER.replace("ARGS", repr(["flctl", *args, "--results-dir", str(tmp_path / "results")]))
            .replace("RECORDS", repr(str(tmp_path / "results" / "records" / "run_id=*" / "epoch=*.parquet")))
            .replace("OUT", repr(str(out))).replace("ACT", repr(act)))
    proc = warm.Popen([sys.executable, "-c", code], stdout=warm.PIPE, stderr=warm.STDOUT)
    said, _ = proc.communicate(timeout=400)
    assert out.exists(), said
    return proc.returncode, out.read_bytes().decode()


def frames(raw: str) -> list[re.Match]:
    """Every live line drawn, in order (each frame is drawn after a carriage return or an erased line)."""
    plain = CSI.sub(lambda m: "\n" if m.group(2) == "K" else "", raw)
    return [m for part in re.split(r"[\r\n]", plain) if (m := LINE.match(part))]


@pytest.mark.slow
def test_a_waiting_sweep_draws_a_live_line_and_leaves_it_whole_when_done(tmp_path: Path) -> None:
    code, raw = in_a_terminal(tmp_path, ["sweep", "two-moons", "--epochs", "40", "--seeds", "3", "--workers", "1",
                                         "--wait"])
    assert code == 0, raw
    drawn = frames(raw)
    assert len(drawn) >= 2, raw                      # redrawn while it trained, not printed once at the end
    assert {m.group(3) for m in drawn} == {"3"}      # every frame counts the sweep's 3 cells
    done = [int(m.group(2)) for m in drawn]
    assert done == sorted(done) and all(int(m.group(2)) + int(m.group(4)) <= 3 for m in drawn), done
    assert any(" left" in m.group(0) or "past the estimate" in m.group(0) for m in drawn[:-1]), drawn[0].group(0)
    lines, cursor_shown = screen(raw)
    live = [line for line in lines if LINE.match(line)]
    # one line on the screen, overwritten in place, finished: the sweep as it ended, then the ledger below it
    assert len(live) == 1 and LINE.match(live[0]).group(2, 3, 4) == ("3", "3", "0"), lines
    assert " left" not in live[0]
    assert cursor_shown and lines[lines.index(live[0]) + 1].strip().startswith("sweep "), lines


@pytest.mark.slow
@pytest.mark.parametrize(("act", "exit_code"), [("ctrl-c", 130), ("sigterm", 143), ("hangup", 129)])
def test_a_stopped_wait_leaves_the_live_line_whole_and_the_cell_handed_back(tmp_path: Path, act: str,
                                                                           exit_code: int) -> None:
    code, raw = in_a_terminal(tmp_path, ["sweep", "two-moons", "--epochs", "100000", "--seeds", "1", "--workers",
                                         "1", "--wait"], act)
    assert code == exit_code, raw
    [row] = json.loads(in_process("runs", "--json", "--results-dir", str(tmp_path / "results")).stdout)
    assert row["status"] == "interrupted" and row["epochs_done"] > 0, row
    if act == "hangup":                              # nothing more can be read of a terminal that is gone
        return
    assert "Traceback" not in raw
    lines, cursor_shown = screen(raw)
    live = [line for line in lines if LINE.match(line)]
    assert len(live) == 1 and LINE.match(live[0]).group(2, 3, 4) == ("0", "1", "0"), lines   # handed back
    after = lines[lines.index(live[0]) + 1:]
    assert cursor_shown and any(line.startswith("stopped: ") for line in after), lines


def counted(completed: int = 0, running: int = 0, failed: int = 0, queued: int = 0, cells: int = 10) -> dict:
    """A ledger (flctl.status.ledger's shape) of ``cells`` cells in these states."""
    from flctl.status import LEDGER_COLUMNS

    total = dict.fromkeys(LEDGER_COLUMNS, 0) | {"completed": completed, "running": running, "failed": failed,
                                                 "queued": queued}
    return {"total": total, "cells": cells}


def test_the_time_left_is_the_estimate_until_cells_end_then_their_pace() -> None:
    from flctl.cli.progress import SweepLine

    now = [100.0]
    line = SweepLine("sqlite:///unused.db", "abc", clock=lambda: now[0])
    line.data, line.first = counted(queued=10), (0, 10)
    line.pricing = True
    assert line.text() == "sweep abc: 0/10 done · 0 running · time left: estimating · 0:00"
    line.pricing, line.per_cell_s = False, 6.0                  # 10 cells x 6 s
    now[0] += 15
    assert line.text() == "sweep abc: 0/10 done · 0 running · about 45 s left · 0:15"
    now[0] += 60
    assert line.text() == "sweep abc: 0/10 done · 0 running · past the estimate of 60 s · 1:15"
    line.data = counted(completed=3, failed=1, running=2, queued=4)      # 4 ended in 75 s: 6 left, 112 s
    assert line.text() == "sweep abc: 3/10 done · 2 running · 1 failed · about 2 min left · 1:15"
    line.data, line.why = counted(completed=9, failed=1), "OperationalError"    # ended: no time left to tell
    assert line.text() == "sweep abc: 9/10 done · 0 running · 1 failed · the database cannot be read now " \
        "(OperationalError) · 1:15"
    unknown = SweepLine("sqlite:///unused.db", "abc", clock=lambda: now[0])
    unknown.data, unknown.first = counted(running=2, queued=8), (0, 10)
    assert "time left: known when a cell ends" in unknown.text()
