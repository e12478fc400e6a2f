"""UTKFace age regression with an ImageNet-stem ResNet-18 and one output (paper App. B).

Reads the dataset's real on-disk format: a folder of JPEGs named ``AGE_GENDER_RACE_DATETIME.jpg`` (the
"aligned&cropped" release also has ``...jpg.chip.jpg``). A name counts when its first ``_``-separated field is an
integer age and it ends in ``.jpg``; other ``.jpg`` names (the real release has a few with missing fields) are
skipped and counted in ``meta["skipped"]``. There is no public download: ``--data-dir`` is required.

Decoding ~24k JPEGs is slow, so the decoded images (uint8) + ages + file names are cached once as one ``.npz``
in the data folder (or under ``$FLCTL_DATA/utkface`` -- default ``~/.cache/flctl/utkface`` -- when the folder is
read-only), keyed by the sorted file list and the image size. The cache is written to a unique temporary file
and moved into place with ``os.replace`` (atomic), so runs building it at the same time never see a partial
file: the last writer wins, with identical content.

Preprocessing, with N valid images (files sorted by name first, so everything below is stable; every draw is
seeded by ``data_seed``). ``-o split=paper-code`` (the default) follows the authors' code, which reproduces the
paper's 4,438 training samples; ``-o split=70-30`` follows the paper's text:
  * paper-code: keep a seeded 30 % of the Y images with age <= 4 (floor(3 Y / 10)) and all older ones, giving
    N' images; split them 80/20: n_train_full = floor(8 N' / 10), n_test = N' - n_train_full
  * 70-30:      N' = N; n_train_full = floor(7 N / 10), n_test = N - n_train_full
  * both: a seeded quarter of the training part is kept, n_train = ceil(n_train_full / 4) (the rest is unused)
  * ages z-scored with the kept training split's mean and (population) std; y is float32.
Real release (N = 23,708, Y ~ 2,167): paper-code N' = 22,191, n_train = 4,438, n_test = 4,439 (the paper's count);
70-30: n_train = 4,149, n_test = 7,113.
Images are resized to ``size`` x ``size`` with Lanczos (200, the release's own size, by default; ``-o size=64``
trains ~10x faster) and standardized in the model's first layer with the dataset's channel statistics, as the
authors' code does.

Sample ids are positions in the kept splits, which keep sorted file order; ``meta["train_names"]`` /
``meta["test_names"]`` hold each sample's file name so reports can show the faces.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from flctl.errors import ConfigError
from flctl.tasks import Augment, Task

if TYPE_CHECKING:   # torch is imported where used: planning a sweep does not need it
    import torch

    from flctl.data import Dataset, Split

# ImageNet per-channel statistics (ImageNet-style ResNet stem and input pipeline).
# Channel means and stds of UTKFace on the 0-255 scale (the authors' code), as fractions for flctl.data.Normalize.
MEAN = (150.10 / 255, 114.62 / 255, 97.82 / 255)
STD = (66.17 / 255, 58.67 / 255, 57.36 / 255)
SPLITS = ("paper-code", "70-30")
YOUNG_AGE = 4            # paper-code keeps only a seeded 30 % of the images at or below this age
SUBFOLDER = "UTKFace"          # the folder the real archive extracts to
# Where a person gets it (no scripted download: the files sit behind the authors' Google Drive links).
HOME = "https://susanqq.github.io/UTKFace/"
LAYOUT = (f"a folder of JPEGs named AGE_GENDER_RACE_DATETIME.jpg, as UTKFace.tar.gz ('Aligned&Cropped Faces' "
          f"from {HOME}) extracts to {SUBFOLDER}/")
GENDERS = ("male", "female")
RACES = ("White", "Black", "Asian", "Indian", "Others")
CACHE_VERSION = 2   # 2: Lanczos resampling


def _folder(data_dir: str | None) -> Path:
    if data_dir is None:
        raise ConfigError(f"UTKFace has no scripted download; pass --data-dir pointing at {LAYOUT}")
    root = Path(data_dir)
    if not root.is_dir():
        raise ConfigError(f"no UTKFace folder at {root}; pass --data-dir pointing at {LAYOUT}")
    if (root / SUBFOLDER).is_dir() and not any(n.lower().endswith(".jpg") for n in os.listdir(root)):
        return root / SUBFOLDER
    return root


def _age(name: str) -> int | None:
    """The age encoded in a UTKFace file name, or None for a malformed name."""
    field = name.split("_", 1)[0]
    if "_" not in name or not field.isdigit():
        return None
    return int(field)


def _group_labels(names: list[str]) -> dict[str, np.ndarray]:
    """Gender and race of each file name (AGE_GENDER_RACE_DATETIME: gender 0 male, 1 female; race 0 White, 1 Black,
    2 Asian, 3 Indian, 4 Others, per the dataset's documentation); "unknown" where a field is missing or out of
    range (a few names of the real release lack the race)."""
    out: dict[str, list[str]] = {"gender": [], "race": []}
    for name in names:
        fields = name.split("_")
        for attr, position, labels in (("gender", 1, GENDERS), ("race", 2, RACES)):
            field = fields[position] if len(fields) > position + 1 else ""
            out[attr].append(labels[int(field)] if field.isdigit() and int(field) < len(labels) else "unknown")
    return {attr: np.asarray(v) for attr, v in out.items()}


def _scan(folder: Path) -> tuple[list[str], np.ndarray, int]:
    """Valid file names (sorted), their ages, and how many .jpg names were skipped as malformed."""
    names, ages, skipped = [], [], 0
    for name in sorted(os.listdir(folder)):
        if not name.lower().endswith(".jpg") or not (folder / name).is_file():
            continue
        age = _age(name)
        if age is None:
            skipped += 1
            continue
        names.append(name)
        ages.append(age)
    return names, np.asarray(ages, dtype=np.int64), skipped


def check(options: dict, data_dir: str | None) -> Path:
    """The image folder, after making sure the options make sense and the folder holds a validly named image."""
    if options["split"] not in SPLITS:
        raise ConfigError(f"-o split={options['split']}: choose one of {', '.join(SPLITS)}")
    if int(options["size"]) < 8:
        raise ConfigError(f"-o size={options['size']}: images must be at least 8 pixels wide")
    folder = _folder(data_dir)
    names, _, skipped = _scan(folder)
    if not names:
        raise ConfigError(f"UTKFace folder {folder} has no valid images ({skipped} malformed .jpg names skipped); "
                          f"expected {LAYOUT}")
    size = int(options["size"])
    if not any((d / _cache_name(names, size)).is_file() for d in _cache_dirs(folder)):
        _decode(folder, names[:1] + names[-1:], size)   # not decoded before: a sample must decode, now
    return folder


def _decode(folder: Path, names: list[str], size: int) -> np.ndarray:
    from PIL import Image

    out = np.empty((len(names), 3, size, size), dtype=np.uint8)
    for i, name in enumerate(names):
        path = folder / name
        try:
            with Image.open(path) as img:
                rgb = img.convert("RGB").resize((size, size), Image.LANCZOS)
                out[i] = np.asarray(rgb, dtype=np.uint8).transpose(2, 0, 1)
        except Exception as exc:  # PIL raises UnidentifiedImageError, OSError, SyntaxError, ... on bad files
            raise ConfigError(f"{path} is not a readable image ({type(exc).__name__}: {exc})") from None
    return out


def _cache_name(names: list[str], size: int) -> str:
    key = hashlib.sha256(f"v{CACHE_VERSION}\n{size}\n".encode() + "\n".join(names).encode()).hexdigest()[:16]
    return f".flctl-utkface-{size}px-{key}.npz"


def _cache_dirs(folder: Path) -> list[Path]:
    fallback = Path(os.environ.get("FLCTL_DATA", Path.home() / ".cache" / "flctl")) / "utkface"
    return [folder, fallback]


def _read_cache(path: Path, names: list[str], size: int) -> np.ndarray | None:
    try:
        with np.load(path, allow_pickle=False) as z:
            images, cached = z["images"], z["names"].tolist()
    except Exception:  # missing, or damaged by something other than us: rebuild
        return None
    if cached != names or images.shape != (len(names), 3, size, size) or images.dtype != np.uint8:
        return None
    return images


def _write_cache(path: Path, images: np.ndarray, ages: np.ndarray, names: list[str]) -> bool:
    """Atomic write (flctl.fs.atomic_path). False when the folder is not writable."""
    from flctl.fs import atomic_path

    try:
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.savez(f, images=images, ages=ages, names=np.asarray(names, dtype=str))
        return True
    except OSError:
        return False


def _images(folder: Path, names: list[str], ages: np.ndarray, size: int) -> tuple[np.ndarray, Path | None]:
    """Decoded images [N, 3, size, size] uint8, from the cache when there is one; builds the cache otherwise."""
    cname = _cache_name(names, size)
    for d in _cache_dirs(folder):
        images = _read_cache(d / cname, names, size)
        if images is not None:
            return images, d / cname
    images = _decode(folder, names, size)
    for d in _cache_dirs(folder):
        if _write_cache(d / cname, images, ages, names):
            return images, d / cname
    return images, None


def split_sizes(n: int, n_young: int = 0, split: str = "paper-code") -> tuple[int, int, int, int]:
    """(N' images used, n_train_full, n_train kept, n_test) for n valid images of which n_young have age <= 4.

    paper-code, real release (n = 23,708, n_young ~ 2,167): (22,191, 17,752, 4,438, 4,439); 70-30: (23,708,
    16,595, 4,149, 7,113).
    """
    used = n - n_young + (3 * n_young) // 10 if split == "paper-code" else n
    n_full = (8 * used) // 10 if split == "paper-code" else (7 * used) // 10
    return used, n_full, (n_full + 3) // 4, used - n_full


def load(options: dict, data_dir: str | None) -> Dataset:
    import torch

    from flctl.data import Dataset, Split

    folder = check(options, data_dir)
    names, ages, skipped = _scan(folder)
    size = int(options["size"])
    images, cache = _images(folder, names, ages, size)

    rng = np.random.default_rng(int(options["data_seed"]))
    pool = np.arange(len(names))
    if options["split"] == "paper-code":
        young = np.flatnonzero(ages <= YOUNG_AGE)
        kept_young = rng.permutation(young)[:(3 * len(young)) // 10]
        pool = np.sort(np.concatenate([np.flatnonzero(ages > YOUNG_AGE), kept_young]))
    _, n_full, n_train, _ = split_sizes(len(names), int((ages <= YOUNG_AGE).sum()), options["split"])
    perm = rng.permutation(pool)
    train_idx = np.sort(rng.permutation(perm[:n_full])[:n_train])   # a seeded quarter of the training part
    test_idx = np.sort(perm[n_full:])                                # sorted: ids follow file order

    mean = float(ages[train_idx].mean())
    std = float(ages[train_idx].std()) or 1.0                        # training statistics only

    def split(idx: np.ndarray) -> Split:
        y = ((ages[idx] - mean) / std).astype(np.float32)
        return Split(torch.from_numpy(np.ascontiguousarray(images[idx])), torch.from_numpy(y))

    labels = _group_labels(names)
    return Dataset(split(train_idx), split(test_idx), meta={
        "groups": {attr: {"train": v[train_idx], "test": v[test_idx]} for attr, v in labels.items()},
        "target_mean": mean, "target_std": std, "skipped": skipped, "n_images": len(names), "n_used": len(pool),
        "train_names": [names[i] for i in train_idx], "test_names": [names[i] for i in test_idx],
        "cache": str(cache) if cache else None, "folder": str(folder),
    })


def build_model(options: dict, data: Dataset) -> torch.nn.Module:
    # One output (z-scored age), ImageNet stem (7x7 conv + max-pool) for 64px+ faces; normalization inside the
    # model so the data stays uint8 on the device.
    import torch

    from flctl.data import Normalize
    from flctl.models import resnet18

    return torch.nn.Sequential(Normalize(MEAN, STD), resnet18(1, small_inputs=False, width=options["width"]))


def extras(model: torch.nn.Module, data: Dataset, options: dict) -> dict[str, np.ndarray]:
    """Each sample's file name and group labels (by sample id) and the folder, so reports can show the faces and
    the group table without torch."""
    groups = {f"{split}_group_{attr}": v[split] for attr, v in data.meta["groups"].items() for split in ("train", "test")}
    return {"train_names": np.array(data.meta["train_names"]), "test_names": np.array(data.meta["test_names"]),
            "folder": np.array(data.meta["folder"]), **groups}


# Random horizontal flip only: a mirrored face has the same age, while random crops/translations would undo the
# alignment the aligned&cropped release provides (and zero padding adds borders faces never have). This choice is
# ours; the paper does not detail the augmentation.
def _draw_flip(b: int, generator: torch.Generator, device: torch.device) -> dict:
    import torch

    return {"flip": torch.rand(b, device=device, generator=generator) < 0.5}


def _apply_flip(x: torch.Tensor, params: dict) -> torch.Tensor:
    import torch

    return torch.where(params["flip"][:, None, None, None], x.flip(3), x)


TASK = Task(
    name="utkface",
    kind="regression",
    description="UTKFace age (authors' split: 4,438 train on the full release; z-scored), ImageNet-stem ResNet-18, 1 output",
    defaults=dict(epochs=150, batch_size=128, optimizer="adamw", lr=1e-4, weight_decay=0.0,
                  scheduler="constant", eval_every=10, eps=0.02, alpha=0.1, dual_lr=1e-3),
    # size: the paper does not state the input resolution; 64x64 is our choice (the JPEGs are 200x200).
    options=dict(width=64, size=200, data_seed=0, split="paper-code"),
    option_ranges=dict(width=(1, None), size=(8, None), data_seed=(0, None)),
    # paper, primal hyper-parameters table: CSERM takes a step size of lr/10 "to address numerical issues"
    method_defaults={"cserm": dict(lr=1e-5)},
    load=load,
    build_model=build_model,
    augment=Augment(_draw_flip, _apply_flip),
    extras=extras,
    check=check,
    smoke={"options": {"size": 32, "width": 8}},
)
