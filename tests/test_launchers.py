"""Launchers as backends (flctl.launch.backends): a new one is one file and an entry point, found by
`flctl sweep --executor NAME`; nothing outside the backends compares a launcher's name; --device cuda:N works
whichever launcher starts the worker."""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
import sys
import textwrap
from pathlib import Path

import pytest

from flctl.errors import ConfigError
from flctl.launch.backends import Launcher, Slot, get_launcher, names
from flctl.outcomes import Ending, named
from tests.helpers import config, in_process

ROOT = Path(__file__).resolve().parents[1]

# A launcher of its own package: each slot's worker runs in a thread of the launching process, one after the other.
TOY = '''
import dataclasses

from flctl.launch.backends import Launcher, Slot


@dataclasses.dataclass(frozen=True)
class InlineOptions:
    label: str = ""

    def check(self):
        pass


class Inline(Launcher):
    """Workers in this process, one after the other (a toy: what a Ray or Kubernetes launcher fills in)."""

    name = "inline"
    Options = InlineOptions
    in_process = True

    def slots(self, cells, device, *, workers, threads, per_gpu):
        return [Slot(i) for i in range(min(2, cells))]

    def start(self, worker, slots, folder, log):
        for slot in slots:
            worker(slot)
        (folder / "inline-started.txt").write_text(str(len(slots)))
        return []
'''


@pytest.fixture
def installed_toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A package `toy_launcher` installed as a distribution would be: its module and a .dist-info whose
    entry_points.txt names it in the group flctl.launchers (what importlib.metadata reads)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "toy_launcher.py").write_text(TOY)
    info = site / "toy_launcher-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-launcher\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[flctl.launchers]\ninline = toy_launcher:Inline\n")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    yield site
    sys.modules.pop("toy_launcher", None)


def test_an_installed_launcher_is_found_and_runs_a_sweep(installed_toy: Path, tmp_path: Path) -> None:
    assert names()[:3] == ["debug", "local", "slurm"] and "inline" in names()
    results = tmp_path / "results"
    res = in_process("sweep", "two-moons", "-m", "fl", "--seeds", "3", "--epochs", "2", "--executor", "inline",
                     "--wait", "--results-dir", str(results), env={"FLCTL_DB": f"sqlite:///{results / 'flctl.db'}"})
    assert res.returncode == 0, res.stdout + res.stderr
    assert list(results.glob("jobs/*/inline-started.txt"))[0].read_text() == "2"
    assert "its workers ran in this process (inline)" in res.stdout, res.stdout
    rows = json.loads(in_process("runs", "--json", env={"FLCTL_DB": f"sqlite:///{results / 'flctl.db'}"}).stdout)
    assert [r["status"] for r in rows] == ["completed"] * 3
    plan = in_process("sweep", "two-moons", "-m", "fl", "--executor", "inline", "--dry-run")
    assert plan.returncode == 0 and "launch through inline\n" in plan.stdout, plan.stdout + plan.stderr


def test_an_installed_launcher_named_like_flctls_own_is_said_to_be_unused(installed_toy: Path, monkeypatch) -> None:
    import flctl.text

    monkeypatch.setattr(flctl.text, "_MET", set())     # once per process: this test's process looked before
    (installed_toy / "toy_launcher-0.1.dist-info" / "entry_points.txt").write_text(
        "[flctl.launchers]\nlocal = toy_launcher:Inline\n")
    importlib.invalidate_caches()
    res = in_process("sweep", "two-moons", "-m", "fl", "--executor", "local", "--dry-run")
    assert res.returncode == 0 and "launch through local: worker processes on this machine" in res.stdout
    assert res.stderr.count("the installed launcher 'local' (toy_launcher:Inline) is not used") == 1, res.stderr


def test_an_unknown_launcher_is_refused_naming_the_installed_ones(installed_toy: Path, tmp_path: Path) -> None:
    res = in_process("sweep", "two-moons", "-m", "fl", "--epochs", "2", "--executor", "nosuch",
                     "--results-dir", str(tmp_path / "r"))
    assert res.returncode == 2
    assert "unknown executor 'nosuch'; choose one of: debug, local, slurm, inline" in res.stderr
    assert not (tmp_path / "r").exists()


def test_a_launcher_entry_point_that_is_not_a_launcher_is_one_line(tmp_path: Path, monkeypatch) -> None:
    site = tmp_path / "site"
    (site / "bad_launcher-0.1.dist-info").mkdir(parents=True)
    (site / "bad_launcher.py").write_text("class NotOne:\n    name = 'bad'\n")
    (site / "bad_launcher-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: bad\nVersion: 0.1\n")
    (site / "bad_launcher-0.1.dist-info" / "entry_points.txt").write_text("[flctl.launchers]\nbad = bad_launcher:NotOne\n")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    with pytest.raises(ConfigError, match=r"^bad_launcher:NotOne is not a flctl.launch.backends.Launcher subclass"):
        get_launcher("bad")


FAULTS = {      # an installed launcher's fault: the body it is given, and what the one line says of it
    "constructor raises": ("def __init__(self, options=None):\n        raise RuntimeError('cluster login failed')",
                           "the launcher's constructor RuntimeError: cluster login failed"),
    "check raises": ("def check(self, results_root, *, dry_run):\n        raise RuntimeError('no cluster')",
                     "check() RuntimeError: no cluster"),
    "slots returns None": ("def slots(self, cells, device, *, workers, threads, per_gpu):\n        return None",
                           "slots() returned None, not a list of Slot"),
    "slots returns ints": ("def slots(self, cells, device, *, workers, threads, per_gpu):\n        return [0, 1]",
                           "slots() returned [0, 1], not a list of Slot"),
    "slots of an older flctl": ("def slots(self, cells, device, settings):\n        return [Slot(0)]",
                                "unexpected keyword argument 'workers' (written for another flctl?"),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_an_installed_launchers_fault_is_one_line_naming_it_with_nothing_written(tmp_path: Path, monkeypatch,
                                                                                   fault: str) -> None:
    body, said = FAULTS[fault]
    site = tmp_path / "site"
    (site / "faulty-0.1.dist-info").mkdir(parents=True)
    (site / "faulty.py").write_text(TOY.replace("class Inline(Launcher):", "class Inline(Launcher):\n    " + body + "\n")
                                    .replace("    def slots(self, cells, device, *, workers, threads, per_gpu):\n"
                                             "        return [Slot(i) for i in range(min(2, cells))]\n", ""))
    (site / "faulty-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: faulty\nVersion: 0.1\n")
    (site / "faulty-0.1.dist-info" / "entry_points.txt").write_text("[flctl.launchers]\ninline = faulty:Inline\n")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    results = tmp_path / "r"
    res = in_process("sweep", "two-moons", "-m", "fl", "--seeds", "2", "--epochs", "2", "--executor", "inline",
                     "--results-dir", str(results), env={"FLCTL_DB": f"sqlite:///{results / 'flctl.db'}"})
    sys.modules.pop("faulty", None)
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stdout + res.stderr
    assert len(errors) == 1 and "the installed launcher 'inline' (faulty.Inline): " in errors[0], res.stderr
    assert said in errors[0], errors[0]
    assert not results.exists()


def test_no_launcher_name_is_compared_outside_the_backends() -> None:
    """What differs between launchers is the launcher's to say (its class facts and methods): a comparison with a
    launcher's name elsewhere is a branch a new launcher would have to find and edit."""
    launcher = "|".join(re.escape(n) for n in ("debug", "local", "slurm"))
    compared = re.compile(rf"""(==|!=)\s*["']({launcher})["']|["']({launcher})["']\s*(==|!=)|"""
                          rf"""\bin\s*[(\[{{][^)\]}}]*["']({launcher})["']""")
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for path in sorted((ROOT / "flctl").rglob("*.py")) if "backends" not in path.parts
             for n, line in enumerate(path.read_text().splitlines(), 1) if compared.search(line)]
    assert not found, "\n".join(found)


def test_each_launcher_says_what_differs() -> None:
    facts = {n: (c.runs_here, c.in_process, c.joins, c.queued, c.stop_signals)
             for n, c in ((n, get_launcher(n)) for n in ("debug", "local", "slurm"))}
    assert facts == {"debug": (True, True, False, False, ("SIGHUP", "SIGINT", "SIGTERM")),
                     "local": (True, False, True, False, ("SIGHUP", "SIGINT", "SIGTERM")),
                     "slurm": (False, False, False, True, ("SIGINT",))}
    slurm = get_launcher("slurm")
    assert slurm.job_id.fullmatch("123_[0-7%2]") and not slurm.job_id.fullmatch("123; rm -rf")
    assert slurm().job_group("123_4") == "123" and issubclass(slurm, Launcher)
    assert "partition=gpu" in slurm(slurm.Options(partition="gpu")).describe().replace("slurm_partition", "partition")


@pytest.mark.parametrize("launcher,slot,expected", [
    ("local", Slot(0, 1, cuda="1"), "cuda"),       # the worker sees GPU 1 alone: it is its cuda:0
    ("local", Slot(0, 1, cuda="0,1"), "cuda:1"),   # more than one visible: the index stands
    ("debug", Slot(0), "cuda:1"),                  # in the launching process, which sees every GPU
    ("slurm", Slot(0), "cuda:1"),                  # Slurm's own CUDA_VISIBLE_DEVICES: the index within the job's
])
def test_a_worker_trains_cuda_n_on_the_device_its_slot_gives_it(tmp_path: Path, monkeypatch, launcher: str,
                                                                slot: Slot, expected: str) -> None:
    """--device cuda:N: the local launcher gives the worker GPU N alone (CUDA_VISIBLE_DEVICES=N), where cuda:N
    does not exist. The worker trains the cell on the device it sees; the run is the same (device is not identity)."""
    import flctl.launch.worker as worker_module
    from flctl.db import Store
    from flctl.launch.backends.local import local_slots
    from flctl.launch.recipe import WorkerRecipe
    from flctl.launch.worker import Worker

    assert local_slots(3, device="cuda:1", cores=4, gpus=["0", "1"]) == [Slot(0, 4, "1")]
    cfg = dataclasses.replace(config("two-moons", "fl", epochs=1), device="cuda:1")
    url = f"sqlite:///{tmp_path / 'flctl.db'}"
    store = Store.open(url)
    store.create_sweep("s", None, "two-moons", {}, [cfg])
    store.close()
    trained: list[str] = []

    def train_claimed(cfgs, tokens, store, layout, **kwargs):   # the cell stays claimed: its one attempt is used
        trained.extend(c.device for c in cfgs)
        assert [c.run_id for c in cfgs] == [cfg.run_id]
        return Ending(named("finished"))

    monkeypatch.setattr(worker_module, "train_claimed", train_claimed)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    recipe = WorkerRecipe(url, str(tmp_path), "s", launcher, max_attempts=1, sync_study=False)
    Worker(recipe)(dataclasses.replace(slot, threads=None))
    assert trained[:1] == [expected]


def test_the_launchers_doc_section_shows_a_launcher_that_loads() -> None:
    """docs/extending.md's launcher: its code is a Launcher subclass that imports as written."""
    doc = (ROOT / "docs" / "extending.md").read_text()
    section = doc.split("## A launcher", 1)[1].split("\n## ", 1)[0]
    code = textwrap.dedent(re.findall(r"```python\n(.*?)```", section, re.S)[0])
    namespace: dict = {}
    exec(compile(code, "extending.md", "exec"), namespace)
    classes = [v for v in namespace.values() if isinstance(v, type) and issubclass(v, Launcher) and v is not Launcher]
    assert classes and all(getattr(c, "name", None) for c in classes)


@pytest.mark.parametrize("batch_runs", [None, 3])
def test_the_dry_runs_cost_counts_the_cells_together_the_launch_gives_its_workers(tmp_path: Path, monkeypatch,
                                                                                batch_runs) -> None:
    """The cost estimate divides by the cells that train at once on a device: the launch's own choice (automatic on a
    GPU for a batched task: a worker's share in groups of about equal size, at most 8), not --batch-runs alone (1
    when not given)."""
    import flctl.launch.backends.local as local
    import flctl.launch.plan as plan_module
    from flctl.db import Store
    from flctl.launch.plan import launch_sweep
    from flctl.launch.settings import LaunchFlags, LaunchSettings
    from flctl.sweep import plan, spec_from_values

    monkeypatch.setattr(local, "cuda_devices", lambda: ["0", "1"])         # two GPUs, faked: nothing trains
    recipes: list = []
    monkeypatch.setattr(plan_module, "submit", lambda worker, slots: recipes.append((worker.recipe, slots)) or [])
    spec = dataclasses.replace(spec_from_values("two-moons", {"method": "fl", "lr": "1e-4..1e-2:20"}, seeds=2,
                                                device="cpu"), device="cuda")
    configs = [dataclasses.replace(c, device="cuda") for c in plan(dataclasses.replace(spec, device="cpu"))]
    settings = LaunchSettings.resolve({}, LaunchFlags(batch_runs=batch_runs, per_gpu=2))
    estimated = settings.cells_per_device("two-moons", len(configs), "cuda")
    store = Store.open(f"sqlite:///{tmp_path / 'flctl.db'}")
    launch_sweep(store, f"sqlite:///{tmp_path / 'flctl.db'}", tmp_path, "s", spec, configs, settings)
    store.close()
    [(recipe, slots)] = recipes
    assert len(configs) == 40 and len(slots) == 4                          # 2 GPUs x 2 workers each
    assert recipe.batch_runs == (batch_runs or 5)                          # 10 cells a worker: 2 groups of 5
    assert estimated == recipe.batch_runs * 2                               # x --per-gpu workers on one GPU


def test_a_spec_moved_to_another_launcher_leaves_its_launchers_options_behind() -> None:
    """sweeps/cifar10-main.toml says executor = "slurm", gpus = 1: `--executor local` runs it here without them;
    the same options given on the command line, or in a spec of that launcher, are refused."""
    from flctl.launch.settings import LaunchFlags, LaunchSettings

    spec = {"executor": "slurm", "gpus": 1, "cpus": 8, "time_min": 600, "workers": 2}
    moved = LaunchSettings.resolve(spec, LaunchFlags(executor="local"))
    assert (moved.executor, moved.workers) == ("local", 2) and moved.launcher.name == "local"
    assert LaunchSettings.resolve(spec).options.gpus == 1
    with pytest.raises(ConfigError, match=r"^--gpus is not an option of --executor local$"):
        LaunchSettings.resolve({"gpus": 1})
    with pytest.raises(ConfigError, match=r"^--partition is not an option of --executor local$"):
        LaunchSettings.resolve(spec, LaunchFlags(executor="local", partition="gpu"))


def test_an_installed_launchers_options_stay_behind_too(installed_toy: Path) -> None:
    from flctl.launch.settings import LaunchFlags, LaunchSettings

    spec = {"executor": "inline", "label": "hi", "workers": 2}
    assert LaunchSettings.resolve(spec).options.label == "hi"
    for other in ("local", "slurm"):
        moved = LaunchSettings.resolve(spec, LaunchFlags(executor=other))
        assert (moved.executor, moved.workers) == (other, 2)
    with pytest.raises(ConfigError, match="unknown"):      # a typo is not an option of any launcher: still refused
        LaunchSettings.resolve({**spec, "lable": "x"}, LaunchFlags(executor="local"))
    # a spec of a launcher not installed here: all but the general keys stay behind
    assert LaunchSettings.resolve({"executor": "ray", "num_cpus": 4, "workers": 3},
                                  LaunchFlags(executor="local")).workers == 3


def test_cells_on_cuda_n_still_train_together_on_the_workers_one_gpu(tmp_path: Path, monkeypatch) -> None:
    """The remap (cuda:N -> the worker's cuda) applies to every cell a worker claims, so cells that may train
    together still do (their device is part of what may)."""
    import flctl.launch.worker as worker_module
    from flctl.db import Store
    from flctl.launch.recipe import WorkerRecipe
    from flctl.launch.worker import Worker

    cfgs = [dataclasses.replace(config("two-moons", "fl", epochs=1, seed=s), device="cuda:1") for s in range(3)]
    url = f"sqlite:///{tmp_path / 'flctl.db'}"
    store = Store.open(url)
    store.create_sweep("s", None, "two-moons", {}, cfgs)
    store.close()
    groups: list[list[str]] = []
    monkeypatch.setattr(worker_module, "train_claimed",
                        lambda claimed, *a, **k: groups.append([c.device for c in claimed]) or Ending(named("finished")))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    Worker(WorkerRecipe(url, str(tmp_path), "s", "local", max_attempts=1, batch_runs=3, sync_study=False))(
        Slot(0, None, cuda="1"))
    assert groups == [["cuda", "cuda", "cuda"]]


def test_workers_sharing_a_gpu_are_told_whether_mps_runs(tmp_path: Path, monkeypatch) -> None:
    """--per-gpu K > 1 on CUDA: the launch says whether the K processes share each GPU through NVIDIA MPS (a daemon's
    control pipe in CUDA_MPS_PIPE_DIRECTORY) or take turns on it. flctl starts no daemon."""
    import os

    from flctl.cli.common import gpu_sharing_line
    from flctl.launch.backends.local import mps_daemon
    from flctl.launch.settings import LaunchFlags, LaunchSettings

    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    assert mps_daemon() is None
    two = LaunchSettings.resolve({}, LaunchFlags(per_gpu=2))
    assert "taking turns on it: no NVIDIA MPS daemon runs here" in (gpu_sharing_line("cuda", two) or "")
    (tmp_path / "control").write_text("")                  # a file is not the daemon's pipe
    assert mps_daemon() is None
    (tmp_path / "control").unlink()
    os.mkfifo(tmp_path / "control")
    assert mps_daemon() == str(tmp_path)
    assert gpu_sharing_line("cuda", two) == f"2 workers share each GPU through NVIDIA MPS (its daemon listens in {tmp_path})"
    one = LaunchSettings.resolve({}, LaunchFlags())
    assert gpu_sharing_line("cuda", one) is None and gpu_sharing_line("cpu", two) is None
    on_slurm = LaunchSettings.resolve({}, LaunchFlags(per_gpu=2, executor="slurm"))
    assert gpu_sharing_line("cuda", on_slurm) is None      # its jobs run elsewhere: this machine's daemon says nothing


def test_cancel_where_the_sweeps_launcher_is_not_installed_says_so_and_stops_nothing(installed_toy: Path,
                                                                                       tmp_path: Path) -> None:
    """A sweep launched through an installed launcher, cancelled from an environment without it: its workers can
    be neither seen nor stopped from here, which `flctl cancel` says (exit 2) instead of "stopped 0 worker(s)"."""
    import os
    import socket

    from flctl.layout import Layout

    results = tmp_path / "r"
    env = {"FLCTL_DB": f"sqlite:///{results / 'flctl.db'}"}
    res = in_process("sweep", "two-moons", "-m", "fl", "--seeds", "2", "--epochs", "2", "--executor", "inline",
                     "--wait", "--results-dir", str(results), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    sid = re.search(r"sweep ([0-9a-f]{12})", res.stdout)[1]
    worker = Layout(results).worker_file(sid, socket.gethostname(), os.getpid())   # one still at work, as it wrote
    worker.parent.mkdir(parents=True, exist_ok=True)
    worker.write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "job_id": None,
                                  "executor": "inline"}))
    (installed_toy / "toy_launcher-0.1.dist-info" / "entry_points.txt").write_text("[flctl.launchers]\n")
    importlib.invalidate_caches()
    res = in_process("cancel", sid, "--results-dir", str(results), env=env)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "through the launcher inline, which is not installed here" in res.stderr, res.stderr
    assert worker.exists()
