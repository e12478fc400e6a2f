"""Fashion-MNIST on the real images (Debian's dataset-fashion-mnist, which .ci/run installs)."""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from flctl.errors import ConfigError
from flctl.tasks import get_task
from flctl_tasks import fashion_mnist as fm
from tests.data_writers import real_fashion_mnist
from tests.helpers import config, files_under, in_process

TASK = get_task("fashion-mnist")


@pytest.fixture(autouse=True)
def _real() -> None:
    real_fashion_mnist()


def _copy(to: Path, unzip: bool = False) -> Path:
    to.mkdir(parents=True)
    for gz in sorted(fm.DEBIAN.glob("*.gz")):
        if unzip:
            (to / gz.stem).write_bytes(gzip.decompress(gz.read_bytes()))
        else:
            shutil.copy(gz, to)
    return to


def test_the_loader_reads_the_real_idx_files() -> None:
    data = TASK.load(TASK.options, None)          # no --data-dir: Debian's folder
    assert data.train.x.shape == (60_000, 1, 28, 28) and data.train.x.dtype == torch.uint8
    assert data.test.x.shape == (10_000, 1, 28, 28) and data.test.y.dtype == torch.long
    # the data set's own facts: balanced classes, 6,000 and 1,000 images of each
    assert torch.bincount(data.train.y).tolist() == [6000] * 10
    assert torch.bincount(data.test.y).tolist() == [1000] * 10
    mean, std = data.train.x.double().div(255).mean().item(), data.train.x.double().div(255).std().item()
    assert (mean, std) == pytest.approx((fm.MEAN[0], fm.STD[0]), abs=1e-4)   # the constants the model normalizes by
    # sample ids are file order: image 0 of the training file is an ankle boot (label 9) with a blank top row
    assert data.train.y[:3].tolist() == [9, 0, 0] and int(data.train.x[0, 0, 0].sum()) == 0


def test_plain_files_and_torchvisions_layout_read_the_same(tmp_path: Path) -> None:
    """--data-dir takes the four files gzipped or not, or torchvision's root (FashionMNIST/raw/ under it)."""
    base = TASK.load(TASK.options, None)
    for root in (_copy(tmp_path / "gz"), _copy(tmp_path / "tv" / "FashionMNIST" / "raw", unzip=True).parents[1]):
        data = TASK.load(TASK.options, str(root))
        assert torch.equal(data.train.x, base.train.x) and torch.equal(data.test.y, base.test.y)
        assert re.fullmatch(r"folder \S+ \(sha256 of the four files [0-9a-f]{16}\)", fm.data_source({}, str(root)))


@pytest.mark.parametrize("damage,needle", [
    (lambda d: (d / "t10k-labels-idx1-ubyte.gz").unlink(), "no Fashion-MNIST files in"),
    (lambda d: (d / "train-images-idx3-ubyte.gz").write_bytes(b"\x1f\x8b\x08\x00 truncated"),
     "is not a Fashion-MNIST IDX file"),
    (lambda d: (d / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(b"\x00\x00\x0d\x01" + bytes(8))),
     "is not a Fashion-MNIST IDX file"),
    (lambda d: (d / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(
        b"\x00\x00\x08\x01" + (9999).to_bytes(4, "big") + bytes(9999))), "are not Fashion-MNIST's"),
])
def test_damaged_data_is_one_line_and_writes_nothing(tmp_path: Path, damage, needle: str) -> None:
    data = _copy(tmp_path / "data")
    damage(data)
    results = tmp_path / "results"
    out = in_process("run", "fashion-mnist", "--method", "fl", "--data-dir", str(data), "--epochs", "1",
                     "--results-dir", str(results))
    assert out.returncode == 2 and needle in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert files_under(results) == []


def test_with_no_data_anywhere_the_line_names_every_way_out(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(fm, "DEBIAN", tmp_path / "not-installed")
    monkeypatch.setenv("FLCTL_DATA", str(tmp_path / "cache"))
    for proxy in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):   # offline at once: a closed port
        monkeypatch.setenv(proxy, "http://127.0.0.1:9")
    with pytest.raises(ConfigError, match="apt install dataset-fashion-mnist.*--data-dir.*online"):
        TASK.check(TASK.options, None)


def test_the_model_follows_the_device_and_is_part_of_the_identity() -> None:
    cpu, gpu = config("fashion-mnist", "fl"), config("fashion-mnist", "fl", device="cuda")
    assert cpu.opts["model"] == "cnn" and gpu.opts["model"] == "resnet18" and cpu.run_id != gpu.run_id
    # auto is settled here, before the options: the GPU's model where this machine has CUDA, else the CPU's
    auto, here = config("fashion-mnist", "fl", device="auto"), gpu if torch.cuda.is_available() else cpu
    assert (auto.device, auto.opts["model"], auto.run_id) == (here.device, here.opts["model"], here.run_id)
    chosen = config("fashion-mnist", "fl", options={"model": "resnet18"})
    assert chosen.opts["model"] == "resnet18" and chosen.device == "cpu"
    data = TASK.load(TASK.options, None).subset(4)
    resnet = TASK.build_model({"model": "resnet18", "width": 8}, data)[1]
    assert resnet.conv1.in_channels == 1 and resnet.conv1.kernel_size == (3, 3) and resnet.fc.out_features == 10
    cnn = TASK.build_model({"model": "cnn", "width": 0}, data)
    assert cnn(data.train.x).shape == (4, 10) and cnn[1][0].out_channels == fm.WIDTH["cnn"]
    with pytest.raises(ConfigError, match="choose one of cnn, resnet18"):
        TASK.check({"model": "mlp", "width": 0}, None)


def test_augmentation_keeps_28x28_and_is_a_padded_crop_with_flips() -> None:
    x = TASK.load(TASK.options, None).train.x[:8]
    params = TASK.augment.draw(8, torch.Generator().manual_seed(0), x.device)
    a = TASK.augment.apply(x, params)
    assert a.shape == x.shape and a.dtype == torch.uint8 and not torch.equal(a, x)
    padded = torch.nn.functional.pad(x, (fm.PAD,) * 4)
    for i in range(8):
        crops = [padded[i, :, dy:dy + 28, dx:dx + 28] for dy in range(5) for dx in range(5)]
        assert any(torch.equal(c, a[i]) or torch.equal(c.flip(2), a[i]) for c in crops)


@pytest.mark.slow    # trains on the real images until it learns: 4 s
def test_flctl_run_trains_on_real_images_and_learns(tmp_path: Path) -> None:
    """The README's command on a subset: ERM's test accuracy after 2 epochs is far above chance (10 %), so images,
    labels and sample ids line up; FL at ε = 0.51 runs with the same command and records a multiplier per sample."""
    results = str(tmp_path / "results")
    common = ("--subset", "1500", "--epochs", "2", "--eval-every", "2", "--results-dir", results)
    assert in_process("run", "fashion-mnist", "--method", "erm", *common).returncode == 0
    out = in_process("run", "fashion-mnist", "--method", "fl", "--eps", "0.51", *common)
    assert out.returncode == 0, out.stderr
    runs = {r["config"]["method"]: r for r in json.loads(in_process("runs", "--json", "--results-dir", results).stdout)}
    assert runs["erm"]["metrics"]["test.accuracy"] > 0.5
    assert runs["fl"]["config"]["options"] == {"model": "cnn", "width": 0}
    assert np.isfinite(runs["fl"]["metrics"]["train.max_multiplier"])
    # what the images came from, recorded with the run: Debian's package and its version
    shown = json.loads(in_process("show", runs["fl"]["id"], "--json", "--results-dir", results).stdout)
    assert re.fullmatch(r"Debian package dataset-fashion-mnist \S+ \(/usr/share/datasets/fashion-mnist\)",
                        shown["provenance"]["data"]), shown["provenance"]["data"]


def test_device_options_must_set_declared_options() -> None:
    with pytest.raises(ConfigError, match="device_options are keyed by cpu or cuda and set declared options"):
        dataclasses.replace(TASK, device_options={"cuda": {"depth": 50}})
    with pytest.raises(ConfigError, match="got 'mps'"):
        dataclasses.replace(TASK, device_options={"mps": {"model": "cnn"}})
