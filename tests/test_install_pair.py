"""The way out of a mismatched torch/torchvision install, followed as a new user would follow it.

A scratch venv gets a mismatched pair for real, from wheels on this machine's disk; flctl's start-up check runs in it
and prints its fix; the test runs that command as printed (only `pip` becomes the scratch venv's pip) and expects a
working `flctl run`. The scratch venv borrows everything else (flctl, its dependencies, the CUDA libraries) from the
venv running the tests, through a .pth file that puts that venv's site-packages after its own: what the scratch venv
installs itself shadows the borrowed copies, for imports and for pip alike. Skips where pip's configured sources hold
no such wheels on disk (a user's machine): it downloads nothing.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import re
import shlex
import subprocess
import sys
import sysconfig
import tomllib
import urllib.parse
from pathlib import Path

import pytest
from packaging.tags import sys_tags
from packaging.utils import parse_wheel_filename

from flctl.versions import NEWEST_PAIR, TORCHVISION_OFFSET

ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def _pip_sources() -> list[str]:
    """The find-links folders and indexes pip is configured with (its config files and PIP_* variables)."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=120)
    sources = []
    for line in out.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.rsplit(".", 1)[-1] in ("find-links", "index-url", "extra-index-url"):
            sources += value.strip().strip("'\"").split()
    return sources


def _local_wheel(name: str, version: str) -> Path | None:
    """A wheel of exactly ``version`` (the string: 2.13.0+cpu is not 2.13.0) for this interpreter, on disk in one of
    pip's sources: a find-links folder, or a file:// simple index's page for ``name``."""
    supported = set(sys_tags())
    for source in _pip_sources():
        root = Path(urllib.parse.unquote(urllib.parse.urlparse(source).path)) if "://" in source else Path(source)
        page = root / name / "index.html"
        if page.is_file():
            files = [page.parent / urllib.parse.unquote(href)
                     for href in re.findall(r'href="([^"#]+)', page.read_text(errors="replace"))]
        else:
            files = list(root.glob("*.whl")) if root.is_dir() else []
        for file in files:
            try:
                wheel_name, wheel_version, _, tags = parse_wheel_filename(file.name)
            except ValueError:
                continue
            if wheel_name == name and str(wheel_version) == version and tags & supported and file.is_file():
                return file.resolve()
    return None


def _wheels(*wanted: tuple[str, str]) -> list[Path]:
    found = [_local_wheel(name, version) for name, version in wanted]
    missing = [f"{name} {version}" for (name, version), file in zip(wanted, found, strict=True) if file is None]
    if missing:
        pytest.skip(f"no local wheel of {', '.join(missing)} among pip's sources (this test downloads nothing)")
    return [file for file in found if file is not None]


def _scratch_venv(tmp_path: Path) -> Path:
    """A new venv (its own pip) that sees the running venv's packages after its own; returns its python."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    # addsitedir, not a bare path: the running venv's own .pth files (flctl's editable install) apply there too
    (Path(site) / "zz_borrowed.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    return python


def _pip(python: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(python), "-m", "pip", *args], capture_output=True, text=True, timeout=timeout)


def _check(python: Path) -> subprocess.CompletedProcess[str]:
    """flctl's start-up check in the scratch venv, as the README's CPU route runs it."""
    return subprocess.run([str(python), "-m", "flctl.versions"], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


def _follow(python: Path, command: str) -> None:
    """Run a printed `pip install ...` as printed, with the scratch venv's pip; it must name no index of its own
    (this test reaches only the sources pip is configured with)."""
    words = shlex.split(command)
    assert words[:2] == ["pip", "install"] and not any(w.startswith("--index-url") for w in words), command
    done = _pip(python, *words[1:])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def _works(python: Path, tmp_path: Path) -> None:
    """The check passes and flctl trains, with the torchvision the scratch venv installed."""
    check = _check(python)
    assert check.returncode == 0 and "built for each other" in check.stdout, check.stdout + check.stderr
    where = subprocess.run([str(python), "-c", "import torchvision; print(torchvision.__file__)"],
                           capture_output=True, text=True, timeout=300)
    assert where.stdout.startswith(str(tmp_path / "venv")), where.stdout + where.stderr
    run = subprocess.run([str(python), "-m", "flctl", "run", "two-moons", "--epochs", "2"], capture_output=True,
                         text=True, cwd=tmp_path, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]


def _fixes(python: Path) -> list[str]:
    """The pip commands the check's line prints, in order."""
    check = _check(python)
    assert check.returncode == 1 and check.stderr.startswith("error: torchvision "), check.stdout + check.stderr
    return re.findall(r"pip install [^;]*?(?=;|$)", check.stderr.strip())


def test_the_newest_pair_is_the_newest_that_pyproject_allows() -> None:
    """NEWEST_PAIR, the fix where PyTorch's index is out of reach, is a pair and what a fresh install gets."""
    wanted = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    caps = {m.group(1): m.group(2) for d in wanted if (m := re.fullmatch(r"(torch|torchvision)>=[\d.]+,<([\d.]+)", d))}
    torch, vision = (tuple(int(x) for x in v.split(".")) for v in NEWEST_PAIR)
    assert caps == {"torch": f"2.{torch[1] + 1}", "torchvision": f"0.{vision[1] + 1}"}, caps
    assert vision[1] - TORCHVISION_OFFSET == torch[1] and vision[2] == torch[2], NEWEST_PAIR


@pytest.mark.slow    # a venv, a real install of a wheel and a training run: about a minute
def test_a_torchvision_of_another_minor_beside_a_pypi_torch_is_fixed_from_the_default_index(tmp_path: Path) -> None:
    """torch from the default index (this venv's), torchvision one minor behind: the fix names the default index
    and the torchvision of this torch exactly, and following it gives a working flctl."""
    torch = importlib.metadata.version("torch")
    if "+" in torch or not (m := re.fullmatch(r"2\.(\d+)\.(\d+)", torch)):
        pytest.skip(f"the running venv's torch {torch} is not a default-index release")
    minor, patch = int(m.group(1)), m.group(2)
    _wheels(("torchvision", f"0.{minor + TORCHVISION_OFFSET}.{patch}"))      # what the fix installs
    behind = next((f"0.{minor + TORCHVISION_OFFSET - 1}.{p}" for p in range(4)
                   if _local_wheel("torchvision", f"0.{minor + TORCHVISION_OFFSET - 1}.{p}")), None)
    if behind is None:
        pytest.skip(f"no local wheel of torchvision 0.{minor + TORCHVISION_OFFSET - 1}.*")
    python = _scratch_venv(tmp_path)
    (wheel,) = _wheels(("torchvision", behind))
    assert _pip(python, "install", "--no-deps", str(wheel)).returncode == 0
    (fix,) = _fixes(python)
    assert fix == f"pip install 'torchvision===0.{minor + TORCHVISION_OFFSET}.{patch}'", fix
    _follow(python, fix)
    _works(python, tmp_path)


@pytest.mark.slow    # a venv, real installs of two torch wheels and a training run: about two minutes
def test_a_cpu_torch_beside_a_cuda_torchvision_is_fixed_where_pytorchs_index_is_out_of_reach(tmp_path: Path) -> None:
    """The README's CPU route where PyTorch's CPU index is out of reach: pip falls back to a CPU torch (here from a
    find-links folder) beside the default index's CUDA torchvision of the same numbers. The pins of the minor
    version give that pair back (a +cpu wheel matches `==2.13.*`); the check's fix for where that index is out of
    reach does not, and leads to a working flctl."""
    if importlib.metadata.version("torch") != NEWEST_PAIR[0]:
        pytest.skip(f"the running venv's torch is not {NEWEST_PAIR[0]}, whose CUDA libraries the scratch venv borrows")
    _wheels(("torch", NEWEST_PAIR[0]), ("torchvision", NEWEST_PAIR[1]))       # what the fix installs
    cpu = next((w for d in _pip_sources() for w in (Path(d).glob("torch-2.*+cpu-*.whl") if Path(d).is_dir() else [])
                if _local_wheel("torch", parse_wheel_filename(w.name)[1].public + "+cpu")), None)
    if cpu is None:
        pytest.skip("no local wheel of a CPU torch in pip's find-links folders")
    version = parse_wheel_filename(cpu.name)[1]
    minor, patch = version.minor, version.micro
    (cuda_vision,) = _wheels(("torchvision", f"0.{minor + TORCHVISION_OFFSET}.{patch}"))
    python = _scratch_venv(tmp_path)
    assert _pip(python, "install", "--no-deps", str(cpu), str(cuda_vision)).returncode == 0

    # what the fix printed before asked for the minor version again: pip resolves it to the very same pair
    again = _pip(python, "install", "--dry-run", "--quiet", "--report", "-", "--force-reinstall", "--no-deps",
                 f"torch==2.{minor}.*", f"torchvision==0.{minor + TORCHVISION_OFFSET}.*", timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    chosen = {i["metadata"]["name"]: i["metadata"]["version"] for i in json.loads(again.stdout)["install"]}
    assert chosen == {"torch": f"2.{minor}.{patch}+cpu", "torchvision": f"0.{minor + TORCHVISION_OFFSET}.{patch}"}

    first, out_of_reach = _fixes(python)
    assert first == (f"pip install 'torchvision===0.{minor + TORCHVISION_OFFSET}.{patch}+cpu' "
                     "--index-url https://download.pytorch.org/whl/cpu"), first
    assert out_of_reach == f"pip install 'torch==={NEWEST_PAIR[0]}' 'torchvision==={NEWEST_PAIR[1]}'", out_of_reach
    _follow(python, out_of_reach)
    _works(python, tmp_path)
