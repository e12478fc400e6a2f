"""CIFAR-10 on data written in its real on-disk format (python pickle batches)."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from flctl.cli import app
from flctl.data import Normalize
from flctl.errors import ConfigError
from flctl.tasks import get_task
from tests.data_writers import write_cifar10
from tests.helpers import files_under

runner = CliRunner()


@pytest.fixture
def cifar(tmp_path: Path) -> Path:
    return write_cifar10(tmp_path / "data", per_batch=6)


def test_loader_reads_the_pickle_batches_in_order(cifar: Path) -> None:
    import pickle

    data = get_task("cifar10").load({"width": 8}, str(cifar))
    assert data.train.x.shape == (30, 3, 32, 32) and data.train.x.dtype == torch.uint8
    assert data.test.x.shape == (6, 3, 32, 32) and data.train.y.dtype == torch.long
    with open(cifar / "cifar-10-batches-py" / "data_batch_2", "rb") as f:
        second = pickle.load(f, encoding="latin1")
    # sample ids follow the file order: batch 2 holds ids 6..11; rows are R, G, B planes of 32x32
    assert data.train.y[6:12].tolist() == second["labels"]
    assert torch.equal(data.train.x[6].reshape(-1), torch.from_numpy(second["data"][0]))


def test_model_has_a_ten_way_head_and_a_cifar_stem(cifar: Path) -> None:
    task = get_task("cifar10")
    data = task.load({"width": 64}, str(cifar))
    model = task.build_model({"width": 64}, data)
    resnet = model[1]
    assert resnet.fc.out_features == 10 and resnet.conv1.kernel_size == (3, 3) and resnet.conv1.stride == (1, 1)
    assert isinstance(resnet.maxpool, torch.nn.Identity)
    assert model(data.train.x[:2]).shape == (2, 10)


def test_normalization_standardizes_each_channel() -> None:
    norm = Normalize((0.5, 0.25, 0.0), (0.5, 0.25, 1.0))
    x = torch.full((1, 3, 2, 2), 255, dtype=torch.uint8)
    torch.testing.assert_close(norm(x)[0, :, 0, 0], torch.tensor([1.0, 3.0, 1.0]))


def test_augmentation_is_a_seeded_padded_crop_with_flips() -> None:
    x = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8)
    augment = get_task("cifar10").augment
    a = augment.apply(x, augment.draw(16, torch.Generator().manual_seed(1), x.device))
    b = augment.apply(x, augment.draw(16, torch.Generator().manual_seed(1), x.device))
    assert torch.equal(a, b) and a.dtype == torch.uint8 and not torch.equal(a, x)
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    for i in range(16):
        crops = [padded[i, :, dy:dy + 32, dx:dx + 32] for dy in range(9) for dx in range(9)]
        assert any(torch.equal(c, a[i]) or torch.equal(c.flip(2), a[i]) for c in crops)


def test_flctl_run_cifar10_fl_with_p_min(cifar: Path, results: Path) -> None:
    res = runner.invoke(app, ["run", "cifar10", "--method", "fl", "--p-min", "0.6", "--data-dir", str(cifar),
                              "-o", "width=8", "--epochs", "2", "--batch-size", "8"])
    assert res.exit_code == 0, res.output
    [row] = json.loads(runner.invoke(app, ["runs", "--json"]).stdout)
    assert row["status"] == "completed" and row["config"]["eps"] == pytest.approx(0.5108, abs=1e-4)
    assert row["config"]["options"] == {"width": 8} and 0 <= row["metrics"]["test.accuracy"] <= 1


@pytest.mark.parametrize("damage,needle", [
    (lambda d: shutil.rmtree(d / "cifar-10-batches-py"), "no CIFAR-10 folder"),
    (lambda d: (d / "cifar-10-batches-py" / "test_batch").unlink(), "incomplete: missing test_batch"),
    (lambda d: (d / "cifar-10-batches-py" / "test_batch").write_bytes(b"garbage"),
     "test_batch is not a CIFAR-10 python batch"),
    (lambda d: (d / "cifar-10-batches-py" / "data_batch_4").write_bytes(pickle.dumps({"data": [1, 2], "labels": [3]})),
     "data_batch_4 is not a CIFAR-10 python batch"),
])
def test_missing_or_partial_dataset_is_rejected_before_anything_is_written(cifar: Path, results: Path, damage,
                                                                           needle) -> None:
    damage(cifar)
    res = runner.invoke(app, ["run", "cifar10", "--data-dir", str(cifar), "--epochs", "1"])
    assert res.exit_code == 2 and needle in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert files_under(results) == []


def test_corrupt_batch_is_a_clear_error(cifar: Path) -> None:
    (cifar / "cifar-10-batches-py" / "data_batch_3").write_bytes(b"garbage")
    with pytest.raises(ConfigError, match="data_batch_3 is not a CIFAR-10 python batch"):
        get_task("cifar10").load({"width": 8}, str(cifar))


def test_without_data_dir_and_no_network_the_error_names_both_ways(tmp_path: Path, monkeypatch) -> None:
    import flctl_tasks.cifar10 as cifar10

    monkeypatch.setenv("FLCTL_DATA", str(tmp_path / "cache"))
    monkeypatch.setattr(cifar10, "URL", "http://127.0.0.1:9/cifar-10-python.tar.gz")   # refused at once
    with pytest.raises(ConfigError, match="pass --data-dir .* or run once online"):
        cifar10.load({"width": 8}, None)
    assert not (tmp_path / "cache").exists()         # the failed download leaves no folder behind


def test_cifar_specs_now_plan(cifar: Path) -> None:
    import dataclasses

    from flctl.sweep import load_spec, plan

    spec = dataclasses.replace(load_spec(Path(__file__).parents[1] / "sweeps" / "cifar10-main.toml"),
                               data_dir=str(cifar))
    configs = plan(spec)
    # ERM x 5 seeds + (FL, RFL, CSERM) x 2 eps x 5 seeds
    assert len(configs) == 5 + 3 * 2 * 5
    lr = plan(dataclasses.replace(load_spec(Path(__file__).parents[1] / "sweeps" / "cifar10-lr.toml"),
                                  data_dir=str(cifar)))
    assert len(lr) == 6 * 5 + 2 * 6 * 6 * 5
