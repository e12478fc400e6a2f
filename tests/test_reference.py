"""Records of the CPU tasks stay bit-identical to those written down before the engine rework (tests/reference.py):
same run ids, same metrics, the same value in every Parquet cell; and a checkpoint written by that code resumes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from flctl.train import train, train_together
from tests.helpers import config
from tests.reference import (
    CASES,
    KERNEL_DEPENDENT,
    LAYOUT,
    OLD_CHECKPOINT,
    OLD_CHECKPOINT_CASE,
    REFERENCE,
    digest,
    together_configs,
    train_case,
)

EXPECTED = json.loads(REFERENCE.read_text())


@pytest.mark.parametrize("name,task,method,overrides", CASES, ids=[c[0] for c in CASES])
def test_records_equal_the_reference(tmp_path: Path, name: str, task: str, method: str, overrides: dict) -> None:
    cfg, result = train_case(tmp_path, task, method, overrides)
    want = EXPECTED[name]
    assert cfg.run_id == want["run_id"]
    assert result.status == want["status"]
    if task in KERNEL_DEPENDENT:
        assert result.metrics == pytest.approx(want["metrics"], abs=KERNEL_DEPENDENT[task])
        assert digest(tmp_path / "records", cfg.run_id, LAYOUT) == want["layout"]
    else:
        assert result.metrics == want["metrics"]
        assert digest(tmp_path / "records", cfg.run_id) == want["records"]


def test_cells_trained_together_equal_the_reference(tmp_path: Path) -> None:
    cfgs = together_configs()
    results = train_together(cfgs, tmp_path / "records", [tmp_path / "runs" / c.run_id for c in cfgs])
    for cfg, result, want in zip(cfgs, results, EXPECTED["together"], strict=True):
        assert cfg.run_id == want["run_id"]
        assert result.metrics == want["metrics"]
        assert digest(tmp_path / "records", cfg.run_id) == want["records"]


def test_a_checkpoint_of_the_old_format_resumes_to_the_reference(tmp_path: Path) -> None:
    name, task, method, overrides = next(c for c in CASES if c[0] == OLD_CHECKPOINT_CASE)
    cfg = config(task, method, **overrides)
    run_dir = tmp_path / "runs" / cfg.run_id
    run_dir.mkdir(parents=True)
    shutil.copy(OLD_CHECKPOINT, run_dir / "checkpoint.pt")
    result = train(cfg, tmp_path / "records", run_dir)
    assert result.resumed_from == 1
    assert result.metrics == EXPECTED[name]["metrics"]
    assert digest(tmp_path / "records", cfg.run_id) == EXPECTED[name]["records"]
