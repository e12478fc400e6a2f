"""The captured engine on CUDA (marked gpu; skipped without CUDA): replayed steps equal eager ones bit for bit with
deterministic kernels, K cells grouped on one GPU equal each cell alone, and an epoch's steps never sync. The last
three tests are what the first real GPU run (an H200, 2026-11-26) found broken: replays across epochs read freed
augmentation buffers, grouped small cells raced across streams, and checkpoints were written beside replays."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from flctl import records
from flctl.cell import Cell
from flctl.data import epoch_order
from flctl.step import WARMUP_STEPS, CapturedStep, EpochBatches, cell_step, step_inputs
from flctl.tasks import get_task
from flctl.train import train, train_together
from tests.data_writers import write_cifar10
from tests.helpers import config
from tests.reference import digest

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run with CUDA_VISIBLE_DEVICES set)")]

# 40 images per batch file: 200 training images, 16 full batches of 12 and one of 8 per epoch
CIFAR = dict(epochs=2, eval_every=1, batch_size=12, options={"width": 8}, device="cuda")


@pytest.fixture(autouse=True)
def deterministic():
    """Deterministic cuDNN/cuBLAS kernels: what bit-for-bit equality costs (no autotuned convolutions)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    before = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    yield
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before


def cells(data_dir: str, **kw) -> list:
    return [config("cifar10", m, seed=s, lr=lr, data_dir=data_dir, **{**CIFAR, **kw})
            for m, s, lr in (("fl", 0, 0.05), ("erm", 1, 0.02), ("rfl", 2, 0.03), ("cserm", 3, 0.01))]


def test_replay_equals_eager_over_two_epochs(tmp_path: Path) -> None:
    data = str(write_cifar10(tmp_path / "data", per_batch=40))
    eager = cells(data, engine="eager")[0]
    captured = cells(data)[0]               # engine auto: captured on CUDA
    assert eager.run_id == captured.run_id
    a = train(eager, tmp_path / "eager", tmp_path / "a")
    b = train(captured, tmp_path / "captured", tmp_path / "b")
    assert b.trained_with["engine"] == "captured" and a.trained_with["engine"] == "eager"
    assert a.metrics == b.metrics
    assert digest(tmp_path / "eager", eager.run_id) == digest(tmp_path / "captured", eager.run_id)


def test_four_grouped_cells_replayed_equal_them_eager(tmp_path: Path) -> None:
    """K = 4 CIFAR-10 cells as one grouped model (flctl.grouped), its step captured: bit for bit the grouped eager
    step's records (the same kernels)."""
    data = str(write_cifar10(tmp_path / "data", per_batch=40))
    results = {}
    for engine in ("eager", "captured"):
        cfgs = cells(data, engine=engine)
        results[engine] = train_together(cfgs, tmp_path / engine, [tmp_path / engine / "t" / c.run_id for c in cfgs])
        assert {r.trained_with["engine"] for r in results[engine]} == {"grouped"}
    for cfg, a, b in zip(cells(data), results["eager"], results["captured"]):
        assert a.metrics == b.metrics, cfg.method
        assert digest(tmp_path / "eager", cfg.run_id) == digest(tmp_path / "captured", cfg.run_id), cfg.method


def test_four_grouped_cells_on_cuda_equal_each_alone_in_float64(tmp_path: Path, float64) -> None:
    """Grouped kernels round differently from a cell's own (tests/test_grouped.py states why float64)."""
    from tests.test_grouped import assert_close_to_alone

    data = str(write_cifar10(tmp_path / "data", per_batch=40))
    cfgs = cells(data, precision="fp32")
    together = train_together(cfgs, tmp_path / "together", [tmp_path / "t" / c.run_id for c in cfgs])
    assert {r.trained_with["engine"] for r in together} == {"grouped"}
    assert_close_to_alone(tmp_path, cfgs, together, rtol=1e-9, atol=1e-12)


def test_an_epoch_of_captured_steps_never_syncs_with_the_host(tmp_path: Path) -> None:
    data_dir = str(write_cifar10(tmp_path / "data", per_batch=40))
    cfg = cells(data_dir, engine="captured")[0]
    task = get_task("cifar10")
    data = task.load(cfg.opts, cfg.data_dir).to("cuda")
    cell = Cell.build(cfg, task, data, tmp_path / "run", torch.device("cuda"))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    batches = EpochBatches(cfg.batch_size, torch.device("cuda"))
    steps = {last: CapturedStep(lambda last=last: cell_step(cell, task, data, batches, last), stream,
                                lambda: step_inputs(cell, data, batches)) for last in (False, True)}
    with torch.cuda.stream(stream):
        for epoch in range(WARMUP_STEPS + 2):     # the last shape is captured after WARMUP_STEPS epochs
            generator = torch.Generator(device="cuda").manual_seed(epoch)
            batches.fill(epoch_order(len(data.train), cfg.seed, epoch), task.augment, generator)
            if epoch == WARMUP_STEPS + 1:
                torch.cuda.set_sync_debug_mode("error")
            try:
                for last in batches.shapes:
                    steps[last].check()
                    steps[last]()
            finally:
                torch.cuda.set_sync_debug_mode(0)
    assert all(s.graph is not None and s.recaptures == 0 for s in steps.values())
    assert torch.isfinite(cell.epoch_losses).all()


def test_a_captured_run_over_several_epochs_equals_eager(tmp_path: Path) -> None:
    """Five epochs: both batch shapes are captured (the last one after WARMUP_STEPS epochs) and replayed in later
    epochs, whose augmentation parameters are new draws in the same buffers."""
    data = str(write_cifar10(tmp_path / "data", per_batch=40))
    eager, captured = (cells(data, engine=e, epochs=5, eval_every=1)[0] for e in ("eager", "captured"))
    a = train(eager, tmp_path / "eager", tmp_path / "a")
    b = train(captured, tmp_path / "captured", tmp_path / "b")
    assert (a.status, b.status) == ("completed", "completed") and a.metrics == b.metrics
    assert digest(tmp_path / "eager", eager.run_id) == digest(tmp_path / "captured", eager.run_id)


def test_a_checkpoint_written_during_replay_resumes_to_the_same_records(tmp_path: Path) -> None:
    """Checkpoints every epoch while graphs replay (host copies on the training stream, written by a thread that
    makes no CUDA call); a run stopped after epoch 4 and resumed equals the run that never stopped."""
    data = str(write_cifar10(tmp_path / "data", per_batch=40))
    cfg = cells(data, engine="captured", epochs=6, eval_every=1)[0]
    whole = train(cfg, tmp_path / "whole", tmp_path / "w", checkpoint_every=0.0)
    stops = iter([False, False, False, True])
    stopped = train(cfg, tmp_path / "parts", tmp_path / "p", checkpoint_every=0.0, stop=lambda: next(stops, False))
    assert stopped.status == "stopped" and stopped.epochs_done == 4
    resumed = train(cfg, tmp_path / "parts", tmp_path / "p", checkpoint_every=0.0)
    assert resumed.resumed_from == 4 and resumed.metrics == whole.metrics
    assert digest(tmp_path / "parts", cfg.run_id) == digest(tmp_path / "whole", cfg.run_id)


def test_two_grouped_two_moons_cells_on_cuda_equal_each_alone(tmp_path: Path) -> None:
    """The grouped step of small cells, on CUDA. Grouped kernels sum in another order than one cell's,
    so equal within float32 rounding grown over 3 epochs (rtol 1e-4, atol 1e-5), not bit for bit; fp32, so that
    autocast's bf16 rounding does not enter."""
    import numpy as np

    cfgs = [config("two-moons", m, seed=s, epochs=3, eval_every=1, device="cuda", precision="fp32")
            for m, s in (("fl", 0), ("erm", 1))]
    together = train_together(cfgs, tmp_path / "together", [tmp_path / "t" / c.run_id for c in cfgs])
    assert [r.trained_with["engine"] for r in together] == ["grouped", "grouped"]
    for cfg, result in zip(cfgs, together):
        alone = train(cfg, tmp_path / "alone", tmp_path / "a" / cfg.run_id)
        assert result.status == alone.status == "completed"
        order = [("epoch", "ascending"), ("split", "ascending"), ("sample_id", "ascending")]
        a = records.read(tmp_path / "together", [cfg.run_id]).sort_by(order)
        b = records.read(tmp_path / "alone", [cfg.run_id]).sort_by(order)
        assert len(a) == len(b) > 0
        for column in ("loss", "multiplier"):
            x, y = a[column].to_numpy(zero_copy_only=False), b[column].to_numpy(zero_copy_only=False)
            if cfg.method == "erm" and column == "multiplier":
                continue
            np.testing.assert_allclose(x.astype(float), y.astype(float), rtol=1e-4, atol=1e-5, err_msg=cfg.method)


def test_the_compiled_captured_engine_replays_what_compiled_computes(tmp_path: Path) -> None:
    """Candidate (c) of cells at the GPU's pace: the compiled step captured as CUDA graphs. The same kernels as the
    compiled engine, replayed: records within rtol 1e-5 of compiled's (inductor may pick other kernels for the graph's
    static addresses; 1e-5 is float32 rounding over two epochs), the same run id."""
    torch._dynamo.reset()
    data = str(write_cifar10(tmp_path / "data", per_batch=40))
    compiled = cells(data, engine="compiled")[0]
    both = cells(data, engine="compiled-captured")[0]
    assert both.run_id == compiled.run_id
    a = train(compiled, tmp_path / "compiled", tmp_path / "a")
    torch._dynamo.reset()
    b = train(both, tmp_path / "both", tmp_path / "b")
    assert (a.trained_with["engine"], b.trained_with["engine"]) == ("compiled", "compiled-captured")
    assert b.metrics == pytest.approx(a.metrics, rel=1e-5, abs=1e-6)


def test_cells_on_streams_of_their_own_equal_each_alone(tmp_path: Path) -> None:
    """Candidate (b): four CIFAR-10 cells, each replaying its captured steps on a CUDA stream of its own
    (--engine captured-streams), equal each cell trained alone bit for bit (deterministic kernels; its own tensors)."""
    data = str(write_cifar10(tmp_path / "data", per_batch=40))
    cfgs = cells(data, engine="captured-streams")
    together = train_together(cfgs, tmp_path / "together", [tmp_path / "t" / c.run_id for c in cfgs])
    assert {r.trained_with["engine"] for r in together} == {"captured-streams"}
    for cfg, result in zip(cfgs, together):
        alone = train(cfg, tmp_path / "alone", tmp_path / "a" / cfg.run_id)
        assert result.metrics == alone.metrics, cfg.method
        assert digest(tmp_path / "together", cfg.run_id) == digest(tmp_path / "alone", cfg.run_id), cfg.method
