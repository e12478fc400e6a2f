"""The update rules, checked against hand computations (DESIGN.md §2, paper Eqs. 3, 6, 7)."""

from __future__ import annotations

import math

import pytest
import torch

from flctl.methods import CSERM, ERM, FL, LAMBDA_CAP, METHODS, RFL, NuPI, eps_from_p_min, get_method


def t(*v: float) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.float32)


def test_registry_lists_the_four_methods() -> None:
    assert list(METHODS) == ["erm", "cserm", "fl", "rfl"]
    with pytest.raises(ValueError, match="choose one of: erm, cserm, fl, rfl"):
        get_method("sgd")


def test_erm_is_the_mean_loss() -> None:
    losses = t(0.5, 2.0, 1.0)
    assert ERM(3).primal_loss(losses, torch.arange(3)).item() == pytest.approx(3.5 / 3)


def test_cserm_is_half_alpha_mean_clamped_square() -> None:
    losses, eps, alpha = t(0.5, 2.0, 1.0, 0.1), 0.6, 3.0
    # [g - eps]+ = 0, 1.4, 0.4, 0  ->  (alpha/2) * mean(0, 1.96, 0.16, 0) = 1.5 * 0.53
    got = CSERM(4, eps=eps, alpha=alpha).primal_loss(losses, torch.arange(4))
    assert got.item() == pytest.approx(1.5 * (1.96 + 0.16) / 4, rel=1e-6)


def test_fl_dual_step_then_primal_by_hand() -> None:
    fl = FL(5, eps=0.5, dual_lr=0.1)
    ids = torch.tensor([3, 0, 4])
    # step 1: lambda_B = [0 + 0.1*(g - 0.5)]+ for g = 1.5, 0.2, 0.9  ->  0.1, 0, 0.04
    losses = t(1.5, 0.2, 0.9).requires_grad_()
    fl.dual_step_(losses, ids)
    torch.testing.assert_close(fl.multipliers, t(0.0, 0.0, 0.0, 0.1, 0.04))
    obj = fl.primal_loss(losses, ids)
    assert obj.item() == pytest.approx(0.1 * 1.5 + 0.0 * 0.2 + 0.04 * 0.9, rel=1e-6)
    obj.backward()  # lambda is detached: d obj / d g_i = lambda_i
    torch.testing.assert_close(losses.grad, t(0.1, 0.0, 0.04))
    # step 2 on other samples and one repeat: only the batch's entries move
    fl.dual_step_(t(0.0, 0.3), torch.tensor([3, 1]))
    # id 3: 0.1 + 0.1*(0 - 0.5) = 0.05 ; id 1: [0 + 0.1*(0.3-0.5)]+ = 0
    torch.testing.assert_close(fl.multipliers, t(0.0, 0.0, 0.0, 0.05, 0.04))
    fl.dual_step_(t(0.0), torch.tensor([3]))
    assert fl.multipliers[3].item() == 0.0   # projected at zero, not negative


def test_rfl_dual_step_by_hand() -> None:
    rfl = RFL(3, eps=0.5, alpha=2.0, dual_lr=0.1)
    ids = torch.tensor([0, 1, 2])
    rfl.multipliers.copy_(t(1.0, 0.0, 0.2))
    rfl.dual_step_(t(1.5, 0.7, 0.0), ids)
    # lambda + eta*(g - eps - lambda/alpha):  1 + .1*(1 - .5) = 1.05 ; 0 + .1*.2 = .02 ; [.2 + .1*(-.5 - .1)]+ = .14
    torch.testing.assert_close(rfl.multipliers, t(1.05, 0.02, 0.14))


def test_dual_step_does_not_touch_the_graph() -> None:
    losses = t(1.0, 2.0).requires_grad_()
    fl = FL(2, eps=0.0, dual_lr=1.0)
    fl.dual_step_(losses, torch.arange(2))
    assert not fl.multipliers.requires_grad


def test_infeasible_fl_multipliers_stay_finite_at_the_cap() -> None:
    fl = FL(2, eps=0.0, dual_lr=1e30)
    for _ in range(5):
        fl.dual_step_(t(1e10, 1.0), torch.arange(2))
    assert torch.isfinite(fl.multipliers).all()
    assert fl.multipliers[0].item() == pytest.approx(LAMBDA_CAP, rel=1e-6)  # float32 nearest
    assert math.isfinite(fl.primal_loss(t(1e10, 1.0), torch.arange(2)).item())


def test_state_dict_round_trip() -> None:
    a = RFL(4, eps=0.1, alpha=1.0, dual_lr=0.5)
    a.dual_step_(t(1.0, 2.0), torch.tensor([1, 2]))
    b = RFL(4, eps=0.1, alpha=1.0, dual_lr=0.5)
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(a.multipliers, b.multipliers)


def test_nupi_fl_steps_by_hand() -> None:
    fl = FL(3, eps=0.5, dual_lr=0.1, nupi=NuPI(3, kp=2.0, ki=0.5, nu=0.5))
    # visit 1 of samples 0, 1: e = g - eps = 1.0, -0.3; a first visit has no P term (xi_-1 = e_0):
    # lambda = [0 + 0.1 * 0.5 * e]+ = 0.05, 0 ; xi = e
    fl.dual_step_(t(1.5, 0.2), torch.tensor([0, 1]))
    torch.testing.assert_close(fl.multipliers, t(0.05, 0.0, 0.0))
    # sample 0 again, e = 0.4: xi = 0.5 * 1.0 + 0.5 * 0.4 = 0.7, P = 2 * (0.7 - 1.0) = -0.6, I = 0.5 * 0.4 = 0.2,
    # lambda = [0.05 + 0.1 * (0.2 - 0.6)]+ = 0.01 ; sample 2's first visit, e = 0.8: lambda = 0.1 * 0.5 * 0.8 = 0.04
    fl.dual_step_(t(0.9, 1.3), torch.tensor([0, 2]))
    torch.testing.assert_close(fl.multipliers, t(0.01, 0.0, 0.04))
    # sample 0, e = 0: xi = 0.35, P = 2 * (0.35 - 0.7) = -0.7: lambda = [0.01 - 0.07]+ = 0 ; samples 1, 2 keep xi
    fl.dual_step_(t(0.5), torch.tensor([0]))
    torch.testing.assert_close(fl.multipliers, t(0.0, 0.0, 0.04))
    torch.testing.assert_close(fl.nupi.xi, t(0.35, -0.3, 0.8))


def test_nupi_rfl_error_includes_the_dual_decay() -> None:
    rfl = RFL(2, eps=0.5, alpha=2.0, dual_lr=0.1, nupi=NuPI(2, kp=1.0, ki=1.0, nu=0.0))
    rfl.multipliers.copy_(t(1.0, 0.0))
    # e = g - eps - lambda/alpha = 1.0 - 0.5, 0.2 - 0 ; first visits: lambda + 0.1 * e = 1.05, 0.02
    rfl.dual_step_(t(1.5, 0.7), torch.tensor([0, 1]))
    torch.testing.assert_close(rfl.multipliers, t(1.05, 0.02))
    # e = 0 - 1.05 / 2 = -0.525 ; nu = 0: xi = e, P = 1 * (-0.525 - 0.5) ; lambda = 1.05 + 0.1 * (-0.525 - 1.025)
    rfl.dual_step_(t(0.5), torch.tensor([0]))
    torch.testing.assert_close(rfl.multipliers, t(0.895, 0.02))


@pytest.mark.parametrize("cls,kw", [(FL, {}), (RFL, {"alpha": 0.7})])
def test_nupi_with_gd_gains_is_gd_bit_for_bit(cls, kw) -> None:
    gd = cls(50, eps=0.3, dual_lr=0.37, **kw)
    pi = cls(50, eps=0.3, dual_lr=0.37, nupi=NuPI(50, kp=0.0, ki=1.0, nu=0.0), **kw)
    g = torch.Generator().manual_seed(0)
    for _ in range(40):
        ids = torch.randperm(50, generator=g)[:16]
        losses = torch.rand(16, generator=g) * 0.7        # around eps: some multipliers end at 0
        gd.dual_step_(losses, ids)
        pi.dual_step_(losses, ids)
        assert torch.equal(gd.multipliers, pi.multipliers)
    assert (gd.multipliers > 0).any() and (gd.multipliers == 0).any()


def test_nupi_state_round_trip() -> None:
    a = FL(4, eps=0.1, dual_lr=0.5, nupi=NuPI(4, kp=1.0, ki=1.0, nu=0.3))
    a.dual_step_(t(1.0, 2.0), torch.tensor([1, 2]))
    b = FL(4, eps=0.1, dual_lr=0.5, nupi=NuPI(4, kp=1.0, ki=1.0, nu=0.3))
    b.load_state_dict(a.state_dict())
    for m in (a, b):
        m.dual_step_(t(0.4, 3.0), torch.tensor([2, 3]))
    assert torch.equal(a.multipliers, b.multipliers) and torch.equal(a.nupi.xi, b.nupi.xi)


def test_p_min_to_eps() -> None:
    assert eps_from_p_min(0.6) == pytest.approx(0.5108, abs=1e-4)
    assert eps_from_p_min(1.0) == 0.0
