"""CIFAR-10 classification with a CIFAR ResNet-18 (paper §4, Tables 1/5-7, Figs. 5-8).

Reads the dataset's real on-disk format (the python pickle batches of `cifar-10-batches-py`). With no
--data-dir, the archive is downloaded once through torchvision into ~/.cache/flctl/cifar10. Images stay uint8
on the device; crop (pad 4) + flip run batched on the device; normalization is the model's first layer.
"""

from __future__ import annotations

import codecs
import os
import pickle
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from flctl.errors import ConfigError
from flctl.fs import undone_on_failure
from flctl.tasks import Augment, Task

if TYPE_CHECKING:   # torch is imported where used: planning a sweep does not need it
    import torch

    from flctl.data import Dataset

URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
MD5 = "c58f30108f718f92721af3b95e74349a"
FOLDER = "cifar-10-batches-py"
# Where a person gets it by hand (the "CIFAR-10 python version" archive, URL above, extracts to FOLDER).
HOME = "https://www.cs.toronto.edu/~kriz/cifar.html"
LAYOUT = f"{FOLDER}/ with data_batch_1..5 and test_batch (the python version from {HOME})"
TRAIN_FILES = [f"data_batch_{i}" for i in range(1, 6)]
TEST_FILES = ["test_batch"]
# Per-channel statistics of the CIFAR-10 training set.
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)


def _find(data_dir: str | None) -> Path:
    if data_dir is not None:
        root = Path(data_dir)
        return root if root.name == FOLDER else root / FOLDER
    cache = Path(os.environ.get("FLCTL_DATA", Path.home() / ".cache" / "flctl")) / "cifar10"
    if not (cache / FOLDER).is_dir():
        from torchvision.datasets.utils import download_and_extract_archive

        try:
            with undone_on_failure(cache):
                download_and_extract_archive(URL, str(cache), md5=MD5)
        except Exception as exc:  # offline, proxy, disk: one message naming both ways out
            raise ConfigError(f"CIFAR-10 is not in {cache} and could not be downloaded ({type(exc).__name__}); "
                              f"pass --data-dir pointing at a folder with {LAYOUT}, or run once online") from None
    return cache / FOLDER


# What a CIFAR-10 python batch may ask the unpickler for: a batch is a dict of a uint8 array `data`, int `labels`,
# `batch_label` and `filenames` strings, and only the array needs callables. The real files (Python 2, numpy 1)
# name numpy.core.multiarray._reconstruct, numpy.ndarray and numpy.dtype; numpy 2 writes numpy._core.multiarray;
# Python 3 at protocol 2 writes bytes through _codecs.encode (tests/data_writers.py::write_cifar10).
_RECONSTRUCT = np.zeros(0).__reduce__()[0]      # numpy's _reconstruct, whichever module numpy keeps it in
BATCH_GLOBALS: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): codecs.encode,
}


class _Refused(pickle.UnpicklingError):
    """The file asked for a callable a CIFAR-10 batch never needs (os.system, eval, ...)."""

    def __init__(self, module: str, name: str) -> None:
        wanted = f"{module}.{name}"
        self.wanted = wanted if wanted.replace(".", "").replace("_", "").isalnum() else repr(wanted[:80])
        super().__init__(f"it asks for {self.wanted}")


class _BatchUnpickler(pickle.Unpickler):
    """Unpickles a CIFAR-10 python batch and nothing else. A pickle names the callables that rebuild its objects and
    unpickling calls them: a planted one names os.system or eval and runs code before any check of its contents.
    Here only BATCH_GLOBALS resolve; any other name is refused before anything is called."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return BATCH_GLOBALS[(module, name)]
        except KeyError:
            raise _Refused(module, name) from None


def _read(folder: Path, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for name in names:
        path = folder / name
        if not path.is_file():
            raise ConfigError(f"CIFAR-10 folder {folder} is incomplete: {name} is missing "
                              f"(expected {', '.join(TRAIN_FILES + TEST_FILES)})")
        try:
            with open(path, "rb") as f:
                batch = _BatchUnpickler(f, encoding="latin1").load()   # latin1: Python 2's str, numpy's raw bytes
            xs.append(np.asarray(batch["data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
            ys.append(np.asarray(batch["labels"], dtype=np.int64))
            if len(xs[-1]) != len(ys[-1]) or not ((ys[-1] >= 0) & (ys[-1] < 10)).all():
                raise ValueError(f"{len(xs[-1])} images, {len(ys[-1])} labels, labels in 0..9 expected")
        except _Refused as exc:
            raise ConfigError(f"{path} is not a CIFAR-10 python batch: {exc}") from None
        except Exception as exc:   # whatever a damaged or foreign file makes the decoding raise: not a batch
            raise ConfigError(f"{path} is not a CIFAR-10 python batch ({type(exc).__name__}: {exc})") from None
    return np.concatenate(xs), np.concatenate(ys)


def check(options: dict, data_dir: str | None) -> Path:
    """The dataset folder, after making sure every batch file is there (downloading when allowed) and decodes as
    CIFAR-10: before a run row exists. Unpickling all six is cheap (about 50 ms from the page cache)."""
    folder = _find(data_dir)
    if not folder.is_dir():
        raise ConfigError(f"no CIFAR-10 folder at {folder}; pass --data-dir pointing at a folder with {LAYOUT}")
    missing = [n for n in TRAIN_FILES + TEST_FILES if not (folder / n).is_file()]
    if missing:
        raise ConfigError(f"CIFAR-10 folder {folder} is incomplete: missing {', '.join(missing)}; expected {LAYOUT}")
    _read(folder, TRAIN_FILES + TEST_FILES)
    return folder


def load(options: dict, data_dir: str | None) -> Dataset:
    import torch

    from flctl.data import Dataset, Split

    folder = check(options, data_dir)
    x_tr, y_tr = _read(folder, TRAIN_FILES)
    x_te, y_te = _read(folder, TEST_FILES)
    return Dataset(Split(torch.from_numpy(x_tr), torch.from_numpy(y_tr)),
                   Split(torch.from_numpy(x_te), torch.from_numpy(y_te)))


def build_model(options: dict, data: Dataset) -> torch.nn.Module:
    # 10-way head, CIFAR stem; normalization inside the model so the data stays uint8.
    import torch

    from flctl.data import Normalize
    from flctl.models import resnet18

    return torch.nn.Sequential(Normalize(MEAN, STD), resnet18(10, small_inputs=True, width=options["width"]))


def _draw(b: int, generator: torch.Generator, device: torch.device) -> dict:
    from flctl.data import crop_flip_params

    return crop_flip_params(b, generator, device, pad=4)


def _apply(x: torch.Tensor, params: dict) -> torch.Tensor:
    from flctl.data import crop_flip

    return crop_flip(x, params, pad=4)


# Training images are saved with a run (for the top-multipliers figure) up to this size: a small or fake CIFAR-10,
# not the full 150 MB training set with every run; those figures show a table instead.
EXTRAS_IMAGE_BYTES = 16 * 2**20


def extras(model: torch.nn.Module, data: Dataset, options: dict) -> dict:
    """``train_images`` [N, 32, 32, 3] uint8 by sample id (docs/design.md), when at most EXTRAS_IMAGE_BYTES."""
    x = data.train.x
    if x.numel() > EXTRAS_IMAGE_BYTES:
        return {}
    return {"train_images": x.permute(0, 2, 3, 1).cpu().numpy()}


TASK = Task(
    name="cifar10",
    kind="classification",
    description="CIFAR-10 (50k/10k), CIFAR ResNet-18, crop+flip on the device",
    defaults=dict(epochs=200, batch_size=128, optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=5e-4,
                  scheduler="cosine", eval_every=10, eps=0.5108256237659907, alpha=1.0, dual_lr=1e-4),
    options=dict(width=64),
    option_ranges=dict(width=(1, None)),
    # paper, primal hyper-parameters table: CSERM takes a step size of lr/10 "to address numerical issues"
    method_defaults={"cserm": dict(lr=0.01)},
    load=load,
    build_model=build_model,
    augment=Augment(_draw, _apply),   # random crop (zero padding 4) and horizontal flip
    extras=extras,
    check=check,
    smoke={"options": {"width": 8}},
)
