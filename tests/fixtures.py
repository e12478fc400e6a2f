"""Datasets written in their real on-disk formats, small, for tasks whose data cannot be downloaded here."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np


def write_cifar10(root: Path, per_batch: int = 8, seed: int = 0) -> Path:
    """A `cifar-10-batches-py` folder: 5 train batches + test_batch, python pickles of the real layout
    (dict with 'batch_label', 'labels', 'data' [N, 3072] uint8 rows R..G..B.., 'filenames')."""
    rng = np.random.default_rng(seed)
    folder = Path(root) / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        labels = rng.integers(0, 10, per_batch).tolist()
        batch = {"batch_label": f"{name} of 5", "labels": labels,
                 "data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
                 "filenames": [f"img_{name}_{i}.png" for i in range(per_batch)]}
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f, protocol=2)
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [str(i) for i in range(10)]}, protocol=2))
    return Path(root)


# task name -> writer(root) -> data_dir, for registry-parametrized tests
WRITERS = {"cifar10": write_cifar10}
