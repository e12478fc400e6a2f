"""Pruning satisfied samples (flctl.pruning): the rule by hand, what the records say about it, and resume."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from flctl import records
from flctl.methods import CSERM, FL
from flctl.pruning import Pruner
from flctl.train import train
from tests.helpers import config


def test_pruner_by_hand() -> None:
    p = Pruner(4, after=1, patience=2)
    order = torch.tensor([2, 0, 3, 1])
    assert torch.equal(p.epoch_order(order, 0), order)                     # before epoch `after`: nothing pruned
    p.visited(torch.tensor([0, 1, 2]), torch.tensor([True, True, False]))
    p.visited(torch.tensor([0, 2, 3]), torch.tensor([True, True, True]))
    # streaks: 0 -> 2, 1 -> 1, 2 -> 1 (reset, then one), 3 -> 1: only sample 0 has 2 satisfied visits in a row
    assert p.streak.tolist() == [2, 1, 1, 1]
    assert p.epoch_order(order, 1).tolist() == [2, 3, 1]                   # the seeded order, without sample 0
    p.visited(torch.tensor([1]), torch.tensor([True]))
    assert p.epoch_order(order, 2).tolist() == [2, 3]                      # sample 1 joins at the epoch boundary
    p.evaluated(np.array([0.9, 0.1, 0.2, 0.2]), eps=0.5)                   # sample 0's loss is above eps again
    assert p.pruned.tolist() == [False, True, False, False] and p.streak[0] == 0
    assert p.epoch_order(order, 3).tolist() == [2, 0, 3]


def test_satisfied_is_a_zero_multiplier_for_fl_and_loss_at_most_eps_for_cserm() -> None:
    fl = FL(3, eps=0.5, dual_lr=1.0)
    fl.multipliers.copy_(torch.tensor([0.0, 0.3, 0.0]))
    losses, ids = torch.tensor([0.2, 0.9, 0.7]), torch.arange(3)
    fl.dual_step_(losses, ids)                             # [0 - 0.3]+, 0.3 + 0.4, 0 + 0.2
    assert fl.satisfied(losses, ids).tolist() == [True, False, False]
    assert CSERM(3, eps=0.5, alpha=1.0).satisfied(losses, ids).tolist() == [True, False, False]


@pytest.mark.parametrize("method,extra", [("fl", {}), ("cserm", {"alpha": 1.0})])
def test_records_show_what_was_pruned_and_samples_seen_counts_the_visits(tmp_path: Path, method, extra) -> None:
    eps, after, n = 0.3, 3, 1000
    cfg = config("two-moons", method, epochs=12, eval_every=1, eps=eps, prune_after=after, prune_patience=2,
                 lr=5e-3, **extra)
    result = train(cfg, tmp_path / "records", tmp_path / "run")
    rec = {k: records.read(tmp_path / "records", [cfg.run_id], split="train", epoch=k).sort_by("sample_id")
           for k in range(1, 13)}
    pruned = {k: r["pruned"].to_numpy(zero_copy_only=False) for k, r in rec.items()}
    loss = {k: r["loss"].to_numpy() for k, r in rec.items()}
    seen = [h["metrics"]["train.samples_seen"] for h in result.history]
    assert not any(pruned[k].any() for k in range(1, after + 1))            # nothing before epoch after + 1
    assert pruned[12].any()
    # Each epoch back-propagates the samples not pruned in it; the records' pruned column is that epoch's.
    expected = np.cumsum([n - int(pruned[k].sum()) for k in range(1, 13)])
    assert seen == expected.tolist()
    for k in range(after + 1, 12):
        came_back = pruned[k] & (loss[k] > eps)
        assert not (pruned[k + 1] & came_back).any()                        # back in the next epoch's order
        assert (pruned[k] & ~came_back <= pruned[k + 1]).all()              # the others stay out
    assert result.metrics["train.pruned_share"] == pytest.approx(pruned[12].mean())
    test = records.read(tmp_path / "records", [cfg.run_id], split="test", epoch=12)
    assert test["pruned"].null_count == len(test)


def test_unpruned_runs_count_samples_seen_too(tmp_path: Path) -> None:
    cfg = config("two-moons", "erm", epochs=3, eval_every=3)
    result = train(cfg, tmp_path / "records", tmp_path / "run")
    assert result.metrics["train.samples_seen"] == 3 * 1000 and "train.pruned_share" not in result.metrics
    assert records.read(tmp_path / "records", [cfg.run_id])["pruned"].null_count == 2 * 1000
