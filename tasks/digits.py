"""scikit-learn's handwritten digits (1797 real 8x8 images, 10 classes) with a small CNN."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flctl.tasks import Task

if TYPE_CHECKING:   # torch and scikit-learn are imported where used: planning a sweep needs neither
    import torch

    from flctl.data import Dataset, Split


def load(options: dict, data_dir: str | None) -> Dataset:
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from flctl.data import Dataset, Split

    digits = load_digits()
    x = digits.images.astype("float32") / 16.0          # pixel values 0..16 -> [0, 1]
    y = digits.target
    # Stratified, seeded split: the same data_seed gives the same samples (and sample ids) in every run.
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=options["test_size"], stratify=y,
                                              random_state=options["data_seed"])

    def split(a, b) -> Split:
        return Split(torch.from_numpy(a).unsqueeze(1), torch.from_numpy(b).long())   # [N, 1, 8, 8]

    return Dataset(split(x_tr, y_tr), split(x_te, y_te))


def build_model(options: dict, data: Dataset) -> torch.nn.Module:
    from flctl.models import small_cnn

    return small_cnn(1, 10, width=options["width"])


def extras(model: torch.nn.Module, data: Dataset, options: dict) -> dict:
    """The 8x8 training images by sample id (``train_images``, docs/design.md), for the top-multipliers figure."""
    return {"train_images": data.train.x[:, 0].cpu().numpy()}


TASK = Task(
    batched=True,
    name="digits",
    kind="classification",
    description="scikit-learn digits (8x8 images, 10 classes, stratified 75/25 split), small CNN",
    reads_data=False,
    defaults=dict(epochs=30, batch_size=64, optimizer="adamw", lr=1e-3, weight_decay=0.0,
                  scheduler="cosine", eval_every=5, eps=0.51, alpha=1.0, dual_lr=1e-2),
    options=dict(test_size=0.25, data_seed=0, width=32),
    option_ranges=dict(test_size=(0.05, 0.95), data_seed=(0, None), width=(1, None)),
    load=load,
    build_model=build_model,
    extras=extras,
)
