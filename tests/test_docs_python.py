"""docs/extending.md's "From Python" block, run as a reader runs it: a script beside a task file, in a fresh folder.
It must work as written and print what each step did (a block that prints nothing leaves a newcomer unsure it ran)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow       # a run, a 6-cell sweep and figure 1 at smoke scale: ~15 s

REPO = Path(__file__).resolve().parents[1]


def test_the_from_python_block_runs_and_says_what_it_did(tmp_path: Path) -> None:
    text = (REPO / "docs" / "extending.md").read_text()
    block = re.search(r"## From Python\n.*?```python\n(.*?)```", text, re.S).group(1)
    # the reader's task: two-moons under the name the block uses
    task = (REPO / "tasks" / "two_moons.py").read_text().replace('name="two-moons"', 'name="my-task"')
    (tmp_path / "my_task.py").write_text(task)
    (tmp_path / "script.py").write_text(block)
    res = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    said = res.stdout.splitlines()
    expected = [r"run [0-9a-f]{16}: completed, test max loss \d+\.\d{3}",
                r"\d+ train records of epochs \[5\]",
                r"1 completed run\(s\) of my-task",
                r"sweep ([0-9a-f]{12}) would train 6 cells \(a dry run: nothing written\)",
                r"sweep [0-9a-f]{12}: 6 of 6 cells completed",
                r"figure 1 \(smoke scale\): open .*index\.html"]
    assert len(said) == len(expected), res.stdout
    for line, pattern in zip(said, expected):
        assert re.fullmatch(pattern, line), (line, pattern)
    assert (tmp_path / "results" / "paper-smoke" / "index.html").is_file()
