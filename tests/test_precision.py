"""--precision: auto (bf16 autocast forward on CUDA) or fp32; the CUDA paths of the loop (marked gpu)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from flctl import records
from flctl.errors import ConfigError
from flctl.losses import model_output
from flctl.train import train
from tests.data_writers import write_cifar10
from tests.helpers import config

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run with CUDA_VISIBLE_DEVICES set)")


def test_precision_is_validated_and_only_a_non_default_value_changes_the_run_id() -> None:
    auto = config("two-moons", "fl", epochs=2)
    assert auto.precision == "auto"
    assert "precision" not in auto.identity()              # runs recorded before the field keep their ids
    fp32 = config("two-moons", "fl", epochs=2, precision="fp32")
    assert fp32.identity()["precision"] == "fp32" and fp32.run_id != auto.run_id
    with pytest.raises(ConfigError, match="unknown precision 'bf8'"):
        config("two-moons", "fl", precision="bf8")


def test_on_the_cpu_both_precisions_compute_the_same_records(tmp_path: Path) -> None:
    a = config("two-moons", "rfl", epochs=3, eval_every=3)
    b = config("two-moons", "rfl", epochs=3, eval_every=3, precision="fp32")
    ra = train(a, tmp_path / "records", tmp_path / "a")
    rb = train(b, tmp_path / "records", tmp_path / "b")
    assert ra.metrics == rb.metrics
    ta = records.read(tmp_path / "records", [a.run_id]).drop(["run_id"])
    tb = records.read(tmp_path / "records", [b.run_id]).drop(["run_id"])
    assert ta.equals(tb)


@pytest.mark.gpu
@cuda
def test_fp32_turns_autocast_off_and_auto_runs_the_forward_in_bf16() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 8).cuda()
    x = torch.randn(32, 64, device="cuda")
    with torch.no_grad():
        exact = model(x)
        fp32, auto = model_output(model, x, "fp32"), model_output(model, x, "auto")
        bf16 = (x.bfloat16() @ model.weight.bfloat16().T + model.bias.bfloat16()).float()
    assert torch.equal(fp32, exact)
    assert auto.dtype == torch.float32 and not torch.equal(auto, exact)
    torch.testing.assert_close(auto, bf16, rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("precision", ["auto", "fp32"])
def test_cifar10_trains_on_cuda_channels_last_with_float32_losses(tmp_path: Path, precision: str) -> None:
    data = write_cifar10(tmp_path / "data", per_batch=64)
    cfg = config("cifar10", "fl", epochs=2, eval_every=1, batch_size=32, precision=precision,
                 data_dir=str(data), options={"width": 16})
    cfg = dataclasses.replace(cfg, device="cuda")
    result = train(cfg, tmp_path / "records", tmp_path / "run")
    assert result.status == "completed" and np.isfinite(result.metrics["train.avg_loss"])
    table = records.read(tmp_path / "records", [cfg.run_id], split="train")
    assert table.num_rows == 2 * 320
    loss = table.column("loss").to_numpy()
    # The losses are computed in float32 from the bf16 forward's float32 output: float32 values, most of which
    # a bf16 number (8 significant bits) cannot hold.
    assert np.array_equal(loss.astype(np.float32).astype(np.float64), loss)
    as_bf16 = torch.from_numpy(loss.astype(np.float32)).bfloat16().float().numpy()
    assert np.mean(as_bf16 != loss.astype(np.float32)) > 0.9
    assert np.all(table.column("multiplier").to_numpy() >= 0)
