"""The training loop: frozen-primal multiplier dynamics, resume = uninterrupted, divergence, determinism."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest
import torch

from flctl import records
from flctl.layout import records_of
from flctl.train import train
from tests.helpers import config


def train_records(cfg, root: Path, epoch: int | None = None):
    table = records.read(root / "records", [cfg.run_id], split="train", epoch=epoch)
    return table.sort_by("sample_id")


def run(cfg, root: Path, **kw):
    return train(cfg, root / "records", root / "runs" / cfg.run_id, **kw)


def test_frozen_primal_fl_multipliers_are_epochs_times_lr_times_violation(tmp_path: Path) -> None:
    # lr = 0 freezes the model, so every sample's loss g_i is constant; each epoch visits each sample once,
    # hence lambda_i = E * eta * [g_i - eps]_+ exactly (DESIGN.md §2, FL dual step).
    E, eta, eps = 4, 0.05, 0.6
    cfg = config("two-moons", "fl", lr=0.0, epochs=E, dual_lr=eta, eps=eps, eval_every=E, batch_size=128)
    run(cfg, tmp_path)
    rec = train_records(cfg, tmp_path)
    g = rec["loss"].to_numpy()
    expected = E * eta * np.clip(g - eps, 0, None)
    assert (expected > 0).any() and (expected == 0).any()     # both active and inactive constraints
    np.testing.assert_allclose(rec["multiplier"].to_numpy(), expected, rtol=1e-5, atol=1e-7)


def test_frozen_primal_rfl_multipliers_tend_to_alpha_times_violation(tmp_path: Path) -> None:
    # RFL's fixed point is lambda* = alpha [g - eps]_+ (Prop. 2); with eta/alpha = 0.2 the error shrinks by
    # 0.8 per epoch, so 80 epochs leave it below 1e-7 of the start.
    alpha, eta, eps = 0.5, 0.1, 0.6
    cfg = config("two-moons", "rfl", lr=0.0, epochs=80, dual_lr=eta, eps=eps, alpha=alpha, eval_every=80)
    run(cfg, tmp_path)
    rec = train_records(cfg, tmp_path)
    expected = alpha * np.clip(rec["loss"].to_numpy() - eps, 0, None)
    assert expected.max() > 0.1
    np.testing.assert_allclose(rec["multiplier"].to_numpy(), expected, atol=1e-5)


def test_erm_summary_is_the_mean_of_its_records(tmp_path: Path) -> None:
    cfg = config("diabetes", "erm", epochs=3, eval_every=3)
    result = run(cfg, tmp_path)
    for split in ("train", "test"):
        rec = records.read(tmp_path / "records", [cfg.run_id], split=split)
        assert result.metrics[f"{split}.avg_loss"] == pytest.approx(pc.mean(rec["loss"]).as_py())
        assert result.metrics[f"{split}.max_loss"] == pytest.approx(pc.max(rec["loss"]).as_py())
        assert rec["multiplier"].null_count == len(rec)      # ERM has no multipliers
    assert "train.violation_rate" not in result.metrics        # ERM has no eps


class Interrupt(Exception):
    pass


@pytest.mark.parametrize("task,method,extra", [
    ("two-moons", "rfl", {}), ("digits", "fl", {"batch_size": 256}),
    ("two-moons", "fl", {"dual_optimizer": "nupi", "kp": 1.0, "nu": 0.5}),      # xi comes back too
    ("two-moons", "fl", {"eps": 0.4, "lr": 5e-3, "prune_after": 1, "prune_patience": 1}),   # streaks, pruned set
])
def test_resume_after_interruption_equals_uninterrupted(tmp_path: Path, task: str, method: str, extra) -> None:
    cfg = config(task, method, epochs=6, eval_every=2, **extra)
    whole = run(cfg, tmp_path / "a")

    def stop_after_3(stats):
        if stats.epoch == 3:
            raise Interrupt
    with pytest.raises(Interrupt):
        run(cfg, tmp_path / "b", on_epoch=stop_after_3, checkpoint_every=0.0)
    assert (tmp_path / "b" / "runs" / cfg.run_id / "checkpoint.pt").exists()
    resumed = run(cfg, tmp_path / "b")

    assert resumed.resumed_from == 3
    assert resumed.metrics == whole.metrics and resumed.history == whole.history
    a = records.read(tmp_path / "a" / "records", [cfg.run_id])
    b = records.read(tmp_path / "b" / "records", [cfg.run_id])
    assert a.equals(b)
    sa = torch.load(tmp_path / "a" / "runs" / cfg.run_id / "model.pt")
    sb = torch.load(tmp_path / "b" / "runs" / cfg.run_id / "model.pt")
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not (tmp_path / "b" / "runs" / cfg.run_id / "checkpoint.pt").exists()


def test_nupi_with_gd_gains_records_exactly_what_gd_records(tmp_path: Path) -> None:
    for method in ("fl", "rfl"):
        gd = config("two-moons", method, epochs=3, eval_every=1)
        pi = config("two-moons", method, epochs=3, eval_every=1, dual_optimizer="nupi")   # kp 0, ki 1, nu 0
        assert gd.run_id != pi.run_id
        run(gd, tmp_path)
        run(pi, tmp_path)
        a, b = (records.read(tmp_path / "records", [c.run_id]).drop_columns(["run_id"]) for c in (gd, pi))
        assert a.sort_by([("epoch", "ascending"), ("split", "ascending"), ("sample_id", "ascending")]).equals(
            b.sort_by([("epoch", "ascending"), ("split", "ascending"), ("sample_id", "ascending")]))


def test_full_batch_nupi_steps_follow_from_the_records(tmp_path: Path) -> None:
    # Full batch, records every epoch: epoch k's records hold lambda_k and the losses at theta_k, which are the
    # losses of step k+1. With nu = 0, xi_t = e_t, so for k >= 2
    #   lambda_{k+1} = [lambda_k + eta (K_I e_{k+1} + K_P (e_{k+1} - e_k))]+,  e_{k+1} = loss_k - eps.
    eta, eps, kp, ki = 0.05, 0.68, 3.0, 0.5
    cfg = config("two-moons", "fl", epochs=8, eval_every=1, batch_size=1000, lr=0.02, dual_lr=eta, eps=eps,
                 dual_optimizer="nupi", kp=kp, ki=ki)
    run(cfg, tmp_path)
    rec = {k: train_records(cfg, tmp_path, epoch=k) for k in range(1, 9)}
    loss = {k: r["loss"].to_numpy().astype(np.float64) for k, r in rec.items()}
    lam = {k: r["multiplier"].to_numpy().astype(np.float64) for k, r in rec.items()}
    moved = 0
    for k in range(2, 8):
        e_next, e_now = loss[k] - eps, loss[k - 1] - eps
        expected = np.clip(lam[k] + eta * (ki * e_next + kp * (e_next - e_now)), 0, None)
        np.testing.assert_allclose(lam[k + 1], expected, rtol=1e-4, atol=1e-6)
        moved += int(((lam[k] > 0) & (lam[k + 1] == 0)).sum())
    assert (lam[8] > 0).any() and moved > 0       # both branches of the projection


class _Planted:
    """A pickle that would run code when loaded: what someone could leave in a shared results folder."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_planted_pickle_in_a_checkpoint_is_refused_not_run(tmp_path: Path, capsys) -> None:
    # refused like any checkpoint that cannot be loaded: set aside (kept for a look), and the run starts over
    cfg = config("two-moons", "fl", epochs=2)
    run_dir = tmp_path / "runs" / cfg.run_id
    run_dir.mkdir(parents=True)
    marker = tmp_path / "pwned"
    torch.save({"epoch": 1, "payload": _Planted(marker)}, run_dir / "checkpoint.pt")
    result = run(cfg, tmp_path)
    assert not marker.exists()
    assert result.status == "completed" and result.resumed_from == 0 and result.epochs_done == 2
    assert len(list(run_dir.glob("checkpoint.pt.corrupt-*"))) == 1
    assert "Weights only load failed" in capsys.readouterr().err


def test_same_seed_same_records_other_seed_differs(tmp_path: Path) -> None:
    cfg = config("two-moons", "fl", epochs=3, eval_every=3)
    run(cfg, tmp_path / "a")
    run(cfg, tmp_path / "b")
    other = config("two-moons", "fl", epochs=3, eval_every=3, seed=1)
    run(other, tmp_path / "c")
    a, b = train_records(cfg, tmp_path / "a"), train_records(cfg, tmp_path / "b")
    c = train_records(other, tmp_path / "c")
    assert a.equals(b)
    assert not np.array_equal(a["loss"].to_numpy(), c["loss"].to_numpy())


def test_nan_ends_the_run_as_diverged_with_its_epoch_and_step(tmp_path: Path) -> None:
    cfg = config("diabetes", "erm", optimizer="sgd", lr=1e8, epochs=5, batch_size=64)
    result = run(cfg, tmp_path)
    assert result.status == "diverged"
    assert result.diverged_at["epoch"] >= 1 and result.diverged_at["step"] >= 1
    assert result.epochs_done == result.diverged_at["epoch"]
    assert "model" not in result.artifacts


def test_infeasible_fl_keeps_multipliers_finite(tmp_path: Path) -> None:
    # eps = 0 with a frozen model is infeasible; a huge dual lr pushes lambda to the cap, not to inf.
    cfg = config("two-moons", "fl", lr=0.0, eps=0.0, dual_lr=1e38, epochs=2, eval_every=2)
    result = run(cfg, tmp_path)
    lam = train_records(cfg, tmp_path)["multiplier"].to_numpy()
    assert np.isfinite(lam).all()
    assert result.lambda_capped > 0


def test_records_are_ordered_complete_and_atomic(tmp_path: Path) -> None:
    cfg = config("digits", "fl", epochs=2, eval_every=1, batch_size=256)
    result = run(cfg, tmp_path)
    folder = records_of(tmp_path / "records", cfg.run_id)
    assert sorted(p.name for p in folder.iterdir()) == [records.CHECKSUMS, "epoch=00001.parquet", "epoch=00002.parquet"]
    table = records.read(tmp_path / "records", [cfg.run_id], epoch=2)
    assert table.schema.equals(records.SCHEMA)
    for split, n in (("train", 1347), ("test", 450)):
        rows = table.filter(pc.equal(table["split"], split))
        assert rows["sample_id"].to_pylist() == list(range(n))
        assert rows["multiplier"].null_count == (n if split == "test" else 0)
        acc = np.mean(rows["correct"].to_numpy(zero_copy_only=False))
        assert result.metrics[f"{split}.accuracy"] == pytest.approx(acc)


def test_two_moons_keeps_its_mlp_not_a_grid_and_the_figure_evaluates_it_as_torch_does(tmp_path: Path) -> None:
    # A cell evaluates no decision grid (40,000 forward passes, a quarter of a 1-epoch cell): it keeps the MLP's
    # layers, and the multipliers figure evaluates them on the grid in numpy, as the trained model computes.
    from flctl.cell import load_trainable_state
    from flctl.report.plots.multipliers import GRID_KEYS, PROBABILITY, class1_probability
    from flctl.tasks import get_task

    cfg = config("two-moons", "erm", epochs=2)
    result = run(cfg, tmp_path)
    extras = dict(np.load(result.artifacts["extras"]))
    assert PROBABILITY not in extras and set(GRID_KEYS) <= set(extras)
    assert extras["grid_x"].shape == extras["grid_y"].shape == (200,)
    task = get_task("two-moons")
    data = task.load(cfg.opts, None)
    model = task.build_model(cfg.opts, data)
    load_trainable_state(model, torch.load(result.artifacts["model"], weights_only=True))
    calls: list[int] = []
    model.register_forward_hook(lambda *_: calls.append(1))
    assert set(task.extras(model, data, cfg.opts)) == set(extras) and not calls     # no forward pass in a cell

    xx, yy = np.meshgrid(extras["grid_x"], extras["grid_y"])
    with torch.no_grad():
        logits = model(torch.from_numpy(np.stack([xx.ravel(), yy.ravel()], axis=1)))
    want = torch.softmax(logits, dim=-1)[:, 1].numpy().reshape(xx.shape)
    got = class1_probability(extras, "a two-moons run")
    assert got.shape == (200, 200) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("degree", [10, 20, 30])
def test_polyfit_fl_satisfies_every_constraint_and_erm_interpolates_when_overparameterized(
        tmp_path: Path, degree: int) -> None:
    fl = config("polyfit", "fl", options={"degree": degree})
    erm = config("polyfit", "erm", options={"degree": degree})
    run(fl, tmp_path)
    run(erm, tmp_path)
    fl_loss = train_records(fl, tmp_path)["loss"].to_numpy()
    assert fl_loss.max() <= fl.eps + 1e-4                       # |p(x_i) - y_i| <= eps = sigma
    erm_loss = train_records(erm, tmp_path)["loss"].to_numpy()
    if degree + 1 >= 20:
        assert erm_loss.max() < 1e-6                             # 20 points, >= 20 coefficients
    extras = np.load(tmp_path / "runs" / fl.run_id / "extras.npz")
    assert extras["coefficients"].shape == (degree + 1,)
    assert train_records(fl, tmp_path)["multiplier"].null_count == 0
