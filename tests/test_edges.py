"""The new commands' edges, met the way a new user meets them (issue 45, part 5): `flctl new-task` into a file, a
read-only folder or with a 300-character name; wrong calls of flctl.api; a plugin that prints while it is imported; a
missing FLCTL_TASKS entry; a task name defined twice; two `--tune` searches of one study at once."""

from __future__ import annotations

import errno
import json
import os
import pathlib
import threading
import time
from pathlib import Path

import optuna
import pytest

from flctl import api, plugins, tasks
from flctl.errors import ConfigError
from flctl.sweep import resolve_cell, spec_from_values
from flctl.tpe_search import tune
from tests.helpers import files_under, in_process
from tests.test_plugins import task_source


def one_error(out, code: int = 2) -> str:
    """The one `error:` line of a refused command (no traceback)."""
    lines = out.stderr.strip().splitlines()
    assert out.returncode == code and len(lines) == 1 and lines[0].startswith("error: "), (out.returncode, out.stderr)
    return lines[0]


# ---- flctl new-task ----

def test_new_task_into_a_file_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    blocker = tmp_path / "notes.txt"
    blocker.write_text("mine\n")
    for folder in (blocker, blocker / "sub"):
        line = one_error(in_process("new-task", "my-task", "--dir", str(folder)))
        assert "is a file" in line and "--dir" in line, line
    assert blocker.read_text() == "mine\n" and [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_new_task_into_a_read_only_folder_is_one_line_and_writes_nothing(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    for mode in (0o555, 0o444):          # no write; no write and no search (a stat of a file in it fails too)
        folder = tmp_path / f"ro-{mode:o}"
        folder.mkdir()
        folder.chmod(mode)
        with monkeypatch.context() as m:
            if os.geteuid() == 0:        # root writes anywhere: the folder refuses it as it refuses any other user
                _deny_root(m, folder, stat=mode == 0o444)
            line = one_error(in_process("new-task", "my-task", "--dir", str(folder)))
        folder.chmod(0o755)
        assert "Permission denied" in line and "nothing was written" in line, line
        assert list(folder.iterdir()) == []


def _deny_root(m: pytest.MonkeyPatch, folder: Path, *, stat: bool) -> None:
    """What the kernel answers a user other than root in ``folder`` (read-only; with ``stat``, not searchable)."""
    real = {name: getattr(pathlib.Path, name) for name in ("open", "stat", "write_text")}

    def guarded(name: str):
        def call(self, *args, **kwargs):
            if self.parent == folder and (name != "stat" or stat):
                raise PermissionError(errno.EACCES, "Permission denied", str(self))
            return real[name](self, *args, **kwargs)
        return call

    for name in real:
        m.setattr(pathlib.Path, name, guarded(name))


def test_new_task_with_a_300_character_name_is_one_line(tmp_path: Path) -> None:
    line = one_error(in_process("new-task", "a" * 300, "--dir", str(tmp_path)))
    assert "300 characters" in line and "at most 64" in line, line
    assert list(tmp_path.iterdir()) == []
    # a folder whose name the file system cannot hold: its own one line
    line = one_error(in_process("new-task", "my-task", "--dir", str(tmp_path / ("d" * 300))))
    assert "is 300 bytes long; a file system takes at most 255" in line, line
    assert list(tmp_path.iterdir()) == []


# ---- flctl.api: a wrong call is one ConfigError line that names the fix, and writes nothing ----

@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    """A results folder with one finished two-moons run (two evaluated epochs)."""
    root = tmp_path_factory.mktemp("api") / "results"
    return root, api.run("two-moons", "fl", epochs=2, eval_every=1, results_dir=root)


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in files_under(root) if "-wal" not in p.name and "-shm" not in p.name}


FRESH = "fresh-results"        # a folder no call may make
API_CASES = [
    # (name, call(root, run, tmp), what the one line says)
    ("unknown task", lambda r, run, t: api.run("mnist", results_dir=t / FRESH), "unknown task 'mnist'"),
    ("unknown method", lambda r, run, t: api.run("two-moons", "sgd", results_dir=t / FRESH), "unknown method 'sgd'"),
    ("methods as a list", lambda r, run, t: api.run("two-moons", ["erm", "fl"], results_dir=t / FRESH),
     "several methods are a sweep"),
    ("task not a name", lambda r, run, t: api.config(42), "give one task's name"),
    ("a typo of a field", lambda r, run, t: api.run("two-moons", "fl", epoch=3, results_dir=t / FRESH),
     "did you mean 'epochs'"),
    ("a task option as a field", lambda r, run, t: api.run("polyfit", "fl", degree=20, results_dir=t / FRESH),
     "pass options={'degree': ...}"),
    ("options as text", lambda r, run, t: api.run("polyfit", "fl", options="degree=20", results_dir=t / FRESH),
     "as a dict"),
    ("an unknown option", lambda r, run, t: api.run("polyfit", "fl", options={"degre": 20}, results_dir=t / FRESH),
     "unknown option(s) degre"),
    ("a field of the wrong type", lambda r, run, t: api.run("two-moons", "fl", epochs="5", results_dir=t / FRESH),
     "epochs"),
    ("a value out of range", lambda r, run, t: api.run("two-moons", "fl", eps=-1.0, results_dir=t / FRESH), "eps"),
    ("p_min as text", lambda r, run, t: api.run("digits", "fl", p_min="0.6", results_dir=t / FRESH),
     "p_min='0.6': give a number"),
    ("on_epoch not a function", lambda r, run, t: api.run("two-moons", "fl", on_epoch="print", results_dir=t / FRESH),
     "on_epoch='print'"),
    ("results_dir a file", lambda r, run, t: api.run("two-moons", "fl", results_dir=t / "notes.txt"), "is a file"),
    ("results_dir not a path", lambda r, run, t: api.run("two-moons", "fl", results_dir=5), "results_dir=5"),
    ("db not a URL", lambda r, run, t: api.runs(results_dir=r, db="results.db"), "not a database URL"),
    ("runs of no folder", lambda r, run, t: api.runs(results_dir=t / FRESH), "no runs in"),
    ("runs of a file", lambda r, run, t: api.runs(results_dir=t / "notes.txt"), "is a file"),
    ("an unknown status", lambda r, run, t: api.runs(results_dir=r, status="complete"), "choose one of"),
    ("an unknown task's runs", lambda r, run, t: api.runs(results_dir=r, task="two-moon"), "no such task"),
    ("an unknown method's runs", lambda r, run, t: api.runs(results_dir=r, method="fll"), "no such method"),
    ("records of one id", lambda r, run, t: api.records(run.id, results_dir=r), "records([run])"),
    ("records of one run", lambda r, run, t: api.records(run, results_dir=r), "records([run])"),
    ("records of none", lambda r, run, t: api.records([], results_dir=r), "no runs given"),
    ("records of no such run", lambda r, run, t: api.records(["deadbeef"], results_dir=r), "no records of run(s)"),
    ("records of another split", lambda r, run, t: api.records([run], split="validation", results_dir=r),
     "choose 'train' or 'test'"),
    ("records of an epoch not evaluated", lambda r, run, t: api.records([run], epoch=99, results_dir=r),
     "evaluated epochs: 1, 2"),
    ("use_tasks of nothing", lambda r, run, t: api.use_tasks(), "use_tasks('my_task.py')"),
    ("use_tasks of a list", lambda r, run, t: api.use_tasks([str(t / "a.py"), str(t / "b.py")]),
     "use_tasks('a.py', 'b.py')"),
    ("use_tasks of a missing file", lambda r, run, t: api.use_tasks(t / "missing_task.py"), "no such file or folder"),
    ("use_tasks of a text file", lambda r, run, t: api.use_tasks(t / "notes.txt"), "not a Python file"),
    ("use_tasks of no module", lambda r, run, t: api.use_tasks("no_such_tasks_module"),
     "no module named 'no_such_tasks_module'"),
    ("use_tasks of a broken file", lambda r, run, t: api.use_tasks(t / "broken.py"), "failed to import"),
    ("use_tasks of a file without TASK", lambda r, run, t: api.use_tasks(t / "empty.py"), "defines no TASK"),
]


@pytest.mark.parametrize("call,says", [c[1:] for c in API_CASES], ids=[c[0] for c in API_CASES])
def test_a_wrong_api_call_is_one_config_error_and_writes_nothing(trained, tmp_path: Path, clean_plugins,
                                                                 call, says: str) -> None:
    root, run = trained
    (tmp_path / "notes.txt").write_text("not a task\n")
    (tmp_path / "broken.py").write_text("raise RuntimeError('the cluster path is not mounted')\n")
    (tmp_path / "empty.py").write_text("x = 1\n")
    def here() -> list[str]:           # (Python's bytecode cache of an imported file is not flctl's writing)
        return sorted(p.name for p in tmp_path.iterdir() if p.name != "__pycache__")

    before, names = snapshot(root), here()
    with pytest.raises(ConfigError) as caught:
        call(root, run, tmp_path)
    message = str(caught.value)
    assert "\n" not in message and says in message, message
    assert snapshot(root) == before and here() == names
    assert plugins.paths() == []          # a refused use_tasks adds nothing


# ---- plugins: their prints, a missing FLCTL_TASKS entry, a name defined twice ----

def test_a_plugin_that_prints_on_import_leaves_stdout_to_the_command(tmp_path: Path, clean_plugins) -> None:
    (tmp_path / "loud_blobs.py").write_text("print('loading loud-blobs...')\n" + task_source("loud-blobs"))
    out = in_process("tasks", "--json", env={plugins.ENV: str(tmp_path / "loud_blobs.py")})
    assert out.returncode == 0, out.stderr
    listed = {t["name"]: t for t in json.loads(out.stdout)}          # stdout is the JSON alone
    assert "loud-blobs" in listed and "two-moons" in listed
    assert "loading loud-blobs..." in out.stderr


def test_a_missing_flctl_tasks_entry_is_one_warning_and_the_command_goes_on(tmp_path: Path, clean_plugins) -> None:
    missing = str(tmp_path / "my_task.py")
    env = {plugins.ENV: missing}
    out = in_process("sweep", "two-moons", "-m", "fl", "--seeds", "2", "--dry-run", env=env)
    assert out.returncode == 0 and "nothing was written" in out.stdout, out.stdout + out.stderr
    warned = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(warned) == 1 and warned[0].startswith("flctl: warning: FLCTL_TASKS entry") and missing in warned[0], \
        out.stderr
    out = in_process("tasks", "--json", env=env)       # said once, not again by the listing of problems
    assert out.returncode == 0 and "two-moons" in {t["name"] for t in json.loads(out.stdout)}
    assert out.stderr.count(missing) <= 1, out.stderr


def test_a_name_defined_twice_is_flagged_in_the_list_and_refused_where_used(tmp_path: Path, clean_plugins) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "digits_again.py").write_text(task_source("digits"))           # a built-in's name
    (folder / "blobs_one.py").write_text(task_source("blobs"))               # two plugins, one name
    (folder / "blobs_two.py").write_text(task_source("blobs"))
    (folder / "three_blobs.py").write_text(task_source("three-blobs"))       # and one that is fine
    env = {plugins.ENV: str(folder), "COLUMNS": "400"}
    out = in_process("tasks", "--json", env=env)
    assert out.returncode == 0, out.stderr
    listed = {t["name"]: t for t in json.loads(out.stdout)}
    assert {"two-moons", "three-blobs", "digits", "blobs"} <= set(listed)
    assert listed["two-moons"]["clash"] is None and listed["three-blobs"]["clash"] is None
    assert listed["digits"]["clash"].startswith("task 'digits' is defined twice: built into flctl and by file")
    assert listed["blobs"]["clash"].startswith("task 'blobs' is defined twice: by file")
    assert len(listed["blobs"]["defined_by"]) == 2
    table = in_process("tasks", env=env)
    assert table.returncode == 0 and "three-blobs" in table.stdout and "two-moons" in table.stdout
    rows = {line.split("│")[1].strip(): line for line in table.stdout.splitlines() if line.count("│") > 2}
    assert "(clash)" in rows["digits (clash)"] and "defined twice" in rows["blobs (clash)"], table.stdout
    for name in ("digits", "blobs"):          # a command that uses the name refuses it in one line, writing nothing
        line = one_error(in_process("run", name, "--results-dir", str(tmp_path / "r"), env=env))
        assert f"task {name!r} is defined twice" in line, line
    assert not (tmp_path / "r").exists()
    with pytest.MonkeyPatch.context() as m:         # from Python: the other plugin tasks are usable
        m.setenv(plugins.ENV, str(folder))
        assert api.config("three-blobs").task == "three-blobs" and "digits" not in tasks.all_tasks()
        with pytest.raises(ConfigError, match="defined twice"):
            api.config("digits")


# ---- two --tune searches of one study at once ----

class FakeWorkers:
    """launch/fetch/revive for tune(), shared by the tuners of one test: a launched run 'trains' for ``seconds``
    and records its α as the objective (so that the TPE trials depend on what the other tuner found)."""

    def __init__(self, seconds: float = 0.05) -> None:
        self.seconds, self.lock, self.started = seconds, threading.Lock(), {}

    def launch(self, configs) -> None:
        with self.lock:
            for c in configs:
                self.started.setdefault(c.run_id, (time.monotonic(), c.alpha))

    def revive(self, configs) -> None:
        self.launch(configs)

    def fetch(self, ids) -> dict[str, dict]:
        with self.lock:
            out = {}
            for i in ids:
                if i not in self.started:
                    continue
                at, alpha = self.started[i]
                done = time.monotonic() - at >= self.seconds
                out[i] = {"status": "completed", "metrics": {"test.max_loss": alpha}} if done else {"status": "running"}
            return out


def _search(url: str, spec, n: int, workers: FakeWorkers, parallel: int = 1):
    """One tuner, with its own Store and Optuna storage (as another `flctl sweep --tune` process has)."""
    from flctl.db import Store

    store = Store.open(url)
    try:
        return tune(spec, "tx", n, "test.max_loss", "min", store=store, url=url,
                    resolve_cell=lambda p: resolve_cell(spec, p), launch=workers.launch, fetch=workers.fetch,
                    revive=workers.revive, parallel=parallel, poll_s=0.01)
    finally:
        store.close()


def _trials(url: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name="flctl-tx", storage=url).get_trials()


@pytest.mark.timeout(120)
def test_two_tuners_of_one_study_never_propose_the_same_trial(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'flctl.db'}"
    spec = spec_from_values("diabetes", {"method": "rfl", "alpha": "1e-3..10", "lr": "1e-4..1e-2", "epochs": "1"})
    workers, errors = FakeWorkers(), []

    def tuner(parallel: int) -> None:
        try:
            _search(url, spec, 14, workers, parallel)
        except BaseException as exc:      # noqa: BLE001 (re-raised below, in the test's thread)
            errors.append(exc)

    threads = [threading.Thread(target=tuner, args=(p,)) for p in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(100)
    assert not errors and not any(t.is_alive() for t in threads), errors
    trials = _trials(url)
    params = [(t.params["alpha"], t.params["lr"]) for t in trials]
    run_ids = [t.user_attrs["run_id"] for t in trials]
    assert len(set(params)) == len(params) and len(set(run_ids)) == len(run_ids), params
    # N trials in all (not N each), every one told, and both tuners asked some of them
    assert len(trials) == 14 and all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    assert len({t.user_attrs["tuner"]["token"] for t in trials}) == 2


def test_a_tuner_after_another_asks_new_trials_and_one_alone_asks_as_before(tmp_path: Path) -> None:
    """A `--tune` run again after an interrupted one (or `--tune 8` after `--tune 4`) once asked the first one's
    random start-up trials again: the same seeded stream. A tuner alone still asks what it always did."""
    spec = spec_from_values("diabetes", {"method": "rfl", "alpha": "1e-3..10", "epochs": "1"})
    alone, twice = f"sqlite:///{tmp_path / 'alone.db'}", f"sqlite:///{tmp_path / 'twice.db'}"
    _search(alone, spec, 8, FakeWorkers(0))
    _search(twice, spec, 4, FakeWorkers(0))
    _search(twice, spec, 8, FakeWorkers(0))
    first, then = [t.params["alpha"] for t in _trials(alone)], [t.params["alpha"] for t in _trials(twice)]
    assert then[:4] == first[:4]                     # the first tuner: the seeded stream, as ever
    assert len(set(then)) == 8, then                 # the second: none of them again
