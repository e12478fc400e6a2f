"""A researcher's own task and method, without an edit to flctl: an installed package's entry points, a task file
named by FLCTL_TASKS or a spec, the Python API, `flctl new-task`, and the provenance each run records.

The plugin package is real: a pyproject.toml with entry points, built and installed by pip into a folder that
the commands find on PYTHONPATH (its .dist-info is what importlib.metadata reads)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flctl import api, plugins
from flctl.db import Store
from flctl.errors import ConfigError
from tests import warm

# Slow (pyproject.toml's markers; `pytest -m "not slow"` is the fast loop): a package pip-installed once, and plugin
# tasks trained through workers: 55 s of the suite's 904 s of test time (2 cores, xdist -n 2).
pytestmark = pytest.mark.slow

FLCTL = [sys.executable, "-m", "flctl"]

# A three-blob classification task: tiny, so that each run takes a second.
TASK_SOURCE = textwrap.dedent('''
    from flctl.tasks import Task

    def load(options, data_dir):
        import torch
        from sklearn.datasets import make_blobs
        from flctl.data import Dataset, Split
        x, y = make_blobs(n_samples=120, centers=3, random_state=options["data_seed"])
        x, y = torch.tensor(x, dtype=torch.float32), torch.tensor(y)
        return Dataset(Split(x[:90], y[:90]), Split(x[90:], y[90:]))

    def build_model(options, data):
        from flctl.models import mlp
        return mlp([2, 8, 3])

    TASK = Task(name="NAME", kind="classification", description="three blobs",
                defaults=dict(epochs=2, batch_size=30, optimizer="adamw", lr=1e-2, eps=0.1, alpha=1.0, dual_lr=0.5),
                options=dict(data_seed=0), load=load, build_model=build_model)
''')

# FL with half the dual step: a new update rule as a package (its description light, its torch class apart).
METHOD_INFO_SOURCE = textwrap.dedent('''
    from flctl.method_info import MethodInfo

    INFO = MethodInfo("fl-half", "FL/2", 6, frozenset({"eps", "dual_lr"}), "λ ← [λ + (η/2)(g−ε)]₊ ; min Σ λ·g",
                      impl="fl_blobs.rule:FLHalf")
''')
METHOD_SOURCE = textwrap.dedent('''
    from flctl.methods import FL

    class FLHalf(FL):
        name = "fl-half"

        def _ascent(self, lam, violation):
            return lam.add_(violation, alpha=self.dual_lr / 2)
''')
PYPROJECT = textwrap.dedent('''
    [build-system]
    requires = ["setuptools>=68"]
    build-backend = "setuptools.build_meta"

    [project]
    name = "fl-blobs"
    version = "0.3.1"

    [project.entry-points."flctl.tasks"]
    blobs = "fl_blobs.task:TASK"

    [project.entry-points."flctl.methods"]
    fl-half = "fl_blobs.method:INFO"
''')


def task_source(name: str) -> str:
    return TASK_SOURCE.replace("NAME", name)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fl-blobs package, installed by pip (no network, no build isolation) into a folder of its own."""
    src = tmp_path_factory.mktemp("fl-blobs")
    (src / "pyproject.toml").write_text(PYPROJECT)
    pkg = src / "src" / "fl_blobs"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "task.py").write_text(task_source("blobs"))
    (pkg / "method.py").write_text(METHOD_INFO_SOURCE)
    (pkg / "rule.py").write_text(METHOD_SOURCE)
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "--target", str(target), str(src)], check=True, capture_output=True, timeout=300)
    return target


def flctl(*args: str, env: dict[str, str] | None = None, code: int = 0, cwd: Path | None = None):
    """`flctl *args` as a process forked warm (tests/warm.py): it finds installed plugins as a new interpreter does,
    through PYTHONPATH, sys.path and the entry points of the distributions there; the sweep workers it starts are
    new interpreters."""
    out = warm.run([*FLCTL, *args], capture_output=True, text=True, timeout=300, cwd=cwd,
                   env={**os.environ, "COLUMNS": "250", **(env or {})})
    assert out.returncode == code, out.stdout + out.stderr
    return out


def test_an_installed_package_lists_runs_sweeps_and_reports(site: Path, results: Path) -> None:
    env = {"PYTHONPATH": str(site), "FLCTL_RESULTS": str(results)}
    listed = {t["name"]: t for t in json.loads(flctl("tasks", "--json", env=env).stdout)}
    assert listed["blobs"]["source"]["distribution"] == "fl-blobs" and listed["blobs"]["source"]["version"] == "0.3.1"
    assert listed["digits"]["source"]["origin"] == "built-in"
    methods = {m["name"]: m for m in json.loads(flctl("methods", "--json", env=env).stdout)}
    assert methods["fl-half"]["from"] == "package fl-blobs 0.3.1 (fl_blobs.method:INFO)"
    assert methods["fl-half"]["uses_eps"] and not methods["fl-half"]["uses_alpha"]

    flctl("run", "blobs", "-m", "fl-half", "--seed", "7", env=env)
    [run] = json.loads(flctl("runs", "--json", env=env).stdout)
    shown = json.loads(flctl("show", run["id"], "--json", env=env).stdout)
    task, method = shown["provenance"]["task"], shown["provenance"]["method"]
    assert (task["origin"], task["module"], task["distribution"], task["version"]) == \
        ("entry point", "fl_blobs.task", "fl-blobs", "0.3.1")
    assert Path(task["file"]) == site / "fl_blobs" / "task.py" and len(task["sha256"]) == 64
    assert (method["origin"], method["module"]) == ("entry point", "fl_blobs.method")
    # the method's hash covers its update rule too (rule.py, beside the MethodInfo): a changed rule is other code
    package = site / "fl_blobs"
    assert method["also"] == [str(package / "rule.py")] and method["sha256"] == hashlib.sha256(
        (package / "method.py").read_bytes() + (package / "rule.py").read_bytes()).hexdigest()

    # Local workers are other processes: they find the package the same way.
    out = flctl("sweep", "blobs", "-m", "erm,fl-half", "--seeds", "2", "--executor", "local", "--workers", "2",
                "--wait", env=env)
    assert "4 cells, 4 new" in out.stdout, out.stdout
    runs = json.loads(flctl("runs", "--json", env=env).stdout)
    assert sorted(r["status"] for r in runs) == ["completed"] * 5
    table = flctl("report", "--table", "main", env=env).stdout
    assert "FL/2" in table and "ERM" in table and "‡" not in table


def test_task_files_through_flctl_tasks_a_clash_and_a_broken_plugin(tmp_path: Path, site: Path) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "three_blobs.py").write_text(task_source("three-blobs"))
    (folder / "broken.py").write_text("raise RuntimeError('the cluster path is not mounted')\n")
    env = {plugins.ENV: str(folder)}
    out = flctl("tasks", "--json", env=env)
    names = [t["name"] for t in json.loads(out.stdout)]
    assert "three-blobs" in names and "digits" in names          # the others still list
    warned = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(warned) == 1 and "broken.py failed to import: RuntimeError: the cluster path is not mounted" in \
        warned[0], out.stderr
    flctl("run", "three-blobs", "-m", "rfl", "--alpha", "0.5", "--results-dir", str(tmp_path / "r"), env=env)

    # A name defined twice: one error naming both sources, whichever command meets it, and nothing written.
    (folder / "digits_again.py").write_text(task_source("digits"))
    out = flctl("run", "digits", "--results-dir", str(tmp_path / "clash"), env=env, code=2)
    assert out.stderr.count("\n") == 1 and "task 'digits' is defined twice: built into flctl and by" in out.stderr
    assert f"file {folder / 'digits_again.py'}" in out.stderr and not (tmp_path / "clash").exists()
    (folder / "digits_again.py").write_text(task_source("blobs"))        # now the same name as the package's
    # the list still shows every task, the name defined twice flagged; a command that uses it refuses it
    out = flctl("tasks", "--json", env={**env, "PYTHONPATH": str(site)})
    listed = {t["name"]: t for t in json.loads(out.stdout)}
    assert listed["blobs"]["clash"].startswith(
        "task 'blobs' is defined twice: by package fl-blobs 0.3.1 (fl_blobs.task:TASK) and by"), listed["blobs"]
    assert listed["three-blobs"]["clash"] is None and listed["digits"]["clash"] is None
    out = flctl("run", "blobs", "--results-dir", str(tmp_path / "clash"), env={**env, "PYTHONPATH": str(site)},
                code=2)
    assert out.stderr.count("\n") == 1 and "task 'blobs' is defined twice: by package fl-blobs" in out.stderr


def test_the_source_hash_follows_the_file_and_a_table_over_both_says_so(tmp_path: Path, results: Path) -> None:
    file = tmp_path / "blobs_task.py"
    file.write_text(task_source("blobs"))

    def run(*args: str) -> subprocess.CompletedProcess:      # a task file named by FLCTL_TASKS, not an installed one
        return flctl(*args, env={plugins.ENV: str(file)})

    run("run", "blobs", "-m", "fl", "--seed", "0")
    assert "‡" not in run("report", "--table", "main").stdout
    file.write_text(task_source("blobs").replace("n_samples=120", "n_samples=120 ") + "# edited\n")
    run("run", "blobs", "-m", "fl", "--seed", "1")
    runs = json.loads(run("runs", "--json").stdout)
    hashes = {r["seed"]: r["provenance"]["task"]["sha256"] for r in runs}
    assert len(set(hashes.values())) == 2
    table = run("report", "--table", "main").stdout
    assert "‡ FL · 0.10 · —: its runs came from 2 versions of the task's code" in " ".join(table.split()), table


def test_a_worker_that_cannot_load_the_task_fails_its_cell_in_one_line(tmp_path: Path, clean_plugins) -> None:
    module = tmp_path / "gone_blobs.py"
    module.write_text(task_source("gone-blobs"))
    api.use_tasks(module)
    cfgs = [api.config("gone-blobs", "fl", seed=s) for s in range(3)]
    url = f"sqlite:///{tmp_path / 'flctl.db'}"
    store = Store.open(url)
    store.create_sweep("gone", "gone", "gone-blobs", {}, cfgs)
    store.close()
    # The worker of another node, where the task's module is not installed.
    code = ("from flctl.launch.backends import Slot; from flctl.launch.worker import Worker, WorkerRecipe; "
            f"print(Worker(WorkerRecipe({url!r}, {str(tmp_path)!r}, 'gone', plugins=('fl_gone_blobs',), "
            "sync_study=False))(Slot(0, 1)))")
    out = warm.run([sys.executable, "-c", code], capture_output=True, timeout=120,       # its own process
                   env={k: v for k, v in os.environ.items() if k != plugins.ENV})
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr and "no module named 'fl_gone_blobs'" in out.stderr, out.stderr
    store = Store.open(url)
    runs = store.list_runs()
    store.close()
    # One cell failed with one line; the worker stopped there instead of failing every cell in turn.
    assert sorted(r.status for r in runs) == ["failed", "queued", "queued"]
    [error] = [r.error for r in runs if r.status == "failed"]
    assert "\n" not in error and "cannot be loaded by the worker" in error and "fl_gone_blobs" in error, error


def test_the_python_api_runs_lists_and_reads_records(tmp_path: Path, clean_plugins) -> None:
    root = tmp_path / "res"
    with pytest.raises(ConfigError, match="eps"):
        api.run("two-moons", "fl", eps=-1.0, results_dir=root)
    assert not root.exists()                                    # bad input: nothing written
    run = api.run("two-moons", "fl", epochs=2, eval_every=1, results_dir=root)
    assert run.status == "completed" and run.provenance["task"]["module"] == "flctl_tasks.two_moons"
    again = api.run("two-moons", "fl", epochs=2, eval_every=1, results_dir=root)
    assert again.id == run.id and again.finished_at == run.finished_at   # the same run, not trained twice
    assert [r.id for r in api.runs(results_dir=root, status="completed")] == [run.id]
    frame = api.records([run], results_dir=root, split="train").to_pandas()
    assert sorted(frame["epoch"].unique()) == [1, 2] and len(frame) == 2 * 1000
    assert (frame["multiplier"] >= 0).all()
    with pytest.raises(ConfigError, match="no records of run"):            # a typo: not an empty table
        api.records(["deadbeef"], results_dir=root)
    with pytest.raises(ConfigError, match="no such file or folder"):       # not an 'unknown task' later
        api.use_tasks(tmp_path / "missing_task.py")


def test_new_task_writes_a_task_and_a_test_that_pass_at_once(tmp_path: Path) -> None:
    out = flctl("new-task", "my-task", "--dir", str(tmp_path))
    assert "FLCTL_TASKS=" in out.stdout
    assert {p.name for p in tmp_path.iterdir()} == {"my_task.py", "test_my_task.py"}
    tested = warm.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_my_task.py"],
                      cwd=tmp_path, capture_output=True, timeout=300)
    assert tested.returncode == 0 and "5 passed" in tested.stdout, tested.stdout + tested.stderr
    before = sorted(p.name for p in tmp_path.iterdir())
    for args, says in ((["my-task"], "exists; nothing was written"), (["My_Task"], "lower-case"),
                       (["digits"], "exists already")):
        bad = flctl("new-task", *args, "--dir", str(tmp_path), code=2)
        assert says in bad.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_flctls_own_packages_are_named_once_and_belong_to_flctl() -> None:
    # plugins.OWN_PACKAGES skips the scan of every installed distribution for flctl's own modules: it must say what
    # the scan would, and name every top-level package pyproject installs.
    import importlib.metadata
    import tomllib

    packages = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert sorted({p.split(".")[0] for p in packages}) == sorted(plugins.OWN_PACKAGES)
    scanned = importlib.metadata.packages_distributions()
    assert all(scanned[top] and set(scanned[top]) == {"flctl"} for top in plugins.OWN_PACKAGES)


def test_a_plugin_task_in_a_new_shell_is_named_by_where_its_runs_came_from(tmp_path: Path, results: Path) -> None:
    """A task file trained through FLCTL_TASKS, then asked for in a shell without it: the one `unknown task` line
    names the file its runs in this database came from, and the variable that names it again (before: only
    'unknown task')."""
    file = tmp_path / "blobs_task.py"
    file.write_text(task_source("blobs"))
    flctl("run", "blobs", "-m", "fl", "--epochs", "2", env={plugins.ENV: str(file)})
    for command in (["run", "blobs", "-m", "fl", "--epochs", "3"], ["sweep", "blobs", "--seeds", "2", "--dry-run"]):
        out = flctl(*command, code=2, env={plugins.ENV: ""})
        [line] = out.stderr.strip().splitlines()
        assert line.startswith("error: unknown task 'blobs'") and line.endswith(
            f"; its runs here came from the file {file}: name it with FLCTL_TASKS={file}"), line
