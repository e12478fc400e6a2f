"""Records of the CPU tasks stay bit-identical to those written down before the engine rework (tests/reference.py):
same run ids, same metrics, the same value in every Parquet cell; and a checkpoint written by that code resumes.

Bit for bit on requirements.lock's versions of the libraries that compute a task's numbers (torch; numpy, CVXPY and
SCS for polyfit); on other versions within tests/reference.py's stated tolerances, with the layout (sample ids and
targets) still exact. Each test says which it did: in its assertion message, in a `reference` section of its report
(shown with -rA and on failure), as the `reference` property of its junit XML case, and, within tolerances, as a
warning in the run's summary."""

from __future__ import annotations

import json
import shutil
import warnings
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
    comparison,
    digest,
    metric_mismatches,
    split_sizes,
    together_configs,
    train_case,
)

EXPECTED = json.loads(REFERENCE.read_text())


@pytest.fixture
def compare(request: pytest.FixtureRequest, record_property):
    """compare(task, method, cfg, result, records_root, want): a run against its reference, exactly or within
    tolerances as this machine's library versions allow, saying which (see the module's docstring)."""

    def check(task: str, method: str, cfg, result, records_root: Path, want: dict) -> None:
        exact, said = comparison(task)
        record_property("reference", said)
        request.node.add_report_section("call", "reference", said)
        if not exact:
            warnings.warn(said, stacklevel=2)
        assert cfg.run_id == want["run_id"], said
        if "status" in want:
            assert result.status == want["status"], said
        mismatches = metric_mismatches(task, method, result.metrics, want["metrics"], exact=exact,
                                       sizes=split_sizes(records_root, cfg.run_id), epochs=cfg.epochs)
        assert not mismatches, "\n".join([said, *mismatches])
        if exact and task not in KERNEL_DEPENDENT:
            assert digest(records_root, cfg.run_id) == want["records"], said         # every value, bit for bit
        elif "layout" in want:    # the values move; sample ids and targets do not (none written for cells together)
            assert digest(records_root, cfg.run_id, LAYOUT) == want["layout"], said

    return check


@pytest.mark.parametrize("name,task,method,overrides", CASES, ids=[c[0] for c in CASES])
def test_records_equal_the_reference(tmp_path: Path, compare, name: str, task: str, method: str,
                                     overrides: dict) -> None:
    cfg, result = train_case(tmp_path, task, method, overrides)
    compare(task, method, cfg, result, tmp_path / "records", EXPECTED[name])


def test_cells_trained_together_equal_the_reference(tmp_path: Path, compare) -> None:
    cfgs = together_configs()
    results = train_together(cfgs, tmp_path / "records", [tmp_path / "runs" / c.run_id for c in cfgs])
    for cfg, result, want in zip(cfgs, results, EXPECTED["together"], strict=True):
        compare(cfg.task, cfg.method, cfg, result, tmp_path / "records", want)


def test_a_checkpoint_of_the_old_format_resumes_to_the_reference(tmp_path: Path, compare) -> None:
    name, task, method, overrides = next(c for c in CASES if c[0] == OLD_CHECKPOINT_CASE)
    cfg = config(task, method, **overrides)
    run_dir = tmp_path / "runs" / cfg.run_id
    run_dir.mkdir(parents=True)
    shutil.copy(OLD_CHECKPOINT, run_dir / "checkpoint.pt")
    result = train(cfg, tmp_path / "records", run_dir)
    assert result.resumed_from == 1
    compare(task, method, cfg, result, tmp_path / "records", EXPECTED[name])
