"""Shell completion as a shell asks for it: the installed `flctl` run with click's completion variables
(_FLCTL_COMPLETE=complete_bash, COMP_WORDS, COMP_CWORD), one candidate a line on stdout, nothing on stderr."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FLCTL = shutil.which("flctl", path=str(Path(sys.executable).parent)) or "flctl"


def completed(words: str, tmp_path: Path, **env: str) -> list[str]:
    """The candidates bash gets for the last word of ``words`` (a trailing space: a new, empty word)."""
    shown = {**{k: v for k, v in os.environ.items() if k != "FLCTL_TASKS"}, **env, "_FLCTL_COMPLETE": "complete_bash",
             "COMP_WORDS": words, "COMP_CWORD": str(len(words.split(" ")) - 1)}
    res = subprocess.run([FLCTL], env=shown, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stderr == "", res.stderr
    return res.stdout.split()


@pytest.mark.notorch
def test_task_names_include_the_plugin_tasks_flctl_tasks_names(tmp_path: Path) -> None:
    """A task file named by FLCTL_TASKS is completed by its TASK's name (not the file's), beside flctl's own; a
    FLCTL_TASKS entry that is not there completes flctl's own and says nothing in the middle of the line."""
    task = (REPO / "tasks" / "two_moons.py").read_text().replace('name="two-moons"', 'name="lab-moons"')
    (tmp_path / "my_lab.py").write_text(task)
    assert completed("flctl run ", tmp_path, FLCTL_TASKS=str(tmp_path / "my_lab.py")) == sorted(
        ["cifar10", "diabetes", "digits", "fashion-mnist", "lab-moons", "orca-dpo", "polyfit", "two-moons", "utkface"])
    assert completed("flctl sweep la", tmp_path, FLCTL_TASKS=str(tmp_path / "my_lab.py")) == ["lab-moons"]
    assert completed("flctl run t", tmp_path, FLCTL_TASKS=str(tmp_path / "gone.py")) == ["two-moons"]


@pytest.mark.notorch
def test_trackers_are_completed_after_to_and_log_to(tmp_path: Path) -> None:
    assert completed("flctl export abc --to ", tmp_path) == ["tensorboard", "mlflow", "wandb"]
    assert completed("flctl export abc --to m", tmp_path) == ["mlflow"]
    assert completed("flctl run two-moons --log-to w", tmp_path) == ["wandb"]


def test_sweep_and_paper_complete_their_tracker_after_log_to(tmp_path: Path) -> None:
    assert completed("flctl sweep two-moons --log-to m", tmp_path) == ["mlflow"]
    assert completed("flctl paper --log-to t", tmp_path) == ["tensorboard"]
