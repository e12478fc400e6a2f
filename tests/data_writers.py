"""Datasets written in their real on-disk formats, small, for tasks whose data cannot be downloaded here: each
task's own loader reads them. (Writers, not pytest fixtures: those are in tests/conftest.py.)"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from flctl_tasks.fashion_mnist import DEBIAN, complete


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


def write_utkface(root: Path, n: int = 40, seed: int = 0, ages: list[int] | None = None) -> Path:
    """A folder of UTKFace JPEGs named AGE_GENDER_RACE_DATETIME.jpg (some as the aligned&cropped release's
    `.jpg.chip.jpg`), 24x24 RGB random images, plus 2 malformed .jpg names and a non-image file to skip.
    ``ages``: the age of each image (n = len(ages)) instead of random ages in 1..99."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    folder = Path(root)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n if ages is None else len(ages)):
        age, gender, race = int(rng.integers(1, 100)), int(rng.integers(0, 2)), int(rng.integers(0, 5))
        age = age if ages is None else ages[i]
        suffix = ".jpg.chip.jpg" if i % 3 == 0 else ".jpg"
        name = f"{age}_{gender}_{race}_2017010402{i:07d}{suffix}"
        Image.fromarray(rng.integers(0, 256, (24, 24, 3), dtype=np.uint8)).save(folder / name, quality=90)
    for bad in ("unknown_0_1_20170109142408075.jpg", "face0001.jpg"):   # no integer age field
        Image.fromarray(rng.integers(0, 256, (24, 24, 3), dtype=np.uint8)).save(folder / bad)
    (folder / "README.txt").write_text("not an image\n")
    return folder


ORCA_PROMPTS = ["What is 2 + 2?", "Name a primary colour.", "Translate 'chat' from French.", "Is ice cold?",
                "Spell 'cat' backwards.", "What comes after Monday?", "How many legs has a spider?",
                "Capital of Italy?", "Opposite of up?", "Boiling point of water in C?", "Largest planet?",
                "Plural of mouse?", "What is 3 x 3?", "First letter of the alphabet?", "Colour of grass?",
                "Sound a dog makes?"]


def orca_rows(n: int = 16, seed: int = 0) -> list[dict]:
    """Rows in the column layout of argilla/distilabel-intel-orca-dpo-pairs, short texts. Rows 3 and 9 are
    ties, row 5 has chosen_score 7 (below the paper's 8), row 11 a null score, row 7 is in GSM8K's train set:
    the filter keeps n - 5 pairs."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        prompt = ORCA_PROMPTS[i % len(ORCA_PROMPTS)]
        good, bad = f"A short, right answer number {i}.", f"A long and wrong reply {int(rng.integers(100))}, sorry."
        status = "tie" if i in (3, 9) else ("swapped" if i % 4 == 1 else "unchanged")
        score = None if i == 11 else (7.0 if i == 5 else float(rng.choice([8.0, 9.0, 10.0])))
        rows.append({
            "system": "" if i % 2 else "You are a helpful assistant.",
            "input": prompt, "chosen": good, "rejected": bad,
            "generations": [good, bad], "order": ["chosen", "rejected"],
            "labelling_model": "gpt-4-1106-preview",
            "labelling_prompt": [{"content": "You are a judge.", "role": "system"},
                                 {"content": prompt, "role": "user"}],
            "raw_labelling_response": "9 4\nThe first answer is right.", "rating": [score, 4.0],
            "rationale": "The first answer is right.", "status": status,
            "original_chosen": bad if status == "swapped" else good,
            "original_rejected": good if status == "swapped" else bad,
            "chosen_score": score, "in_gsm8k_train": i == 7,
        })
    return rows


def write_orca_dpo(root: Path, n: int = 16, seed: int = 0, fmt: str = "jsonl", rows: list[dict] | None = None) -> Path:
    """A JSONL (one JSON object per line, as the Hub's export) or Parquet file of Orca DPO rows."""
    import json

    rows = orca_rows(n, seed) if rows is None else rows
    Path(root).mkdir(parents=True, exist_ok=True)
    path = Path(root) / f"orca_dpo_pairs.{fmt}"
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_fashion_mnist(root: Path, n_train: int = 40, n_test: int = 20, seed: int = 0) -> Path:
    """The four gzipped IDX files Zalando publishes (a big-endian header: two zero bytes, type 0x08, the number of
    dimensions, each dimension as 32 bits; then the bytes), with random 28x28 images and labels."""
    import gzip

    rng = np.random.default_rng(seed)
    folder = Path(root)
    folder.mkdir(parents=True, exist_ok=True)

    def idx(name: str, values: np.ndarray) -> None:
        header = bytes([0, 0, 0x08, values.ndim]) + b"".join(d.to_bytes(4, "big") for d in values.shape)
        (folder / f"{name}.gz").write_bytes(gzip.compress(header + values.astype(np.uint8).tobytes()))

    for prefix, n in (("train", n_train), ("t10k", n_test)):
        idx(f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)))
        idx(f"{prefix}-labels-idx1-ubyte", rng.integers(0, 10, n))
    return folder


# task name -> writer(root) -> data_dir, for registry-parametrized tests
WRITERS = {"cifar10": write_cifar10, "utkface": write_utkface, "orca-dpo": write_orca_dpo,
           "fashion-mnist": write_fashion_mnist}


def real_fashion_mnist() -> None:
    """The real Fashion-MNIST, where Debian's package installs it (.ci/run installs dataset-fashion-mnist): the
    tests that train on real images skip without it, except in CI, where its absence is a failure."""
    if not complete(DEBIAN):
        why = f"Fashion-MNIST is not in {DEBIAN}: apt install dataset-fashion-mnist"
        if os.environ.get("CI"):
            pytest.fail(f"CI must provide the real images: {why}", pytrace=False)
        pytest.skip(why)


# Tasks whose real data a machine installs (and tests train on): task name -> the check that it is there.
REAL = {"fashion-mnist": real_fashion_mnist}
