"""Cells trained together in one process (train_together) equal the same cells trained alone, bit for bit where the
cells interleave step by step (every task with a model but the vmapped small ones), and the step is graph-safe."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flctl.cell import Cell
from flctl.data import epoch_order
from flctl.step import EpochBatches, step_objective, train_step
from flctl.tasks import get_task
from flctl.train import train, train_together
from tests.fixtures import write_cifar10, write_utkface
from tests.helpers import config
from tests.reference import digest

CIFAR = dict(epochs=3, eval_every=2, batch_size=12, options={"width": 4})      # 40 images: 3 full batches + 4
UTK = dict(epochs=3, eval_every=1, batch_size=8, options={"width": 4, "size": 16, "split": "70-30"})


def mixed(task: str, data_dir: str, **shared) -> list:
    """Cells of every method, seed, lr, dual lr, ε, α and dual optimizer."""
    return [
        config(task, "erm", seed=0, lr=0.05, data_dir=data_dir, **shared),
        config(task, "fl", seed=1, lr=0.02, dual_lr=0.05, eps=0.4, data_dir=data_dir, **shared),
        config(task, "rfl", seed=2, lr=0.03, dual_lr=0.1, eps=0.2, alpha=0.5, dual_optimizer="nupi", kp=0.5,
               ki=0.8, nu=0.3, data_dir=data_dir, **shared),
        config(task, "cserm", seed=3, lr=0.01, eps=0.3, alpha=2.0, data_dir=data_dir, **shared),
    ]


def assert_equal_alone(tmp_path: Path, cfgs: list, together: list) -> None:
    for cfg, result in zip(cfgs, together, strict=True):
        alone = train(cfg, tmp_path / "alone", tmp_path / "a" / cfg.run_id)
        assert (result.status, result.epochs_done, result.diverged_at) == \
            (alone.status, alone.epochs_done, alone.diverged_at), cfg.method
        assert result.metrics == alone.metrics, cfg.method
        assert digest(tmp_path / "together", cfg.run_id) == digest(tmp_path / "alone", cfg.run_id), cfg.method
        assert result.trained_with["cells_together"] == len(cfgs) and alone.trained_with["cells_together"] == 1


def test_cifar10_cells_together_equal_alone(tmp_path: Path) -> None:
    data = str(write_cifar10(tmp_path / "data", per_batch=8))
    cfgs = mixed("cifar10", data, **CIFAR)
    together = train_together(cfgs, tmp_path / "together", [tmp_path / "t" / c.run_id for c in cfgs])
    assert {r.trained_with["engine"] for r in together} == {"eager"}
    assert_equal_alone(tmp_path, cfgs, together)


def test_utkface_cells_together_equal_alone(tmp_path: Path) -> None:
    data = str(write_utkface(tmp_path / "faces", n=40))
    cfgs = [config("utkface", m, seed=s, lr=lr, data_dir=data, **UTK)
            for m, s, lr in (("erm", 0, 1e-3), ("fl", 1, 2e-3), ("rfl", 2, 5e-4))]
    together = train_together(cfgs, tmp_path / "together", [tmp_path / "t" / c.run_id for c in cfgs])
    assert_equal_alone(tmp_path, cfgs, together)


def test_a_diverging_cell_leaves_and_the_others_equal_alone(tmp_path: Path) -> None:
    data = str(write_cifar10(tmp_path / "data", per_batch=8))
    cfgs = mixed("cifar10", data, **CIFAR)[:2] + [config("cifar10", "erm", seed=5, lr=1e12, data_dir=data, **CIFAR)]
    together = train_together(cfgs, tmp_path / "together", [tmp_path / "t" / c.run_id for c in cfgs])
    assert [r.status for r in together] == ["completed", "completed", "diverged"]
    assert_equal_alone(tmp_path, cfgs, together)


def test_cells_resuming_from_different_epochs_equal_alone(tmp_path: Path) -> None:
    data = str(write_cifar10(tmp_path / "data", per_batch=8))
    cfgs = mixed("cifar10", data, **CIFAR)
    run_dirs = [tmp_path / "t" / c.run_id for c in cfgs]
    # the first cell stops after 1 epoch, the second after 2; the others start fresh in the group
    for cfg, run_dir, epochs in ((cfgs[0], run_dirs[0], 1), (cfgs[1], run_dirs[1], 2)):
        done = iter(range(epochs, 0, -1))
        stopped = train(cfg, tmp_path / "together", run_dir, stop=lambda d=done: next(d, 0) == 1)
        assert stopped.status == "stopped" and stopped.epochs_done == epochs
    together = train_together(cfgs, tmp_path / "together", run_dirs)
    assert [r.resumed_from for r in together] == [1, 2, 0, 0]
    assert_equal_alone(tmp_path, cfgs, together)


def test_small_models_train_together_vmapped(tmp_path: Path) -> None:
    cfgs = [config("two-moons", m, seed=s, epochs=2) for m, s in (("erm", 0), ("fl", 1))]
    together = train_together(cfgs, tmp_path / "together", [tmp_path / "t" / c.run_id for c in cfgs])
    assert [r.trained_with for r in together] == [{"engine": "vmap", "cells_together": 2, "device": "cpu"}] * 2


def test_epoch_batches_visit_every_sample_once_with_a_partial_last_batch() -> None:
    batches = EpochBatches(batch_size=4, device=torch.device("cpu"))
    order = epoch_order(10, seed=3, epoch=1)
    batches.fill(order, None, None)
    assert batches.shapes == [False, False, True]
    taken = [batches.take(last)[0] for last in batches.shapes]
    assert [len(t) for t in taken] == [4, 4, 2]
    assert torch.equal(torch.cat(taken), order)          # the epoch's order, batch after batch
    batches.fill(order, None, None)                      # the next epoch starts over (the counter is reset)
    assert torch.equal(batches.take(False)[0], order[:4])


def test_augmentation_drawn_per_epoch_equals_drawing_per_batch() -> None:
    # The epoch's parameters come from the generator in the order per-batch draws took them: same images.
    augment = get_task("cifar10").augment
    x = torch.randint(0, 256, (10, 3, 32, 32), dtype=torch.uint8)
    order = epoch_order(10, seed=0, epoch=0)
    batches = EpochBatches(batch_size=4, device=torch.device("cpu"))
    batches.fill(order, augment, torch.Generator().manual_seed(7))
    per_batch = torch.Generator().manual_seed(7)
    for last, ids in zip(batches.shapes, order.split(4)):
        got_ids, params = batches.take(last)
        want = augment.apply(x[ids], augment.draw(len(ids), per_batch, x.device))
        assert torch.equal(augment.apply(x[got_ids], params), want)


STEP_CASES = [("erm", {}), ("cserm", {"eps": 0.3, "alpha": 2.0}), ("fl", {}), ("rfl", {"alpha": 0.5}),
              ("fl", {"dual_optimizer": "nupi", "kp": 0.5, "ki": 0.8, "nu": 0.3}),
              ("rfl", {"alpha": 0.5, "dual_optimizer": "nupi", "kp": 1.0, "ki": 1.0, "nu": 0.5})]


@pytest.mark.parametrize("method,overrides", STEP_CASES, ids=[f"{m}-{o.get('dual_optimizer', 'gd')}"
                                                              for m, o in STEP_CASES])
def test_the_step_compiles_whole_and_equals_eager(tmp_path: Path, method: str, overrides: dict) -> None:
    # fullgraph: any graph break (a host sync, a Python branch on a tensor, an untraceable call) is an error.
    torch._dynamo.reset()
    task = get_task("two-moons")
    data = task.load(dict(task.options), None)
    cfg = config("two-moons", method, lr=0.05, optimizer="sgd", **overrides)
    cells = [Cell.build(cfg, task, data, tmp_path / str(i), torch.device("cpu")) for i in range(2)]
    compiled = torch.compile(step_objective, fullgraph=True, backend="aot_eager")
    order = epoch_order(len(data.train), cfg.seed, 0)
    for ids in order.split(64)[:3]:
        x, y = data.train.x[ids], data.train.y[ids]
        eager = train_step(task, cells[0].model, cells[0].method, cells[0].optimizer, x, y, ids)
        graph = train_step(task, cells[1].model, cells[1].method, cells[1].optimizer, x, y, ids,
                           objective=compiled)
        torch.testing.assert_close(graph, eager, rtol=1e-5, atol=1e-6)
    for a, b in zip(cells[0].model.parameters(), cells[1].model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    if cells[0].method.multipliers is not None:
        torch.testing.assert_close(cells[1].method.multipliers, cells[0].method.multipliers, rtol=1e-5, atol=1e-6)


def test_the_compiled_engine_trains_close_to_eager_and_is_its_own_run(tmp_path: Path) -> None:
    torch._dynamo.reset()
    # Batches of 500 divide the 1,000 samples: one compilation. A partial last batch makes torch recompile with a
    # dynamic shape (its own mechanism, not flctl's), which on the CPU is another round of C++: 33 -> 27 CPU-s cold.
    over = dict(epochs=2, eval_every=2, batch_size=500)
    eager = config("two-moons", "fl", **over)
    compiled = config("two-moons", "fl", **over, engine="compiled")
    assert compiled.run_id != eager.run_id
    assert config("two-moons", "fl", **over, engine="captured", device="cuda").run_id == eager.run_id
    a = train(eager, tmp_path / "records", tmp_path / "a")
    b = train(compiled, tmp_path / "records", tmp_path / "b")
    assert b.trained_with["engine"] == "compiled"
    assert b.metrics == pytest.approx(a.metrics, rel=1e-4, abs=1e-5)
