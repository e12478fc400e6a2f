"""Every registered task runs with every method it supports (a new task file is tested by these)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest
import torch

from flctl import records
from flctl.errors import ConfigError
from flctl.tasks import all_tasks, get_task
from flctl.train import train
from tests.data_writers import REAL, WRITERS
from tests.helpers import config

CASES = [(name, method) for name, task in all_tasks().items() for method in task.supported_methods]


def data_dir(name: str, tmp_path: Path) -> str | None:
    """Tasks with external data get a small copy written in the dataset's real format, or the real data where the
    machine installs it (fashion-mnist)."""
    if name in REAL:
        REAL[name]()
        return None
    writer = WRITERS.get(name)
    if writer is None:
        assert all_tasks()[name].check is None, f"task {name} needs data: add a writer to tests/data_writers.py"
        return None
    return str(writer(tmp_path / "data"))


# Narrow models for the tasks whose paper model is too big for a quick CPU test.
SMALL = {"cifar10": {"width": 8}, "utkface": {"width": 8, "size": 32}, "orca-dpo": {"model": "tiny"},
         "fashion-mnist": {"width": 4}}
# Samples per split for the tasks with real data sets (70,000 Fashion-MNIST images), spread over each split.
SUBSET = {"fashion-mnist": 600}


@pytest.mark.parametrize("name,method", CASES)
def test_task_trains_with_method(tmp_path: Path, name: str, method: str) -> None:
    task = all_tasks()[name]
    cfg = config(name, method, epochs=1, eval_every=1, data_dir=data_dir(name, tmp_path),
                 options=SMALL.get(name, {}), subset=SUBSET.get(name, 0))
    result = train(cfg, tmp_path / "records", tmp_path / "runs" / cfg.run_id)
    assert result.status == "completed"
    data = task.load(cfg.opts, cfg.data_dir)
    data = data.subset(cfg.subset) if cfg.subset else data
    table = records.read(tmp_path / "records", [cfg.run_id])
    assert len(table) == len(data.train) + len(data.test)
    assert np.isfinite(table["loss"].to_numpy()).all()
    lam = table.filter(pc.equal(table["split"], "train"))["multiplier"]
    assert (lam.null_count == 0) == (method in ("fl", "rfl"))      # multipliers exactly for FL/RFL


@pytest.mark.parametrize("name", list(all_tasks()))
def test_task_data_is_deterministic_and_typed(tmp_path: Path, name: str) -> None:
    task = all_tasks()[name]
    root = data_dir(name, tmp_path)
    options = {**task.options, **SMALL.get(name, {})}
    a, b = task.load(options, root), task.load(options, root)
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.test.y, b.test.y)
    assert len(a.train) == len(a.train.y) and len(a.test) > 0
    if task.kind == "classification":
        assert a.train.y.dtype == torch.long
    if task.build_model is not None:
        out = task.build_model(options, a)(a.train.x[:4])
        assert out.shape[0] == 4


def test_paper_defaults_of_two_moons() -> None:
    t = all_tasks()["two-moons"]
    assert t.options["n_train"] == 1000 and t.options["noise"] == 0.1 and t.options["hidden"] == 70
    d = t.defaults
    assert (d["optimizer"], d["lr"], d["batch_size"], d["epochs"], d["dual_lr"]) == ("adamw", 5e-4, 512, 250, 1e-2)
    data = t.load(dict(t.options), None)
    assert len(data.train) == 1000 and not torch.equal(data.train.x, data.test.x)
    model = t.build_model(dict(t.options), data)
    assert [m.out_features for m in model if isinstance(m, torch.nn.Linear)] == [70, 70, 2]


def test_every_task_kind_has_one_loss_kind() -> None:
    import typing

    from flctl.losses import LOSS_KINDS
    from flctl.tasks import Kind

    assert set(LOSS_KINDS) == set(typing.get_args(Kind))
    assert {t.kind for t in all_tasks().values()} <= set(LOSS_KINDS)


def test_a_data_path_that_is_not_there_is_refused_for_a_task_without_its_own_check(tmp_path: Path) -> None:
    """A plugin task that reads --data but declares no check: the path must exist, or it would be recorded as the
    run's data; a task that reads none refuses any."""
    import dataclasses

    from flctl.tasks import check_task_data

    reads = dataclasses.replace(get_task("two-moons"), reads_data=True, check=None)
    check_task_data(reads, {}, str(tmp_path))
    with pytest.raises(ConfigError, match="no such file or folder"):
        check_task_data(reads, {}, str(tmp_path / "missing"))
    check_task_data(reads, {}, str(tmp_path / "missing"), look=False)       # a dry run does not look
    with pytest.raises(ConfigError, match="reads no --data"):
        check_task_data(get_task("two-moons"), {}, str(tmp_path), look=False)


@pytest.mark.parametrize("n, noise, seed", [(1000, 0.1, 0), (999, 0.3, 7), (2, 0.0, 1), (5000, 0.1, 12345)])
def test_make_moons_is_scikit_learns(n: int, noise: float, seed: int) -> None:
    """two-moons writes make_moons out (importing scikit-learn costs a run 1-2 s); the samples, labels and their order
    must be scikit-learn's bit for bit, so run ids and records stay what they were."""
    from sklearn.datasets import make_moons as sklearns

    from flctl_tasks.two_moons import make_moons

    x, y = make_moons(n, noise, seed)
    want_x, want_y = sklearns(n_samples=n, noise=noise, random_state=seed)
    assert np.array_equal(x, want_x) and np.array_equal(y, want_y) and (x.dtype, y.dtype) == (want_x.dtype, want_y.dtype)


def test_a_two_moons_run_imports_no_scikit_learn(tmp_path) -> None:
    """What a run of the flagship task imports is the floor of its start-up: scikit-learn (with scipy.stats) is
    1-2 s of it, and only the tasks that load its datasets may pay it."""
    import subprocess
    import sys

    code = ("import sys; from flctl.tasks import get_task; t = get_task('two-moons'); t.load(dict(t.options), None); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sklearn', 'scipy')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
