"""Two-moons classification (paper §4.3, Fig. 3): make_moons with noise 0.1, MLP 2-70-70-2."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from flctl.tasks import Task

if TYPE_CHECKING:   # torch is imported where used: planning a sweep does not need it
    import torch

    from flctl.data import Dataset, Split

# The part of the input plane the decision contours of reports cover (the multipliers figure), GRID_POINTS a side.
GRID_X = (-1.5, 2.5)
GRID_Y = (-1.0, 1.5)
GRID_POINTS = 200


def make_moons(n: int, noise: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's ``make_moons(n, noise=noise, random_state=seed)``, bit for bit: the same two half circles, then
    one shuffle and the noise drawn from one ``RandomState(seed)`` in the order it draws them (its ``shuffle`` is
    ``resample(replace=False)``: one ``RandomState.shuffle`` of the indices). Written out because importing
    scikit-learn (and the scipy.stats it imports) costs a run 1-2 s, more than 250 epochs of this task; the test
    ``test_make_moons_is_scikit_learns`` compares both sample for sample."""
    n_out, n_in = n // 2, n - n // 2
    outer, inner = np.linspace(0, np.pi, n_out), np.linspace(0, np.pi, n_in)
    x = np.vstack([np.append(np.cos(outer), 1 - np.cos(inner)),
                   np.append(np.sin(outer), 1 - np.sin(inner) - 0.5)]).T
    y = np.hstack([np.zeros(n_out, dtype=np.intp), np.ones(n_in, dtype=np.intp)])
    rng = np.random.RandomState(seed)
    order = np.arange(n)
    rng.shuffle(order)
    x, y = x[order], y[order]
    return x + rng.normal(scale=noise, size=x.shape), y


def load(options: dict, data_dir: str | None) -> Dataset:
    import torch

    from flctl.data import Dataset, Split

    # The data is fixed by data_seed (not by the run seed), so seeds vary initialization and batch order
    # over the same samples and multipliers of different seeds can be compared sample by sample.
    def split(n: int, seed: int) -> Split:
        x, y = make_moons(n, options["noise"], seed)
        return Split(torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.long))

    return Dataset(split(options["n_train"], options["data_seed"]),
                   split(options["n_test"], options["data_seed"] + 1))


def build_model(options: dict, data: Dataset) -> torch.nn.Module:
    from flctl.models import mlp

    h = options["hidden"]
    return mlp([2, h, h, 2])


def extras(model: torch.nn.Module, data: Dataset, options: dict) -> dict[str, np.ndarray]:
    """What the multipliers figure draws a run from (docs/design.md, extras keys): the grid's axes, the training
    inputs, and the trained MLP's layers, from which the figure computes the class probabilities on the grid when it
    draws. Computing them here, 40,000 forward passes, was 12 ms of every sweep cell's ~45 ms (1 epoch) for a figure
    that draws four runs; the layers are 21 KB (the grid was 160 KB)."""
    import torch

    # build_model's mlp: its linear layers in order, a ReLU between each two (the figure's forward pass)
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    weights = {f"mlp_{name}_{i}": getattr(layer, name).detach().cpu().numpy()
               for i, layer in enumerate(layers) for name in ("weight", "bias")}
    return {"grid_x": np.linspace(*GRID_X, GRID_POINTS, dtype=np.float32),
            "grid_y": np.linspace(*GRID_Y, GRID_POINTS, dtype=np.float32),
            "train_x": data.train.x.cpu().numpy(), "train_y": data.train.y.cpu().numpy(), **weights}


TASK = Task(
    batched=True,
    name="two-moons",
    kind="classification",
    description="make_moons (noise 0.1, 1000 train / 1000 test), MLP 2-70-70-2",
    reads_data=False,
    defaults=dict(epochs=250, batch_size=512, optimizer="adamw", lr=5e-4, weight_decay=0.0,
                  scheduler="constant", eval_every=25, eps=0.1, alpha=1.0, dual_lr=1e-2),
    options=dict(n_train=1000, n_test=1000, noise=0.1, data_seed=0, hidden=70),
    option_ranges=dict(n_train=(2, None), n_test=(1, None), noise=(0, None), data_seed=(0, None), hidden=(1, None)),
    load=load,
    build_model=build_model,
    extras=extras,
)
