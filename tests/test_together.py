"""Cells trained together (train_together; two-moons and digits: one grouped model) equal the same cells trained
alone, and which cells may train together."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flctl import records
from flctl.train import train, train_together
from tests.helpers import config

ORDER = [("epoch", "ascending"), ("split", "ascending"), ("sample_id", "ascending")]


def cells(task: str, **shared) -> list:
    """One cell per method, each with its own seed, lr, dual lr, eps and alpha."""
    return [
        config(task, "erm", seed=0, lr=1e-3, **shared),
        config(task, "cserm", seed=1, lr=2e-3, eps=0.2, **shared),
        config(task, "fl", seed=2, lr=5e-4, eps=0.1, dual_lr=2e-2, **shared),
        config(task, "rfl", seed=3, lr=1e-3, eps=0.3, alpha=0.5, dual_lr=1e-2, **shared),
    ]


def assert_same_records(a_root: Path, b_root: Path, run_id: str) -> None:
    a = records.read(a_root, [run_id]).sort_by(ORDER)
    b = records.read(b_root, [run_id]).sort_by(ORDER)
    assert len(a) == len(b) > 0
    for column in ("epoch", "split", "sample_id", "target"):
        assert a[column].equals(b[column]), column
    for column in ("loss", "multiplier"):
        x, y = (t[column].to_numpy(zero_copy_only=False) for t in (a, b))
        np.testing.assert_allclose(np.nan_to_num(x, nan=-1.0), np.nan_to_num(y, nan=-1.0), rtol=1e-4, atol=1e-5,
                                   err_msg=column)


@pytest.mark.parametrize("task,shared", [("two-moons", dict(epochs=20, eval_every=10)),
                                         ("digits", dict(epochs=1, eval_every=1))])
def test_together_equals_alone_for_every_method(tmp_path: Path, task: str, shared: dict) -> None:
    cfgs = cells(task, **shared)
    together = train_together(cfgs, tmp_path / "together", [tmp_path / "t" / c.run_id for c in cfgs])
    for cfg, result in zip(cfgs, together):
        alone = train(cfg, tmp_path / "alone", tmp_path / "a" / cfg.run_id)
        assert result.status == alone.status == "completed"
        assert result.metrics == pytest.approx(alone.metrics, rel=1e-4, abs=1e-5)
        assert_same_records(tmp_path / "alone", tmp_path / "together", cfg.run_id)


def test_a_diverging_cell_stops_and_the_others_go_on(tmp_path: Path) -> None:
    sgd = dict(optimizer="sgd", epochs=4, eval_every=2)
    cfgs = [config("diabetes", "fl", seed=0, lr=1e-2, **sgd), config("diabetes", "fl", seed=1, lr=1e3, **sgd),
            config("diabetes", "erm", seed=2, lr=1e-2, **sgd)]
    together = train_together(cfgs, tmp_path / "together", [tmp_path / "t" / c.run_id for c in cfgs])
    assert [r.status for r in together] == ["completed", "diverged", "completed"]
    assert together[1].diverged_at["epoch"] == 1
    for cfg, result in zip(cfgs, together):
        alone = train(cfg, tmp_path / "alone", tmp_path / "a" / cfg.run_id)
        assert alone.status == result.status and alone.diverged_at == result.diverged_at
        if result.status == "completed":
            assert_same_records(tmp_path / "alone", tmp_path / "together", cfg.run_id)


def test_cells_resumed_at_different_epochs_train_together(tmp_path: Path) -> None:
    class Interrupt(Exception):
        pass

    cfgs = cells("two-moons", epochs=12, eval_every=3)[2:]
    dirs = [tmp_path / "t" / c.run_id for c in cfgs]

    def stop_first_at_6(stats) -> None:
        if stats.run_id == cfgs[0].run_id and stats.epoch == 6:
            raise Interrupt

    # Interrupted after the first cell's epoch 6, before the second cell's: checkpoints at epochs 6 and 5.
    with pytest.raises(Interrupt):
        train_together(cfgs, tmp_path / "together", dirs, on_epoch=stop_first_at_6, checkpoint_every=0.0)
    resumed = train_together(cfgs, tmp_path / "together", dirs)
    assert [r.resumed_from for r in resumed] == [6, 5]
    for cfg in cfgs:
        train(cfg, tmp_path / "alone", tmp_path / "a" / cfg.run_id)
        assert_same_records(tmp_path / "alone", tmp_path / "together", cfg.run_id)


def test_cells_that_differ_beyond_per_cell_fields_are_refused(tmp_path: Path) -> None:
    """One rule (flctl.grouped.policy.can_train_together) for the worker's claim and the trainer: per-cell fields may
    differ, nothing else; a solver task's cells never group; a cell alone always trains."""
    from flctl.grouped.policy import can_train_together

    base = config("two-moons", "fl", epochs=2)
    assert can_train_together([base, config("two-moons", "rfl", seed=3, epochs=2, alpha=0.5)])
    assert not can_train_together([base, config("two-moons", "fl", epochs=3)])
    assert not can_train_together([base, config("two-moons", "fl", epochs=2, engine="compiled")])
    assert not can_train_together([base, config("two-moons", "fl", epochs=2, prune_after=1)])
    assert not can_train_together([config("polyfit", "fl", seed=0), config("polyfit", "fl", seed=1)])
    assert can_train_together([config("polyfit", "fl")]) and can_train_together([base])
    with pytest.raises(ValueError, match="cannot train together"):
        train_together([config("two-moons", "fl", epochs=2), config("two-moons", "fl", epochs=3)], tmp_path,
                       [tmp_path / "a", tmp_path / "b"])


def test_a_cell_that_leaves_the_group_is_recorded_then_not_when_the_group_ends(tmp_path: Path) -> None:
    from flctl.db import RunQueue, Store
    from flctl.layout import Layout
    from flctl.runner import train_claimed

    sgd = dict(optimizer="sgd", epochs=120, eval_every=40)
    cfgs = [config("diabetes", "fl", seed=0, lr=1e-2, **sgd), config("diabetes", "fl", seed=1, lr=1e3, **sgd)]
    store = Store.open(f"sqlite:///{tmp_path / 'flctl.db'}")
    store.add_runs(cfgs)
    tokens = {c.run_id: RunQueue(store).claim_run(c.run_id) for c in cfgs}
    assert all(tokens.values())
    seen: dict[int, str | None] = {}

    def watch(stats) -> None:          # while the first cell trains on, the diverged one is already recorded
        if stats.run_id == cfgs[0].run_id and stats.epoch == 60:
            seen[60] = store.get_run(cfgs[1].run_id).status

    train_claimed(cfgs, tokens, store, Layout(tmp_path), on_epoch=watch)
    ok, bad = (store.get_run(c.run_id) for c in cfgs)
    assert seen[60] == "diverged" and bad.status == "diverged" and ok.status == "completed"
    # its own time: claim to divergence (data loading included), shorter by the 119 epochs the other trained on
    assert bad.duration_s < ok.duration_s
    assert bad.artifacts["records"] and ok.epochs_done == 120
