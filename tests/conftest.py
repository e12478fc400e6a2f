from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
# A database, results folder or plugin list the developer's shell names is never the tests': dropped at session start, before
# module- and session-scoped fixtures (the populated folder of test_bad_input) run, which _isolate_env comes too
# late for.
for _name in ("FLCTL_DB", "FLCTL_RESULTS", "FLCTL_TASKS"):
    os.environ.pop(_name, None)
# huggingface_hub reads these once, at import: set them before any test imports it.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """A fresh results directory; its SQLite database is results/flctl.db."""
    root = tmp_path / "results"
    return root


@pytest.fixture(autouse=True)
def _isolate_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Tests never touch the checkout's results/ or a database named in the developer's environment.
    monkeypatch.delenv("FLCTL_DB", raising=False)
    monkeypatch.setenv("FLCTL_RESULTS", str(tmp_path / "results"))
