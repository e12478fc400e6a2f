"""What made a run besides its configuration: the versions of flctl and of the libraries that make its numbers.

Each run records them in its provenance (`flctl show RUN --json`: ``provenance.libraries`` and ``provenance.data``),
`flctl report --table runs` shows them (``versions.*`` columns; the terminal view keeps the ones that vary), and a
table row whose runs were trained under several versions of a library in CHANGES_NUMBERS says so in a note. Reading
them takes milliseconds: installed distributions' metadata, not imports (torch is already imported where a run trains).
"""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import re
import subprocess
import sys
from pathlib import Path

# flctl and the distributions whose versions can change what a run computes or asks: kernels and their defaults
# (torch), random streams and numerics (numpy, scipy), bundled and generated data sets (scikit-learn), the polyfit
# solver (cvxpy), `--tune`'s suggestions (optuna), the records' encoding (pyarrow).
LIBRARIES = ("flctl", "torch", "numpy", "scipy", "scikit-learn", "cvxpy", "optuna", "pyarrow")
# Those whose difference alone can move a run's numbers: a table row over runs that differ in one of them says so,
# and `flctl reproduce` warns of these (and flctl's own version), of no other (flctl.reproduce.COMPARED).
CHANGES_NUMBERS = ("torch", "cuda", "numpy", "scipy", "scikit-learn", "cvxpy")


def git_revision() -> str | None:
    """The revision of the flctl checkout, if it is one (recorded with each run)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache     # once per process: a sweep worker records them with each of its cells
def _installed() -> dict[str, str | None]:
    return {**{name: _version(name) for name in LIBRARIES}, "python": platform.python_version(),
            "flctl_commit": git_revision()}


def library_versions() -> dict[str, str | None]:
    """LIBRARIES' installed versions, with Python's, the CUDA torch was built for (None: a CPU build) and flctl's
    commit when it runs from a checkout (the code this process loaded)."""
    found = dict(_installed())
    torch = sys.modules.get("torch")
    if torch is not None:      # torch's own string keeps the build (2.14.1+cu130, +cpu): other wheels, other kernels
        found["torch"] = torch.__version__
    found["cuda"] = torch.version.cuda if torch is not None else None
    return found


# torchvision's own version table: torchvision 0.N is built for torch 2.(N - 15), from 0.15 with torch 2.0 (flctl's
# range, torch 2.4 to 2.14, is torchvision 0.19 to 0.29). A wheel of one beside the other of another minor version
# fails on its first import with a 40-line traceback (`operator torchvision::nms does not exist`).
TORCHVISION_OFFSET = 15
# The local label of the PyTorch index's wheels (2.14.1+cpu, +cu130, +rocm6.4, +xpu): the index to install from.
_INDEX_LABEL = re.compile(r"cpu|cu\d+|rocm[\d.]+|xpu")
# The pair a fresh install from the default index gets within pyproject.toml's bounds (torch<2.15, torchvision<0.30):
# the fix for a CPU torch where PyTorch's index is out of reach (tests/test_install_pair.py holds it to pyproject).
NEWEST_PAIR = ("2.14.1", "0.29.1")


def _minor(version: str, major: int) -> int | None:
    """The minor version of ``version`` when its major one is ``major``; None otherwise or when it is not a version."""
    m = re.match(r"(\d+)\.(\d+)", version)
    return int(m.group(2)) if m and int(m.group(1)) == major else None


def _built(distribution: str) -> str | None:
    """The version ``distribution`` (torch, torchvision) was built as, with its local label (2.13.0+cpu, 0.28.0+cu128):
    its ``version.py``'s ``__version__``, read as text (no import). The metadata's version lacks the label where the
    wheel came from PyPI, whose Linux wheels are CUDA builds: a torchvision from PyPI beside a CPU torch reads 0.28.0
    there and 0.28.0+cu128 here. Falls back to the metadata's version."""
    version = _version(distribution)
    if version is None:
        return None
    try:
        text = Path(str(importlib.metadata.distribution(distribution).locate_file(f"{distribution}/version.py")))
        found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text.read_text(), re.MULTILINE)
    except (OSError, importlib.metadata.PackageNotFoundError):
        return version
    return found.group(1) if found and found.group(1).partition("+")[0] == version.partition("+")[0] else version


def torch_pair_problem() -> str | None:
    """A line saying that the installed torchvision was built for another torch than the installed one (another
    minor version, or another build: CPU against CUDA, one CUDA against another), naming both and the pip command
    that installs the torchvision built for this torch (for a CPU torch, also the default index's pair, for where
    PyTorch's index is out of reach); None when they belong together, when either is not installed, when a version
    is outside torchvision's table or a build is not named. Reads files (milliseconds): imports neither, so a command
    that never uses torch pays nothing more."""
    torch, vision = _built("torch"), _built("torchvision")
    if torch is None or vision is None:
        return None
    t, v = _minor(torch, 2), _minor(vision, 0)
    if t is None or v is None or v < TORCHVISION_OFFSET:
        return None
    label, vision_label = torch.partition("+")[2], vision.partition("+")[2]
    # builds told apart by PyTorch's index labels only: a from-source or vendor build (2.6.0a0+ecf3bae40a.nv25.01
    # beside 0.21.0a0+8a9f5a1: an NVIDIA container's) labels each with its own commit, and belongs together
    other_build = all(_INDEX_LABEL.fullmatch(x) for x in (label, vision_label)) and label != vision_label
    if v - TORCHVISION_OFFSET == t and not other_build:
        return None
    built_for = f"a {_build_name(vision_label)} torch" if v - TORCHVISION_OFFSET == t else \
        f"torch 2.{v - TORCHVISION_OFFSET}"
    # torchvision 0.(N+15).P is the release of torch 2.N.P (from torch 2.1; flctl's range starts at 2.4)
    patch = m.group(1) if (m := re.match(r"\d+\.\d+\.(\d+)", torch)) else "0"
    wanted = f"0.{t + TORCHVISION_OFFSET}.{patch}"
    # from PyTorch's index where torch's metadata keeps the label there too (2.13.0+cpu); a PyPI wheel's lacks it
    index = _INDEX_LABEL.fullmatch(label) is not None and "+" in (_version("torch") or "")
    fix = f"pip install {_exactly('torchvision', wanted, label if index else '')}" + \
        (f" --index-url https://download.pytorch.org/whl/{label}" if index else "")
    # PyTorch's CPU index may be out of reach (a proxy, a mirror of PyPI only), which is how this pair comes about:
    # pip fell back, silently, to a CUDA torchvision from another index. The default index's newest pair (CUDA
    # builds, which run on a CPU) is the way out that cannot give this pair back: other numbers, each spelt exactly.
    fallback = (f"; where that index is out of reach (pip finds no such torchvision), the default index's pair "
                f"(CUDA builds, about 6 GB, which run on a CPU too): "
                f"pip install {_exactly('torch', NEWEST_PAIR[0])} {_exactly('torchvision', NEWEST_PAIR[1])}"
                ) if label == "cpu" and index else ""
    return (f"torchvision {vision} is built for {built_for}, not for the installed torch {torch}; "
            f"install the torchvision built for it: {fix}{fallback}")


def _exactly(distribution: str, version: str, label: str = "") -> str:
    """A pip requirement for exactly this version and build: `===`, which compares the strings. `==2.13.0` and
    `==2.13.*` ignore a local label (PEP 440), so they accept 2.13.0+cpu, and a CPU wheel that pip still sees (a
    find-links folder, an extra index) comes back beside a CUDA torchvision: the broken pair, again."""
    return f"'{distribution}==={version}{'+' + label if label else ''}'"


def _build_name(label: str) -> str:
    """cpu -> CPU, cu128 -> CUDA 12.8, rocm6.4 -> ROCm 6.4."""
    if label.startswith("cu") and label[2:].isdigit():
        return f"CUDA {label[2:-1]}.{label[-1]}"
    return {"cpu": "CPU", "xpu": "XPU"}.get(label) or label.replace("rocm", "ROCm ")


def check_pair() -> int:
    """`python -m flctl.versions` (from a checkout, before flctl is installed; the README's CPU route runs it after
    its pip command, which exits 0 where it fell back to another index): the installed torch and torchvision, and
    0 when they belong together; else the start-up check's line, with its fix, and 1."""
    torch, vision = _built("torch"), _built("torchvision")
    if torch is None or vision is None:
        print(f"error: {'torch' if torch is None else 'torchvision'} is not installed", file=sys.stderr)
        return 1
    if (problem := torch_pair_problem()) is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    print(f"torch {torch} and torchvision {vision}: built for each other")
    return 0


if __name__ == "__main__":
    sys.exit(check_pair())
