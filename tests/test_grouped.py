"""Cells trained together in one process (train_together) equal the same cells trained alone: bit for bit where the
cells interleave step by step, up to float rounding where they run as one grouped model (flctl.grouped), and the step
is graph-safe.

Tolerances of grouped cells. A grouped convolution, BatchNorm over K·C channels and a grouped linear layer sum in
another order than a cell's own kernels, so they round differently: one step apart by ~1e-7 in float32. Training
grows that: the test models (a width-4 ResNet on batches of 12) amplify it through near-zero BatchNorm variances to
~5e-4 in 3 steps, which no useful float32 tolerance separates from a bug. So equality is held in float64, where the
same computation rounds at ~1e-16: records equal alone's within rtol 1e-9 over 3 epochs (measured: 1e-15). In
float32, on two-moons (no BatchNorm), records over 20 epochs equal within rtol 1e-4, atol 1e-5 (measured: 2e-7)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from flctl import records
from flctl.cell import Cell
from flctl.data import epoch_order
from flctl.step import EpochBatches, step_objective, train_step
from flctl.tasks import get_task
from flctl.train import train, train_together
from tests.data_writers import write_cifar10, write_utkface
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


@pytest.mark.slow    # ResNet-18 cells, together and alone: 3 s
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


@pytest.mark.slow    # every cell trained again alone: 2 s
def test_a_diverging_cell_leaves_and_the_others_equal_alone(tmp_path: Path) -> None:
    data = str(write_cifar10(tmp_path / "data", per_batch=8))
    cfgs = mixed("cifar10", data, **CIFAR)[:2] + [config("cifar10", "erm", seed=5, lr=1e12, data_dir=data, **CIFAR)]
    together = train_together(cfgs, tmp_path / "together", [tmp_path / "t" / c.run_id for c in cfgs])
    assert [r.status for r in together] == ["completed", "completed", "diverged"]
    assert_equal_alone(tmp_path, cfgs, together)


@pytest.mark.slow    # every cell trained again alone: 3 s
def test_cells_resuming_from_different_epochs_equal_alone(tmp_path: Path) -> None:
    data = str(write_cifar10(tmp_path / "data", per_batch=8))
    cfgs = mixed("cifar10", data, **CIFAR)
    run_dirs = [tmp_path / "t" / c.run_id for c in cfgs]
    # the first cell stops after 1 epoch, the second after 2; the others start fresh in the group
    for cfg, run_dir, epochs in ((cfgs[0], run_dirs[0], 1), (cfgs[1], run_dirs[1], 2)):
        done = iter([0, *range(epochs, 0, -1)])      # not asked to stop before the first epoch
        stopped = train(cfg, tmp_path / "together", run_dir, stop=lambda d=done: next(d, 0) == 1)
        assert stopped.status == "stopped" and stopped.epochs_done == epochs
    together = train_together(cfgs, tmp_path / "together", run_dirs)
    assert [r.resumed_from for r in together] == [1, 2, 0, 0]
    assert_equal_alone(tmp_path, cfgs, together)


def test_small_models_train_together_grouped_within_float32_rounding(tmp_path: Path) -> None:
    cfgs = mixed("two-moons", None, epochs=20, eval_every=5)
    together = train_together(cfgs, tmp_path / "together", [tmp_path / "t" / c.run_id for c in cfgs])
    # the cells trained as one model, by run id in the grouped model's rows (flctl.grouped.model.in_rows), which
    # `flctl reproduce` trains again together
    rows = together[0].trained_with["cells"]
    assert sorted(rows) == sorted(c.run_id for c in cfgs)
    assert [r.trained_with for r in together] == [{"engine": "grouped", "cells_together": 4, "device": "cpu",
                                                   "cells": rows, "threads": 1, "threads_from": "OMP_NUM_THREADS"}] * 4
    assert_close_to_alone(tmp_path, cfgs, together, rtol=1e-4, atol=1e-5)


def assert_close_to_alone(tmp_path: Path, cfgs: list, together: list, rtol: float, atol: float,
                          alone_task=None, monkeypatch=None) -> None:
    """Each cell's records (per-sample losses and multipliers of every eval epoch) equal alone's within tolerance."""
    for cfg, result in zip(cfgs, together, strict=True):
        alone = train(cfg, tmp_path / "alone", tmp_path / "a" / cfg.run_id)
        assert (result.status, result.epochs_done, result.diverged_at) == \
            (alone.status, alone.epochs_done, alone.diverged_at), cfg.method
        order = [("epoch", "ascending"), ("split", "ascending"), ("sample_id", "ascending")]
        a = records.read(tmp_path / "together", [cfg.run_id]).sort_by(order)
        b = records.read(tmp_path / "alone", [cfg.run_id]).sort_by(order)
        assert len(a) == len(b) > 0
        for column in ("loss", "multiplier"):
            x, y = (t[column].to_numpy(zero_copy_only=False).astype(float) for t in (a, b))
            np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, equal_nan=True, err_msg=f"{cfg.method} {column}")


@pytest.mark.slow    # every cell trained again alone: 4 s
def test_grouped_cells_equal_alone_in_float64_and_one_that_diverges_leaves_the_group(tmp_path: Path,
                                                                                     float64) -> None:
    data = str(write_cifar10(tmp_path / "data", per_batch=8))
    cfgs = mixed("cifar10", data, **CIFAR)[:3] + [config("cifar10", "erm", seed=5, lr=1e12, data_dir=data, **CIFAR)]
    together = train_together(cfgs, tmp_path / "together", [tmp_path / "t" / c.run_id for c in cfgs])
    assert [r.status for r in together] == ["completed"] * 3 + ["diverged"]
    assert {r.trained_with["engine"] for r in together} == {"grouped"}
    # it leaves before the last epoch, which the others train as a group of 3 (the diverging cell's own numbers are
    # chaos at lr 1e12: where its first non-finite loss shows depends on the last bit)
    assert together[3].diverged_at is not None and together[3].diverged_at["epoch"] < CIFAR["epochs"]
    assert_close_to_alone(tmp_path, cfgs[:3], together[:3], rtol=1e-9, atol=1e-12)


@pytest.mark.slow    # seven cells together, six again alone: 8 s
def test_cells_of_one_method_step_as_one_and_equal_alone_in_float64(tmp_path: Path, float64) -> None:
    """Several cells of each method (a sweep's usual group: seeds, learning rates, ε, α), grouped by method
    (flctl.grouped.methods.group_methods): FL with nuPI, RFL, ERM and CSERM (which steps alone), and an RFL that
    diverges and leaves its block. Each equals its cell alone; its model.pt holds its own weights only."""
    m = dict(epochs=6, eval_every=2)
    nupi = dict(dual_optimizer="nupi", kp=0.5, ki=0.8, nu=0.3)
    cfgs = [config("two-moons", "fl", seed=0, lr=0.02, eps=0.4, dual_lr=0.05, **nupi, **m),
            config("two-moons", "rfl", seed=1, lr=0.03, eps=0.2, alpha=0.5, **m),
            config("two-moons", "fl", seed=2, lr=0.01, eps=0.3, dual_lr=0.1, **nupi, **m),
            config("two-moons", "erm", seed=3, lr=0.05, **m),
            config("two-moons", "rfl", seed=4, lr=0.02, eps=0.1, alpha=2.0, **m),
            config("two-moons", "cserm", seed=5, lr=0.01, eps=0.3, alpha=2.0, **m),
            config("two-moons", "rfl", seed=6, lr=1e12, eps=0.1, alpha=2.0, **m)]
    together = train_together(cfgs, tmp_path / "together", [tmp_path / "t" / c.run_id for c in cfgs])
    assert [r.status for r in together] == ["completed"] * 6 + ["diverged"]
    assert {r.trained_with["engine"] for r in together} == {"grouped"}
    assert_close_to_alone(tmp_path, cfgs[:6], together[:6], rtol=1e-9, atol=1e-12)
    for c in cfgs[:6]:
        grouped, alone = (torch.load(tmp_path / d / c.run_id / "model.pt", weights_only=True) for d in ("t", "a"))
        assert all(v.untyped_storage().nbytes() == alone[k].untyped_storage().nbytes() for k, v in grouped.items())


@pytest.mark.slow    # every cell trained again alone: 3 s
def test_grouped_cells_resuming_from_different_epochs_equal_alone_in_float64(tmp_path: Path, float64) -> None:
    data = str(write_utkface(tmp_path / "faces", n=40))
    cfgs = [config("utkface", m, seed=s, lr=lr, data_dir=data, **UTK)
            for m, s, lr in (("erm", 0, 1e-3), ("fl", 1, 2e-3), ("rfl", 2, 5e-4))]
    run_dirs = [tmp_path / "t" / c.run_id for c in cfgs]
    done = iter([0, 1])                     # not before the first epoch; after it
    stopped = train(cfgs[0], tmp_path / "together", run_dirs[0], stop=lambda: next(done, 0) == 1)
    assert stopped.status == "stopped" and stopped.epochs_done == 1
    together = train_together(cfgs, tmp_path / "together", run_dirs)
    assert [r.resumed_from for r in together] == [1, 0, 0]
    assert_close_to_alone(tmp_path, cfgs, together, rtol=1e-9, atol=1e-12)


def test_a_grouped_cells_tensors_are_views_of_its_row_and_its_checkpoint_its_own(tmp_path: Path) -> None:
    """After grouping, a cell's parameters and BatchNorm statistics live in its row of the grouped tensors (so its
    optimizer, evaluation and checkpoint see what the grouped step changed), and only there."""
    from flctl.grouped.model import Grouped

    models = [get_task("cifar10").build_model({"width": 4}, None) for _ in range(3)]
    before = [{k: v.clone() for k, v in m.state_dict().items()} for m in models]
    from flctl.methods import ERM

    cells = [SimpleNamespace(model=m, method=ERM(6), epoch_losses=torch.zeros(6), optimizer=None) for m in models]
    group = Grouped(cells)  # type: ignore[arg-type]  # model, method, epoch losses and optimizer are all it reads
    for m, state in zip(models, before):
        assert all(torch.equal(v, state[k]) for k, v in m.state_dict().items())      # values kept
    with torch.no_grad():
        for p in group.module.parameters():
            p.add_(1.0)
    for m, state in zip(models, before):
        assert all(torch.equal(p, state[n] + 1) for n, p in m.named_parameters())    # each row moved, in place
    x = torch.randint(0, 256, (3, 5, 3, 32, 32), dtype=torch.uint8)
    group.forward(x, "fp32")
    for i, m in enumerate(models):                          # each cell's BatchNorm saw its own batch only
        m.train()
        fresh = get_task("cifar10").build_model({"width": 4}, None)
        fresh.load_state_dict({k: before[i][k] + (1 if k in dict(m.named_parameters()) else 0) for k in before[i]})
        fresh.train()
        fresh(x[i])
        for (name, a), b in zip(m.named_buffers(), fresh.buffers()):
            assert torch.allclose(a.float(), b.float(), atol=1e-5), name


@pytest.mark.parametrize("cls", ["FL", "RFL"])
@pytest.mark.parametrize("nupi", [False, True])
def test_grouped_methods_step_each_cells_multipliers_as_its_own(cls: str, nupi: bool) -> None:
    """K methods of a class that groups, stepped as one on [K, B]: each cell's multipliers (and nuPI state) move
    bit for bit as its own method's would alone, stay views of its row (its checkpoint is its own [N]), and the
    grouped objective is each cell's within float rounding (a batched dot product)."""
    from flctl import methods
    from flctl.grouped.methods import group_methods

    n, b = 7, 4
    hyper = [dict(eps=0.1 * i, dual_lr=0.3 + i / 10, alpha=1.0 + i) for i in range(3)]

    def make(h: dict):
        extra = {"nupi": methods.NuPI(n, kp=0.5 + h["eps"], ki=1.5, nu=0.25)} if nupi else {}
        return getattr(methods, cls)(n, eps=h["eps"], dual_lr=h["dual_lr"], alpha=h["alpha"], **extra)

    alone, grouped = [make(h) for h in hyper], [make(h) for h in hyper]
    one = group_methods(grouped)
    assert one.multipliers.shape == (3, n) and one.eps.shape == (3, 1)
    gen = torch.Generator().manual_seed(0)
    for _ in range(4):
        ids = torch.stack([torch.randperm(n, generator=gen)[:b] for _ in hyper])            # [K, B]
        losses = torch.rand(3, b, generator=gen) * 2
        one.dual_step_(losses, ids)
        objectives = one.primal_loss(losses, ids)                                      # [K]
        for k, m in enumerate(alone):
            m.dual_step_(losses[k], ids[k])
            assert torch.allclose(objectives[k], m.primal_loss(losses[k], ids[k]), rtol=1e-6)
    for m, g in zip(alone, grouped):
        assert torch.equal(m.multipliers, g.multipliers) and g.multipliers.shape == (n,)
        assert g.multipliers.data_ptr() != m.multipliers.data_ptr()
        for key, value in g.state_dict().items():
            want = m.state_dict()[key]
            assert (torch.equal(value, want) if isinstance(value, torch.Tensor)
                    else all(torch.equal(value[i], want[i]) for i in want)), key
    assert one.multipliers.data_ptr() == grouped[0].multipliers.data_ptr()    # the cells' rows, not copies


def test_a_subclass_of_a_grouping_method_steps_alone_unless_it_says_it_groups() -> None:
    from flctl import methods
    from flctl.grouped.methods import group_key

    class Rewritten(methods.FL):          # its own rule, perhaps for one cell's [B] only
        pass

    class Declared(methods.FL):
        groups = True

    class DeclaredBefore(methods.FL):     # the name flctl read before `groups`
        stacks = True

    assert group_key(methods.FL(3, eps=0.1, dual_lr=0.1))[0] and group_key(Declared(3, eps=0.1, dual_lr=0.1))[0]
    assert group_key(DeclaredBefore(3, eps=0.1, dual_lr=0.1))[0]
    assert not group_key(Rewritten(3, eps=0.1, dual_lr=0.1))[0] and not group_key(methods.CSERM(3))[0]
    a, b = Declared(3, eps=0.1, dual_lr=0.1), Declared(3, eps=0.2, dual_lr=0.3)
    assert group_key(a) == group_key(b)                      # tensors of one layout: their values may differ
    a.warmup, b.warmup = 0, 5                                # a setting kept as a Python number: one per block
    assert group_key(a) != group_key(b)


def test_a_method_class_that_does_not_say_it_groups_steps_cell_by_cell_and_is_told_once(capsys) -> None:
    """Grouped cells of a method class that does not declare ``groups`` (a plugin's subclass of FL) take their dual
    steps cell by cell, and the class is told so once per process, on stderr, with how to declare it; classes that
    declare either way (FL, CSERM) are not told."""
    from flctl import methods
    from flctl.grouped.model import Grouped

    class Quiet(methods.FL):
        pass

    def cells(*made: methods.Method) -> list:
        return [SimpleNamespace(model=torch.nn.Sequential(torch.nn.Linear(2, 3)), method=m, epoch_losses=torch.zeros(4),
                                optimizer=None) for m in made]

    for _ in range(2):                # a second group of the class in this process: not told again
        group = Grouped(cells(Quiet(4, eps=0.1, dual_lr=0.1), Quiet(4, eps=0.2, dual_lr=0.1),  # type: ignore[arg-type]
                              methods.FL(4, eps=0.1, dual_lr=0.1), methods.CSERM(4)))
        alone = sorted(type(m).__name__ for m, rows in group.methods if isinstance(rows, int))
        assert alone == ["CSERM", "Quiet", "Quiet"]                 # FL's cell is a block of its own class
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("flctl: warning: method class ") and ".Quiet does not declare" in err[0]
    assert "dual steps cell by cell" in err[0] and "`groups = True`" in err[0]


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


@pytest.mark.parametrize("kind", ["adamw", "sgd-momentum", "sgd"])
def test_grouped_optimizer_steps_each_row_as_the_cells_own_optimizer(kind: str) -> None:
    """K cells' optimizers (each its own lr and weight decay, momentum for SGD; one cell resuming with state of its
    own) stepped as one (flctl.grouped.optim) move each cell's parameters and state as torch's optimizer of that
    cell moves a copy of them, over 5 steps of the same gradients; each cell's state stays a view of its row."""
    from flctl.cell import build_optimizer
    from flctl.grouped.optim import grouped_optimizer

    torch.manual_seed(0)
    k, shapes = 3, [(4, 3), (4,)]
    hyper = [dict(lr=0.1, weight_decay=0.0, momentum=0.9), dict(lr=0.03, weight_decay=0.01, momentum=0.5),
             dict(lr=0.2, weight_decay=0.1, momentum=0.0 if kind == "sgd" else 0.7)]
    if kind == "sgd":
        hyper = [{**h, "momentum": 0.0} for h in hyper]
    optimizer = "adamw" if kind == "adamw" else "sgd"
    leaves = [torch.randn(k, *s, dtype=torch.float64) for s in shapes]
    own = [[leaf[i] for leaf in leaves] for i in range(k)]              # views of the rows, as Grouped makes them
    for params in own:
        for p in params:
            p.requires_grad_(True)
    cfgs = [SimpleNamespace(optimizer=optimizer, **h) for h in hyper]
    cells = [SimpleNamespace(optimizer=build_optimizer(c, params), schedule_per_step=False)  # type: ignore[arg-type]
             for c, params in zip(cfgs, own)]
    # the last cell resumes: two steps of its own before the group forms
    for _ in range(2):
        for p in own[2]:
            p.grad = torch.randn_like(p)
        cells[2].optimizer.step()
    copies = [[p.detach().clone().requires_grad_(True) for p in params] for params in own]
    alone = [build_optimizer(c, params) for c, params in zip(cfgs, copies)]  # type: ignore[arg-type]
    alone[2].load_state_dict(cells[2].optimizer.state_dict())
    grouped_leaves = [torch.stack([params[j].detach() for params in own]).requires_grad_(True)
                      for j in range(len(shapes))]
    for i, params in enumerate(own):
        for j, p in enumerate(params):
            p.data = grouped_leaves[j].data[i]
    group = grouped_optimizer(cells, [(leaf, [params[j] for params in own])  # type: ignore[arg-type]
                                      for j, leaf in enumerate(grouped_leaves)])
    assert group is not None
    for _ in range(5):
        grads = [torch.randn_like(leaf) for leaf in grouped_leaves]
        for leaf, g in zip(grouped_leaves, grads):
            leaf.grad = g
        group.step()
        for i, opt in enumerate(alone):
            for j, p in enumerate(copies[i]):
                p.grad = grads[j][i].clone()
            opt.step()
    for i in range(k):
        for j in range(len(shapes)):
            torch.testing.assert_close(grouped_leaves[j][i], copies[i][j], rtol=1e-15, atol=1e-15)
            state, expected = cells[i].optimizer.state[own[i][j]], alone[i].state[copies[i][j]]
            for name, value in expected.items():
                if value is None:
                    continue
                torch.testing.assert_close(state[name].to(value.dtype), value, rtol=1e-15, atol=1e-15)
                if name != "step":
                    assert state[name].data_ptr() == group.state[name][j][i].data_ptr()  # a view of its row


def test_the_compiled_captured_engine_is_compiled_replayed_and_runs_as_compiled_does() -> None:
    """--engine compiled-captured (the compiled step captured as CUDA graphs) computes what compiled computes: the same
    run; it is refused off CUDA as captured is. tests/test_gpu_engine.py holds its records equal to compiled's on a
    GPU."""
    from flctl.devices import CAPTURED_ENGINES, COMPILED_ENGINES
    from flctl.errors import ConfigError

    compiled = config("two-moons", "fl", engine="compiled", device="cuda")
    both = config("two-moons", "fl", engine="compiled-captured", device="cuda")
    assert both.run_id == compiled.run_id != config("two-moons", "fl", device="cuda").run_id
    assert "compiled-captured" in CAPTURED_ENGINES and "compiled-captured" in COMPILED_ENGINES
    with pytest.raises(ConfigError, match="compiled-captured replays CUDA graphs"):
        config("two-moons", "fl", engine="compiled-captured")
    # captured-streams: captured's kernels, each cell on a stream of its own (tests/test_gpu_faults.py): eager's run
    assert config("two-moons", "fl", engine="captured-streams", device="cuda").run_id == \
        config("two-moons", "fl", device="cuda").run_id
    with pytest.raises(ConfigError, match="a warm-up moves the learning rate every step"):
        config("two-moons", "fl", engine="captured-streams", device="cuda", warmup_steps=10)
