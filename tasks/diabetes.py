"""scikit-learn's diabetes regression (442 patients, 10 features), MLP, squared error on a z-scored target."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flctl.tasks import Task

if TYPE_CHECKING:   # torch and scikit-learn are imported where used: planning a sweep needs neither
    import torch

    from flctl.data import Dataset, Split


def load(options: dict, data_dir: str | None) -> Dataset:
    import torch
    from sklearn.datasets import load_diabetes
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    from flctl.data import Dataset, Split

    x, y = load_diabetes(return_X_y=True)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=options["test_size"],
                                              random_state=options["data_seed"])
    # Standardize features and target with training statistics only (no test leakage).
    xs = StandardScaler().fit(x_tr)
    ys = StandardScaler().fit(y_tr.reshape(-1, 1))

    def split(a, b) -> Split:
        return Split(torch.tensor(xs.transform(a), dtype=torch.float32),
                     torch.tensor(ys.transform(b.reshape(-1, 1)).ravel(), dtype=torch.float32))

    return Dataset(split(x_tr, y_tr), split(x_te, y_te),
                   meta={"target_mean": float(ys.mean_[0]), "target_std": float(ys.scale_[0])})


def build_model(options: dict, data: Dataset) -> torch.nn.Module:
    from flctl.models import mlp

    h = options["hidden"]
    return mlp([data.train.x.shape[1], h, h, 1])


TASK = Task(
    batched=True,
    name="diabetes",
    kind="regression",
    description="scikit-learn diabetes (442 samples, 10 features, 80/20 split, z-scored), MLP 10-64-64-1",
    reads_data=False,
    defaults=dict(epochs=100, batch_size=64, optimizer="adamw", lr=1e-3, weight_decay=0.0,
                  scheduler="constant", eval_every=10, eps=0.25, alpha=1.0, dual_lr=1e-2),
    options=dict(test_size=0.2, data_seed=0, hidden=64),
    option_ranges=dict(test_size=(0.05, 0.95), data_seed=(0, None), hidden=(1, None)),
    load=load,
    build_model=build_model,
)
