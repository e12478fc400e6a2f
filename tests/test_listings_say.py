"""What a listing compares or picks, said where a person reads it: `flctl runs`' `differs` column names the runs it
compares, and `flctl status` without a sweep says that it shows the newest."""

from __future__ import annotations

import json
from pathlib import Path

from flctl.cli.runs import LOOK_ALIKE
from tests.helpers import in_process


def test_the_differs_column_says_which_runs_it_compares(results: Path) -> None:
    for lr in ("0.1", "0.2"):          # alike but for lr: the column tells them apart
        assert in_process("run", "two-moons", "--epochs", "1", "--lr", lr).returncode == 0
    shown = in_process("runs").stdout.splitlines()
    assert any("lr=0.1" in line for line in shown) and any("lr=0.2" in line for line in shown), shown
    note = next(line for line in shown if line.startswith("differs: "))
    assert note.endswith("with its task, method, ε, α and seed (blank: no such other)"), note
    assert list(LOOK_ALIKE) == ["task", "method", "ε", "α", "seed"]
    assert shown[-1] == "2 run(s)" and shown[-2] == note
    assert in_process("run", "two-moons", "--epochs", "1", "--seed", "3", "--results-dir",
                      str(results / "other")).returncode == 0
    alone = in_process("runs", "--results-dir", str(results / "other")).stdout       # no column, no note
    assert "differs" not in alone, alone


def test_status_without_a_sweep_says_it_shows_the_newest(results: Path) -> None:
    assert in_process("sweep", "two-moons", "--epochs", "1", "--executor", "debug", "--wait").returncode == 0
    first = in_process("status").stdout.splitlines()
    assert first[0] == "the only sweep in the database:", first
    assert in_process("sweep", "two-moons", "--epochs", "1", "--seeds", "2", "--executor", "debug",
                      "--wait").returncode == 0
    newest = json.loads(in_process("sweeps", "--json").stdout)[0]["id"]
    shown = in_process("status").stdout.splitlines()
    assert shown[0] == "the newest of 2 sweeps (`flctl sweeps` lists them; `flctl status SWEEP` shows another):"
    assert newest in shown[1], shown
    named = in_process("status", newest).stdout
    assert "newest" not in named and "only sweep" not in named          # one named: nothing to say of it
    assert json.loads(in_process("status", "--json").stdout)["sweep"] == newest      # JSON: only JSON
