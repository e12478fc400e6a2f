"""Polynomial regression of a noisy cosine (paper Fig. 1, App. B.1).

ERM is least squares; FL is the feasibility problem  find a  s.t. |p_a(x_i) - y_i| <= eps  for every i,
a second-order-cone program (each |r_i| <= eps is a 1-D cone) solved with CVXPY's SCS, eps = sigma.
The per-sample loss recorded is the absolute residual |p(x_i) - y_i|, so "loss <= eps" is the constraint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from flctl.tasks import Solution, Task

if TYPE_CHECKING:   # torch is imported where used: planning a sweep does not need it
    from flctl.data import Dataset, Split

CURVE_POINTS = 400


def _sample(n: int, noise: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    x = np.sort(rng.uniform(-1.0, 1.0, n))
    return x, np.cos(np.pi * x) + rng.normal(0.0, noise, n)


def load(options: dict, data_dir: str | None) -> Dataset:
    import torch

    from flctl.data import Dataset, Split

    rng = np.random.default_rng(options["data_seed"])
    x_tr, y_tr = _sample(options["n_train"], options["noise"], rng)
    x_te, y_te = _sample(options["n_test"], options["noise"], rng)

    def split(x, y) -> Split:
        return Split(torch.from_numpy(x), torch.from_numpy(y))

    return Dataset(split(x_tr, y_tr), split(x_te, y_te))


def _vander(x: np.ndarray, degree: int) -> np.ndarray:
    return np.vander(x, degree + 1, increasing=True)      # [n, d+1], columns x^0 .. x^d


def solve(cfg, data: Dataset) -> Solution:
    import cvxpy as cp

    degree = cfg.opts["degree"]
    x_tr, y_tr = data.train.x.numpy(), data.train.y.numpy()
    x_te, y_te = data.test.x.numpy(), data.test.y.numpy()
    V = _vander(x_tr, degree)
    multipliers = None
    if cfg.method == "erm":
        # Least squares; the minimum-norm solution when over-parameterized (degree + 1 > n).
        coef = np.linalg.lstsq(V, y_tr, rcond=None)[0]
    else:
        a = cp.Variable(degree + 1)
        constraints = [cp.abs(V @ a - y_tr) <= cfg.eps]
        problem = cp.Problem(cp.Minimize(0), constraints)
        problem.solve(solver=cp.SCS, eps_abs=1e-9, eps_rel=1e-9, max_iters=200_000)
        if problem.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE):
            raise RuntimeError(f"polyfit FL with eps={cfg.eps} at degree {degree} is {problem.status}")
        coef = np.asarray(a.value)
        # |r_i| <= eps is two linear constraints; the multiplier of sample i is the active side's dual.
        multipliers = np.abs(np.asarray(constraints[0].dual_value, dtype=np.float64))

    def evaluate(x, y):
        pred = _vander(x, degree) @ coef
        return {"loss": np.abs(pred - y), "prediction": pred, "target": y}

    grid = np.linspace(-1.0, 1.0, CURVE_POINTS)
    return Solution(
        train=evaluate(x_tr, y_tr),
        test=evaluate(x_te, y_te),
        extras={"coefficients": coef, "curve_x": grid, "curve_y": _vander(grid, degree) @ coef,
                "truth_y": np.cos(np.pi * grid), "train_x": x_tr, "train_y": y_tr},
        multipliers=multipliers,
    )


TASK = Task(
    name="polyfit",
    kind="regression",
    description="20 noisy cosine points, polynomial of a given degree (10/20/30); ERM least squares, FL SOCP",
    reads_data=False,
    seed_free="its samples are drawn by -o data_seed, its solvers deterministic: sweep -o data_seed=0,1,2 for others",
    # No gradient loop: epochs and learning rates are placeholders (FL is solved by SCS, not dual ascent).
    defaults=dict(epochs=1, batch_size=20, optimizer="sgd", lr=0.0, eval_every=1, eps=0.2, dual_lr=0.0),
    options=dict(degree=10, n_train=20, n_test=200, noise=0.2, data_seed=0),
    option_ranges=dict(degree=(0, 100), n_train=(1, None), n_test=(1, None), noise=(0, None), data_seed=(0, None)),
    methods=("erm", "fl"),
    load=load,
    solve=solve,
)
