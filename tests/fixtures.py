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


def write_utkface(root: Path, n: int = 40, seed: int = 0) -> Path:
    """A folder of UTKFace JPEGs named AGE_GENDER_RACE_DATETIME.jpg (some as the aligned&cropped release's
    `.jpg.chip.jpg`), 24x24 RGB random images, plus 2 malformed .jpg names and a non-image file to skip."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    folder = Path(root)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        age, gender, race = int(rng.integers(1, 100)), int(rng.integers(0, 2)), int(rng.integers(0, 5))
        suffix = ".jpg.chip.jpg" if i % 3 == 0 else ".jpg"
        name = f"{age}_{gender}_{race}_2017010402{i:07d}{suffix}"
        Image.fromarray(rng.integers(0, 256, (24, 24, 3), dtype=np.uint8)).save(folder / name, quality=90)
    for bad in ("unknown_0_1_20170109142408075.jpg", "face0001.jpg"):   # no integer age field
        Image.fromarray(rng.integers(0, 256, (24, 24, 3), dtype=np.uint8)).save(folder / bad)
    (folder / "README.txt").write_text("not an image\n")
    return folder


# task name -> writer(root) -> data_dir, for registry-parametrized tests
WRITERS = {"cifar10": write_cifar10, "utkface": write_utkface}
