"""Cross-check flctl's FL and RFL updates against Cooper (``cooper-optim``) on identical batches.

Feasible Learning is the constrained problem ``min_θ 0  s.t.  g_i(θ) - ε <= 0`` for every training sample
i, with one Lagrange multiplier per sample. In Cooper that is a ``ConstrainedMinimizationProblem`` with one
inequality ``Constraint`` (Lagrangian formulation) whose ``IndexedMultiplier`` holds the n multipliers; each
step observes only the batch's constraints, selected by ``ConstraintState(constraint_features=ids)``.

Why the two implementations must agree step for step (read from Cooper 1.0.1's source):

* ``AlternatingDualPrimalOptimizer.roll`` computes the CMP state once at θ_t, steps the dual first and then
  the primal with λ_{t+1}, reusing that state (no second forward pass) - the order of ``train_step``.
* The dual Lagrangian is ``Σ_{i∈B} λ_i (g_i - ε)`` with the violations detached: its gradient is the raw
  violation of each batch sample (a sum over the batch, not a mean), and only those rows get a gradient
  (sparse embedding lookup), so unobserved multipliers do not move - as in flctl.
* The dual optimizer must have ``maximize=True`` (Cooper checks), so ``SGD(lr=η)`` gives ``λ + η(g - ε)``;
  ``post_step_`` then projects inequality multipliers with a ReLU (flctl's clamp at 0; its cap of 1e12 is
  never reached here).
* The primal Lagrangian is ``f + Σ λ_i.detach() (g_i - ε)`` with ``f`` absent (``loss=None``, FL has no
  objective); the constant ``-ε`` has no θ-gradient, so it equals flctl's ``Σ λ_i g_i``.

RFL: Cooper 1.0.1 has no formulation for the quadratically regularized ("resilient") dual; its formulations
are Lagrangian, QuadraticPenalty and AugmentedLagrangian, none of which adds ``-‖λ‖²/(2α)`` to the dual
Lagrangian. The RFL ascent ``λ + η(g - ε - λ/α)`` is however gradient ascent on
``λ_B·(g - ε) - ‖λ_B‖²/(2α)``, i.e. a dual weight decay of ``1/α`` on the observed multipliers only.
Cooper's own ``nuPI`` dual optimizer does exactly that: with ``Kp=0, Ki=1, ema_nu=0`` it is plain SGD, and
for sparse gradients its weight decay touches only the observed rows. (``torch.optim.SGD(weight_decay=...)``
is no substitute: it rejects sparse gradients, and a dense decay would also shrink the multipliers outside
the batch.) So RFL is cross-checked too, with nuPI in place of SGD as the dual optimizer.

flctl's own ``--dual-optimizer nupi`` (flctl.methods.NuPI) is checked against Cooper's nuPI (SGD init) for FL with
a P term and K_I != 1, at nu = 0: with nu > 0 Cooper's sparse nuPI starts a sample's EMA at 0 where flctl starts it
at the sample's first error (see flctl.methods.NuPI).
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

cooper = pytest.importorskip("cooper")

from flctl.data import batches, epoch_order  # noqa: E402
from flctl.losses import per_sample_loss  # noqa: E402
from flctl.methods import FL, RFL, NuPI  # noqa: E402
from flctl.step import train_step  # noqa: E402

# Small steps keep the primal-dual dynamics calm (multipliers stay O(1)), so float32 rounding differences
# between the two implementations are not amplified over the 40 steps.
N_SAMPLES, BATCH_SIZE, EPOCHS = 20, 5, 10
EPS, ALPHA = 0.6, 2.0
DUAL_LR, PRIMAL_LR = 0.2, 0.1
KP, KI = 0.5, 0.8               # fl-nupi: a P term that acts, and an I gain other than 1
TASK = SimpleNamespace(kind="classification")  # train_step only reads task.kind


class PerSampleFeasibility(cooper.ConstrainedMinimizationProblem):
    """min 0  s.t.  g_i(θ) - ε <= 0 for each training sample i, observed one batch at a time."""

    def __init__(self, n_samples: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.multiplier = cooper.multipliers.IndexedMultiplier(num_constraints=n_samples)
        self.per_sample_loss = cooper.Constraint(
            constraint_type=cooper.ConstraintType.INEQUALITY,
            formulation_type=cooper.formulations.Lagrangian,
            multiplier=self.multiplier,
        )

    def compute_cmp_state(self, model, x, y, ids) -> cooper.CMPState:
        losses = per_sample_loss(TASK, model(x), y)  # the very loss flctl's train_step uses
        state = cooper.ConstraintState(violation=losses - self.eps, constraint_features=ids)
        return cooper.CMPState(loss=None, observed_constraints={self.per_sample_loss: state})

    def multipliers_flat(self) -> torch.Tensor:
        # IndexedMultiplier stores its weight as [n, 1] for the embedding lookup.
        return self.multiplier.weight.detach().flatten()


def _dual_optimizer(method_name: str, params) -> torch.optim.Optimizer:
    if method_name == "fl":
        return torch.optim.SGD(params, lr=DUAL_LR, maximize=True)
    if method_name == "fl-nupi":       # Cooper's nuPI with SGD init; nu = 0, where its EMA start agrees with ours
        return cooper.optim.nuPI(params, lr=DUAL_LR, Kp=KP, Ki=KI, ema_nu=0.0, maximize=True)
    # RFL's -λ/α term as a weight decay on the observed multipliers (see the module docstring).
    return cooper.optim.nuPI(params, lr=DUAL_LR, weight_decay=1.0 / ALPHA, Kp=0.0, Ki=1.0, ema_nu=0.0,
                             maximize=True)


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    # Linearly separable labels with four of them flipped: the linear classifier soon fits most samples
    # below ε (their multipliers are projected back to 0) but never the flipped ones (their multipliers
    # stay positive), so both branches of the projection are exercised.
    g = torch.Generator().manual_seed(0)
    x = 2.0 * torch.randn(N_SAMPLES, 3, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
    y[:4] = 1 - y[:4]
    return x, y


# torch warns once from inside nuPI's sparse update; it concerns torch's sparse-tensor checks, not the test.
@pytest.mark.filterwarnings("ignore:Sparse invariant checks are implicitly disabled")
@pytest.mark.parametrize("method_name", ["fl", "rfl", "fl-nupi"])
def test_flctl_matches_cooper_alternating_dual_primal(method_name: str) -> None:
    torch.manual_seed(0)
    x, y = _data()
    # float32 throughout: flctl's multipliers are float32 and its primal loss torch.dot(λ, g) needs both
    # operands in the same dtype.
    model_flctl = torch.nn.Linear(3, 2)
    model_cooper = copy.deepcopy(model_flctl)

    if method_name == "fl":
        method = FL(N_SAMPLES, eps=EPS, dual_lr=DUAL_LR)
    elif method_name == "fl-nupi":
        method = FL(N_SAMPLES, eps=EPS, dual_lr=DUAL_LR, nupi=NuPI(N_SAMPLES, kp=KP, ki=KI, nu=0.0))
    else:
        method = RFL(N_SAMPLES, eps=EPS, alpha=ALPHA, dual_lr=DUAL_LR)
    primal_flctl = torch.optim.SGD(model_flctl.parameters(), lr=PRIMAL_LR)

    cmp = PerSampleFeasibility(N_SAMPLES, EPS)
    cooper_optimizer = cooper.optim.AlternatingDualPrimalOptimizer(
        cmp=cmp,
        primal_optimizers=torch.optim.SGD(model_cooper.parameters(), lr=PRIMAL_LR),
        dual_optimizers=_dual_optimizer(method_name, cmp.dual_parameters()),
    )

    # FL agrees bit for bit in practice; RFL rounds differently ((1 - η/α)λ + η v in flctl against
    # λ + η(v - λ/α) in nuPI), hence a tolerance rather than equality.
    close = dict(rtol=1e-5, atol=1e-6)
    returned_to_zero = torch.zeros(N_SAMPLES, dtype=torch.bool)
    for epoch in range(EPOCHS):
        for step, ids in enumerate(batches(epoch_order(N_SAMPLES, seed=0, epoch=epoch), BATCH_SIZE)):
            before = method.multipliers.clone()
            train_step(TASK, model_flctl, method, primal_flctl, x[ids], y[ids], ids)
            batch = dict(model=model_cooper, x=x[ids], y=y[ids], ids=ids)
            cooper_optimizer.roll(compute_cmp_state_kwargs=batch)

            where = f"{method_name}, epoch {epoch}, step {step}"
            torch.testing.assert_close(method.multipliers, cmp.multipliers_flat(), **close,
                                       msg=lambda m, where=where: f"multipliers differ ({where}): {m}")
            for (name, p_flctl), p_cooper in zip(model_flctl.named_parameters(), model_cooper.parameters()):
                torch.testing.assert_close(p_flctl, p_cooper, **close,
                                           msg=lambda m, name=name: f"parameter {name} differs ({where}): {m}")
            returned_to_zero |= (before > 0) & (method.multipliers == 0)

    # The comparison is only meaningful if the run leaves some constraints active and deactivates others.
    assert (method.multipliers > 0).any(), "no multiplier is positive at the end"
    assert returned_to_zero.any(), "no positive multiplier was ever projected back to zero"
