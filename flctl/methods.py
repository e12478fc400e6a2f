"""The four learning methods of the paper: ERM, CSERM, FL and RFL.

A method turns a batch of per-sample losses into the scalar the primal optimizer minimizes and, for the
primal-dual methods, first moves the batch's Lagrange multipliers. The training loop calls, per step::

    losses = loss_fn(model(x), y)          # [B], one loss per sample, still attached to the graph
    method.dual_step_(losses, ids)         # FL/RFL: lambda[ids] <- projected ascent (done FIRST)
    method.primal_loss(losses, ids).backward()

Adding a method is one subclass decorated with ``@register``, named after its torch-free description in
flctl.method_info (label, order, colours, which of eps/alpha/dual_lr it reads, its rule in words).
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor

# FL on an infeasible problem grows lambda without bound (paper §2.1, "Infeasible problems"). We stop the
# growth at a finite cap so that sum(lambda * g) stays representable in float32 for any batch size, and the
# training loop reports how many multipliers sit at the cap.
LAMBDA_CAP = 1e12


def _scalar(value: float | None, device: torch.device | str) -> Tensor:
    """A hyper-parameter as a 0-dim float32 tensor on the device: a captured or compiled step reads it as data (one
    graph serves any value, and a cell's value can change without a new capture). Float32 is what the step's
    arithmetic rounded a Python float to anyway, so the numbers are those of the float. None: NaN (see Method)."""
    return torch.tensor(math.nan if value is None else float(value), dtype=torch.float32, device=device)


class Method:
    """Base class. ``eps`` is the constraint level ε of every sample.

    Every hyper-parameter and every piece of state is a tensor on the device, changed only in place, so the step
    is graph-safe (flctl.step): no Python number of it enters the step's arithmetic.
    """

    name: ClassVar[str]       # its entry in flctl.method_info.METHOD_INFO
    # How primal_loss reduces over the batch: "mean" or "sum". Gradient accumulation weighs each
    # micro-batch's objective by its share of the batch for "mean" and by 1 for "sum", so that the
    # accumulated gradient is the whole batch's.
    reduction: ClassVar[str] = "mean"
    # Whether the K cells of the class in one grouped model take their dual step and objective as one
    # (flctl.grouped.methods): its dual_step_, primal_loss and satisfied read losses and ids [..., B] against state
    # [..., N] and hyper-parameters [..., 1] (gather and scatter on the last dimension, reductions over it), so one
    # instance whose tensors are the K cells' side by side, [K, ...], steps each cell's row as that cell's own would.
    # primal_loss then returns [K]. Each class says so itself, True or False (read from its own __dict__): a subclass
    # that rewrites the rule is not taken to group, and one that says nothing steps cell by cell with a warning.
    groups: ClassVar[bool] = False

    def __init__(
        self,
        n_samples: int,
        eps: float = 0.0,
        alpha: float | None = None,
        dual_lr: float | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        self.n_samples = n_samples
        self.eps: Tensor = _scalar(eps, device)
        # NaN where not given: config validation gives every method the knobs it reads, and a method that reads
        # one it was not given turns its objective into NaN, which the loop stops on, rather than running on.
        self.alpha: Tensor = _scalar(alpha, device)
        self.dual_lr: Tensor = _scalar(dual_lr, device)
        # One multiplier per training sample, lambda_0 = 0; None for methods without a dual.
        self.multipliers: Tensor | None = None

    def dual_step_(self, losses: Tensor, ids: Tensor) -> None:
        """Update the multipliers of the batch in place. No-op for primal-only methods.

        Implementations must not record autograd history: work on ``losses.detach()``. (No
        ``@torch.no_grad()`` here: entering and leaving it costs ~10 us per step on CPU.)
        """

    def primal_loss(self, losses: Tensor, ids: Tensor) -> Tensor:
        raise NotImplementedError

    def satisfied(self, losses: Tensor, ids: Tensor) -> Tensor:
        """Whether each sample of the batch was satisfied at this step (flctl.pruning): its loss at most ε."""
        return losses.detach() <= self.eps

    def state_dict(self) -> dict:
        return {"multipliers": None if self.multipliers is None else self.multipliers.clone()}

    def load_state_dict(self, state: dict) -> None:
        if self.multipliers is not None:
            self.multipliers.copy_(state["multipliers"])


METHODS: dict[str, type[Method]] = {}


def register(cls: type[Method]) -> type[Method]:
    from flctl.method_info import METHOD_INFO

    if cls.name not in METHOD_INFO:
        raise ValueError(f"describe method {cls.name!r} with flctl.method_info.describe before registering it")
    METHODS[cls.name] = cls
    return cls


def get_method(name: str) -> type[Method]:
    """The class of method ``name``: flctl's own, or a plugin's, imported from its ``MethodInfo.impl``."""
    from flctl.method_info import METHOD_INFO
    from flctl.plugins import load_object

    impl = METHOD_INFO[name].impl if name in METHOD_INFO else None
    if name not in METHODS and impl:
        cls = load_object(impl)
        if not (isinstance(cls, type) and issubclass(cls, Method) and cls.name == name):
            from flctl.errors import ConfigError

            raise ConfigError(f"{impl} is not a flctl.methods.Method subclass named {name!r}")
        METHODS[name] = cls
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; choose one of: {', '.join(METHODS)}") from None


@register
class ERM(Method):
    r"""Empirical risk minimization: :math:`\frac{1}{|B|}\sum_{i\in B} g_i(\theta)`."""

    name = "erm"
    groups = True

    def primal_loss(self, losses: Tensor, ids: Tensor) -> Tensor:
        return losses.mean(-1)


@register
class CSERM(Method):
    r"""Clamped-squared ERM (paper Prop. 2, Eq. 7): :math:`\frac{\alpha}{2}\,\mathrm{mean}_{i\in B}[g_i-\epsilon_i]_+^2`.

    Shares its minimizers with RFL(ε, α) but not its dynamics (§3.1).
    """

    name = "cserm"
    groups = False          # its mean is over every element: for K cells' [K, B] it would mix their objectives

    def primal_loss(self, losses: Tensor, ids: Tensor) -> Tensor:
        # relu == clamp(min=0) (same values; gradient differs only at excess == 0, where d/dx x^2 = 0),
        # and x*x == square(); both give fewer backward kernels. Bitwise identical loss and gradients.
        excess = torch.relu(losses - self.eps)
        return 0.5 * self.alpha * (excess * excess).mean()


class NuPI:
    r"""nuPI (Sohrabi et al. 2024) for per-sample multipliers: a PI controller in place of gradient ascent.

    With the dual gradient e_t of sample i (FL: g_i − ε_i; RFL: g_i − ε_i − λ_i/α), at each step in which i is
    in the batch:

    .. math::
        \xi_t = \nu\,\xi_{t-1} + (1-\nu)\,e_t \quad(\xi_{-1} = e_0 \text{ at the first visit}),\qquad
        \lambda_i \leftarrow [\lambda_i + \eta_\lambda (K_I e_t + K_P (\xi_t - \xi_{t-1}))]_+

    so a sample's first step has no P term. Samples outside the batch keep λ and ξ. K_P = 0, K_I = 1 is gradient
    ascent, bit for bit (see ``correction``). With ν = 0 this is Cooper's ``nuPI`` (init SGD) on an
    IndexedMultiplier; with ν > 0 Cooper starts a sample's EMA at 0 (ξ_0 = (1−ν) e_0) where this starts it at e_0.
    """

    def __init__(self, n_samples: int, kp: float, ki: float, nu: float, device: torch.device | str = "cpu") -> None:
        # The gains as the step uses them, each rounded once from the Python value (as a Python scalar would be).
        self.kp, self.ki_minus_1 = _scalar(kp, device), _scalar(float(ki) - 1.0, device)
        self.nu, self.one_minus_nu = _scalar(nu, device), _scalar(1.0 - float(nu), device)
        self.xi = torch.zeros(n_samples, device=device)                          # ξ of each sample's last visit
        self.seen = torch.zeros(n_samples, dtype=torch.bool, device=device)     # visited at least once

    def correction(self, error: Tensor, ids: Tensor) -> Tensor:
        """(K_I − 1) e_t + K_P (ξ_t − ξ_{t−1}) for the batch, and ξ moved on. The method adds η times this to its
        gradient-ascent step λ + η e_t: the sum is the nuPI step, and with K_P = 0, K_I = 1 the correction is
        exactly 0 so the multipliers are those of gd to the last bit (RFL's ascent rounds as (1−η/α)λ + η v)."""
        seen = self.seen.gather(-1, ids)
        previous = torch.where(seen, self.xi.gather(-1, ids), error)
        # At a first visit ξ_0 = ν e_0 + (1 − ν) e_0 is e_0 itself: taken as is, so that step has no P term at all
        # (the sum would round).
        xi = torch.where(seen, previous * self.nu + error * self.one_minus_nu, error)
        self.xi.scatter_(-1, ids, xi)
        self.seen.scatter_(-1, ids, True)
        return error * self.ki_minus_1 + (xi - previous) * self.kp

    def state_dict(self) -> dict:
        return {"xi": self.xi.clone(), "seen": self.seen.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.xi.copy_(state["xi"])
        self.seen.copy_(state["seen"])


class _PrimalDual(Method):
    """Shared by FL and RFL: one multiplier per sample, alternating GDA with the dual step first (or nuPI)."""

    reduction = "sum"
    multipliers: Tensor

    def __init__(self, n_samples: int, eps: float = 0.0, alpha: float | None = None,
                 dual_lr: float | None = None, device: torch.device | str = "cpu", nupi: NuPI | None = None) -> None:
        super().__init__(n_samples, eps, alpha, dual_lr, device)
        self.multipliers = torch.zeros(n_samples, device=device)
        self.nupi = nupi
        # lambda_{t+1} of the current batch, kept for primal_loss so it does not gather twice.
        self._batch_multipliers: Tensor | None = None

    def _ascent(self, lam: Tensor, violation: Tensor) -> Tensor:
        """In-place ascent step on the gathered batch multipliers ``lam`` (before projection)."""
        raise NotImplementedError

    def _dual_gradient(self, lam: Tensor, violation: Tensor) -> Tensor:
        """The gradient of the dual objective in λ, which ``_ascent`` steps along (nuPI's error signal)."""
        raise NotImplementedError

    def dual_step_(self, losses: Tensor, ids: Tensor) -> None:
        # Only the batch's entries move; ids are unique within a batch (sampling without replacement),
        # so the indexed write below is unambiguous. Cost: one gather, three pointwise ops, one scatter.
        # No @torch.no_grad(): losses is detached and the multipliers never require grad, so nothing
        # here is recorded anyway. gather/scatter_ on the last dimension serve one cell's [B] and K cells' [K, B]
        # alike (Method.groups), and skip Python's advanced-indexing parser.
        lam = self.multipliers.gather(-1, ids)                        # [B]
        violation = losses.detach() - self.eps                        # [B]  g_i - eps
        pi = None if self.nupi is None else self.nupi.correction(self._dual_gradient(lam, violation), ids)
        lam = self._ascent(lam, violation)
        if pi is not None:
            lam.addcmul_(pi, self.dual_lr)
        lam.clamp_(0.0, LAMBDA_CAP)                                   # projection onto [0, cap]
        self.multipliers.scatter_(-1, ids, lam)
        self._batch_multipliers = lam

    def satisfied(self, losses: Tensor, ids: Tensor) -> Tensor:
        # After the step's dual update: a zero multiplier puts no weight on the sample.
        return self.multipliers.gather(-1, ids) == 0

    def state_dict(self) -> dict:
        return super().state_dict() | ({} if self.nupi is None else {"nupi": self.nupi.state_dict()})

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if self.nupi is not None:
            self.nupi.load_state_dict(state["nupi"])

    def primal_loss(self, losses: Tensor, ids: Tensor) -> Tensor:
        # Lagrangian's primal part with lambda_{t+1} detached: sum_{i in B} lambda_i * g_i (Eq. 3).
        lam = self._batch_multipliers
        if lam is None or lam.shape != losses.shape:  # called without a preceding dual step
            lam = self.multipliers.gather(-1, ids)
        return torch.dot(lam, losses) if losses.dim() == 1 else torch.linalg.vecdot(lam, losses)


@register
class FL(_PrimalDual):
    r"""Feasible Learning by alternating GDA (paper Eq. 3).

    .. math::
        \lambda_i \leftarrow [\lambda_i + \eta_\lambda (g_i(\theta_t) - \epsilon_i)]_+ ,\qquad
        \theta \leftarrow \theta - \eta_\theta \textstyle\sum_{i\in B} \lambda_i \nabla g_i(\theta_t)
    """

    name = "fl"
    groups = True

    def _ascent(self, lam: Tensor, violation: Tensor) -> Tensor:
        # addcmul_ with the 0-dim dual lr rounds as add_(violation, alpha=lr) did with a Python float (one fused
        # multiply-add; tests/test_reference.py holds the records to it)
        return lam.addcmul_(violation, self.dual_lr)

    def _dual_gradient(self, lam: Tensor, violation: Tensor) -> Tensor:
        return violation


@register
class RFL(_PrimalDual):
    r"""Resilient Feasible Learning: GDA on the quadratically regularized Lagrangian (paper Eq. 6).

    .. math::
        \lambda_i \leftarrow [\lambda_i + \eta_\lambda (g_i(\theta_t) - \epsilon_i - \lambda_i/\alpha)]_+

    The ``-lambda/alpha`` term is a dual weight decay; at a fixed point lambda* = alpha [g - eps]_+ (Prop. 2).
    """

    name = "rfl"
    groups = True

    def __init__(self, n_samples: int, eps: float = 0.0, alpha: float | None = None,
                 dual_lr: float | None = None, device: torch.device | str = "cpu", nupi: NuPI | None = None) -> None:
        super().__init__(n_samples, eps, alpha, dual_lr, device, nupi)
        # 1 - eta/alpha computed in double and rounded once, as the Python expression it replaces
        self.decay = _scalar(None if alpha is None or dual_lr is None else 1.0 - dual_lr / alpha, device)

    def _ascent(self, lam: Tensor, violation: Tensor) -> Tensor:
        # lam + eta*(v - lam/alpha) = (1 - eta/alpha)*lam + eta*v, written as two in-place ops.
        return lam.mul_(self.decay).addcmul_(violation, self.dual_lr)

    def _dual_gradient(self, lam: Tensor, violation: Tensor) -> Tensor:
        return violation - lam / self.alpha


def eps_from_p_min(p_min: float) -> float:
    """Cross-entropy level that asks the true class for probability at least ``p_min``: log(1/p)."""
    return math.log(1.0 / p_min)
