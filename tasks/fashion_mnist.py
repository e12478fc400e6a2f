"""Fashion-MNIST classification (70,000 real 28x28 grayscale clothing images, 60k/10k, 10 classes): the paper's
CIFAR-10 set-up (§4, Table 1) on images that every machine can have.

Reads the dataset's real on-disk format, the four IDX files (gzipped or not) that Zalando publishes and torchvision
downloads: ``{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]``. Where they are looked for, in order:
  1. ``--data-dir``: a folder holding the four files, or torchvision's root (``FashionMNIST/raw/`` under it);
  2. Debian's package ``dataset-fashion-mnist`` (``apt install dataset-fashion-mnist``, 31 MB), which installs the
     original gzipped files in /usr/share/datasets/fashion-mnist;
  3. ``$FLCTL_DATA/fashion-mnist`` (default ``~/.cache/flctl/fashion-mnist``), downloaded there once through
     torchvision when online.

Models (``-o model=``, part of the run's identity): ``resnet18``, the paper's CIFAR ResNet-18 with a one-channel
3x3 stem, the default on a GPU; ``cnn``, three conv-BatchNorm blocks (flctl.models.conv_net), the default on a CPU,
where ResNet-18 on 60k images would take about 13 minutes an epoch on 2 cores. ``-o width=0`` is the model's own width
(ResNet-18: 64; CNN: 16).

Augmentation, as the paper's CIFAR pipeline scaled to 28x28: a random crop with zero padding 2 (CIFAR's 4 of 32
pixels is 3.5 of 28) and a horizontal flip. The flip is kept: every class is its own mirror image (a mirrored shirt,
bag or dress is one; a mirrored sandal or boot is the other foot's), so it adds views without changing labels. Images
stay uint8 on the device; normalization is the model's first layer.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from flctl.errors import ConfigError
from flctl.fs import undone_on_failure
from flctl.tasks import Augment, Task
from flctl_tasks.cifar10 import TASK as CIFAR10

if TYPE_CHECKING:   # torch is imported where used: planning a sweep does not need it
    import torch

    from flctl.data import Dataset

DEBIAN = Path("/usr/share/datasets/fashion-mnist")    # where `apt install dataset-fashion-mnist` puts the files
HOME = "https://github.com/zalandoresearch/fashion-mnist"
FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
         "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
SIZES = {"train": 60_000, "test": 10_000}
CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
MODELS = ("cnn", "resnet18")
WIDTH = {"cnn": 16, "resnet18": 64}                     # the models' own widths (-o width=0)
# Pixel mean and standard deviation of the 60,000 training images.
MEAN, STD = (0.2860,), (0.3530,)
PAD = 2
WAYS_OUT = (f"install Debian's package (apt install dataset-fashion-mnist), pass --data-dir pointing at a folder with "
            f"the four IDX files from {HOME}, or run once online")


def _file(folder: Path, name: str) -> Path | None:
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def complete(folder: Path) -> bool:
    """Whether ``folder`` holds the four files (gzipped or not)."""
    return all(_file(folder, name) is not None for pair in FILES.values() for name in pair)


def _find(data_dir: str | None) -> Path:
    """The folder holding the four files (see the module docstring for the order)."""
    if data_dir is not None:
        root = Path(data_dir)
        for folder in (root, root / "FashionMNIST" / "raw"):
            if complete(folder):
                return folder
        wanted = ", ".join(n for pair in FILES.values() for n in pair)
        raise ConfigError(f"no Fashion-MNIST files in {root}: expected {wanted} (each may end in .gz)")
    if complete(DEBIAN):
        return DEBIAN
    cache = Path(os.environ.get("FLCTL_DATA", Path.home() / ".cache" / "flctl")) / "fashion-mnist"
    raw = cache / "FashionMNIST" / "raw"
    if not complete(raw):
        from torchvision.datasets import FashionMNIST

        try:
            with undone_on_failure(cache):
                FashionMNIST(str(cache), download=True)
        except Exception as exc:  # offline, proxy, disk: one message naming every way out
            raise ConfigError(f"Fashion-MNIST is not installed and could not be downloaded ({type(exc).__name__}); "
                              f"{WAYS_OUT}") from None
    return raw


@functools.lru_cache(maxsize=8)
def _idx(path: Path, mtime_ns: int) -> np.ndarray:
    """One IDX file as an array: a big-endian header (two zero bytes, type 0x08 = uint8, the number of dimensions,
    then each dimension as a 32-bit integer) and the values. Checked here rather than by torchvision's reader, which
    takes uncompressed files only and asserts; a damaged or foreign file is one line naming it."""
    try:
        data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        zero, kind, ndim = int.from_bytes(data[:2], "big"), data[2], data[3]
        if zero != 0 or kind != 0x08 or not 1 <= ndim <= 3:
            raise ValueError(f"header {data[:4].hex()} is not an IDX file of bytes")
        shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
        values = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
        if values.size != int(np.prod(shape)):
            raise ValueError(f"{values.size} values for shape {shape}")
    except (OSError, EOFError, ValueError, gzip.BadGzipFile, IndexError) as exc:
        raise ConfigError(f"{path} is not a Fashion-MNIST IDX file ({type(exc).__name__}: {exc})") from None
    return values.reshape(shape)


def _read(folder: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Images [N, 28, 28] uint8 and labels [N] int64 of one split, checked against each other and the class count."""
    paths = [_file(folder, name) for name in FILES[split]]
    for path, name in zip(paths, FILES[split]):
        if path is None:
            raise ConfigError(f"Fashion-MNIST folder {folder} is incomplete: {name} is missing")
    x, y = (_idx(p, p.stat().st_mtime_ns) for p in paths if p is not None)
    if x.ndim != 3 or x.shape[1:] != (28, 28) or y.ndim != 1 or len(x) != len(y) or y.max(initial=0) >= len(CLASSES):
        raise ConfigError(f"{folder}: {split} images {x.shape} and labels {y.shape} are not Fashion-MNIST's "
                          f"(28x28 images, one label in 0..9 each)")
    return x, y.astype(np.int64)


def check(options: dict, data_dir: str | None) -> Path:
    """The data folder, after reading and checking all four files (about 0.3 s, once per process), and the options:
    before a run row exists."""
    if options["model"] not in MODELS:
        raise ConfigError(f"-o model={options['model']!r}: choose one of {', '.join(MODELS)}")
    folder = _find(data_dir)
    for split in FILES:
        _read(folder, split)
    return folder


def data_source(options: dict, data_dir: str | None) -> str:
    """What a run's images came from: Debian's package and its version, or the folder and a hash of its four files."""
    folder = _find(data_dir)
    if folder == DEBIAN:
        try:
            out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "dataset-fashion-mnist"], capture_output=True,
                                 text=True, timeout=10)
            version = out.stdout.strip() if out.returncode == 0 else "(version unknown)"
        except (OSError, subprocess.TimeoutExpired):
            version = "(version unknown)"
        return f"Debian package dataset-fashion-mnist {version} ({DEBIAN})"
    digest = hashlib.sha256()
    for pair in FILES.values():
        for name in pair:
            path = _file(folder, name)
            assert path is not None      # _find returned a complete folder
            digest.update(path.read_bytes())
    return f"folder {folder} (sha256 of the four files {digest.hexdigest()[:16]})"


def load(options: dict, data_dir: str | None) -> Dataset:
    import torch

    from flctl.data import Dataset, Split

    folder = check(options, data_dir)
    splits = [_read(folder, split) for split in FILES]
    return Dataset(*(Split(torch.from_numpy(x.copy()).unsqueeze(1), torch.from_numpy(y)) for x, y in splits))


def build_model(options: dict, data: Dataset) -> torch.nn.Module:
    import torch

    from flctl.data import Normalize
    from flctl.models import conv_net, resnet18

    width = options["width"] or WIDTH[options["model"]]
    body = (resnet18(10, small_inputs=True, width=width, in_channels=1) if options["model"] == "resnet18"
            else conv_net(1, 10, width=width))
    return torch.nn.Sequential(Normalize(MEAN, STD), body)


def _draw(b: int, generator: torch.Generator, device: torch.device) -> dict:
    from flctl.data import crop_flip_params

    return crop_flip_params(b, generator, device, pad=PAD)


def _apply(x: torch.Tensor, params: dict) -> torch.Tensor:
    from flctl.data import crop_flip

    return crop_flip(x, params, pad=PAD)


# Training images saved with a run (for the top-multipliers figure) up to this size: a subset, not all 47 MB.
EXTRAS_IMAGE_BYTES = 16 * 2**20


def extras(model: torch.nn.Module, data: Dataset, options: dict) -> dict:
    """``train_images`` [N, 28, 28] uint8 by sample id (docs/design.md), when at most EXTRAS_IMAGE_BYTES."""
    x = data.train.x
    return {} if x.numel() > EXTRAS_IMAGE_BYTES else {"train_images": x[:, 0].cpu().numpy()}


TASK = Task(
    name="fashion-mnist",
    kind="classification",
    description="Fashion-MNIST (60k/10k real 28x28 images): ResNet-18 on a GPU, a small CNN on a CPU; crop+flip",
    # the paper's Table 1 set-up: the CIFAR-10 task's values (SGD 0.1 cosine, 200 epochs, CSERM at lr/10, ...)
    defaults=CIFAR10.defaults,
    method_defaults=CIFAR10.method_defaults,
    options=dict(model="cnn", width=0),
    device_options={"cuda": {"model": "resnet18"}},
    option_ranges=dict(width=(0, None)),
    load=load,
    build_model=build_model,
    augment=Augment(_draw, _apply),
    extras=extras,
    check=check,
    data_source=data_source,
    smoke={"options": {"width": 4}},
)
