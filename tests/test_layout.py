"""One home for every path under a results folder: flctl.layout.Layout. The names are those of the first release
(existing results folders keep working), every file the commands leave is one Layout names, and no other module
builds a results path by hand."""

from __future__ import annotations

import ast
import re
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flctl import records
from flctl.cli import app
from flctl.db import Store
from flctl.db.urls import file_url
from flctl.layout import Layout
from flctl.runner import execute
from tests.helpers import config

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()
SMALL = ("-o", "n_train=200", "-o", "n_test=200")


def invoke(root: Path, *args: str) -> None:
    res = runner.invoke(app, [*args, "--results-dir", str(root)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output


@pytest.mark.notorch
def test_the_names_are_those_every_release_wrote(tmp_path: Path) -> None:
    layout = Layout(str(tmp_path))      # a str root is held as a Path
    assert layout.root == tmp_path
    assert layout.db == tmp_path / "flctl.db"
    assert file_url(layout.db) == f"sqlite:///{tmp_path}/flctl.db"
    assert layout.records == tmp_path / "records"
    assert layout.run_records("0123456789abcdef") == tmp_path / "records" / "run_id=0123456789abcdef"
    assert layout.run_dir("0123456789abcdef") == tmp_path / "runs" / "0123456789abcdef"
    assert layout.checkpoint("0123456789abcdef") == tmp_path / "runs" / "0123456789abcdef" / "checkpoint.pt"
    assert layout.model("0123456789abcdef") == tmp_path / "runs" / "0123456789abcdef" / "model.pt"
    assert layout.run("0123456789abcdef").extras == tmp_path / "runs" / "0123456789abcdef" / "extras.npz"
    assert layout.jobs == tmp_path / "jobs"
    assert layout.sweep_jobs("abcdef123456") == tmp_path / "jobs" / "abcdef123456"
    assert layout.workers("abcdef123456") == tmp_path / "jobs" / "abcdef123456" / "workers"
    assert layout.worker_file("abcdef123456", "node1", 42) == tmp_path / "jobs/abcdef123456/workers/node1-42.json"
    assert layout.submitted("abcdef123456") == tmp_path / "jobs" / "abcdef123456" / "submitted.json"
    assert layout.controllers_log("abcdef123456") == tmp_path / "jobs" / "abcdef123456" / "controllers.log"
    assert layout.reports == tmp_path / "reports"
    assert layout.plot("cdf") == tmp_path / "reports" / "cdf"
    assert layout.plot("cdf", "sweep a/b") == tmp_path / "reports" / "cdf-sweep_a_b"
    assert layout.samples("diff") == tmp_path / "reports" / "samples-diff.parquet"


@pytest.mark.notorch
def test_the_default_database_url_is_the_layouts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flctl.results import CLI, find

    monkeypatch.delenv("FLCTL_DB", raising=False)
    assert find(tmp_path, None, CLI).url == file_url(Layout(tmp_path).db)
    assert find(tmp_path, "sqlite:////elsewhere/x.db", CLI).url == "sqlite:////elsewhere/x.db"
    assert find(tmp_path, None, CLI).layout == Layout(tmp_path)


# What a command may leave beside the database: SQLite's own files and flctl.db's lock files (Store.exclusive),
# named after whichever database file is used, --db included.
DB_COMPANION = re.compile(r"(-wal|-shm|-journal|\.[a-z_]+\.lock)")
# What submitit writes into the folder it is given (Layout.sweep_jobs): job pickles, results and logs.
SUBMITIT_FILE = re.compile(r"[A-Za-z0-9_%\[\]-]+_(log\.out|log\.err|submitted\.pkl|result\.pkl)")


def test_every_file_a_results_folder_holds_is_one_layout_names(tmp_path: Path) -> None:
    root = tmp_path / "results"
    layout = Layout(root)
    invoke(root, "run", "two-moons", "-m", "fl", "--seed", "1", "--epochs", "2", *SMALL)
    invoke(root, "sweep", "two-moons", "-m", "erm,fl", "--epochs", "2", *SMALL,
           "--executor", "debug")
    invoke(root, "report", "--plot", "cdf")
    invoke(root, "report", "--samples", "diff", "--methods", "erm,fl")
    # A run stopped after its first epoch keeps its checkpoint (a finished one removes it).
    stopped = config("two-moons", "rfl", epochs=4, options={"n_train": "200", "n_test": "200"})
    store = Store.open(file_url(layout.db))
    try:
        asked = iter([False])          # not before the first epoch: stopped after it, checkpointed
        ending = execute(stopped, store, layout, stop=lambda: next(asked, True))
        runs = {r.id: r for r in store.list_runs()}
        [sweep] = store.list_sweeps()
    finally:
        store.close()
    assert ending is not None and [r.status for r in ending.results] == ["stopped"]
    assert len(runs) == 4          # the run, the sweep's two cells, the stopped run

    named: set[Path] = {layout.db, layout.plot("cdf", "two-moons").with_suffix(".png"),
                        layout.plot("cdf", "two-moons").with_suffix(".pdf"),
                        layout.samples("diff"), layout.checkpoint(stopped.run_id)}
    folders: set[Path] = {layout.root, layout.records, layout.root / "runs", layout.reports, layout.jobs,
                          layout.sweep_jobs(sweep["id"]), layout.workers(sweep["id"])}
    for run_id, run in runs.items():
        folders |= {layout.run_records(run_id), layout.run_dir(run_id)}
        if run.status == "completed":
            named |= {layout.model(run_id), layout.run(run_id).extras}
            # what the database says a run left is where Layout says
            assert run.artifacts == {"records": str(layout.run_records(run_id)), "model": str(layout.model(run_id)),
                                     "extras": str(layout.run(run_id).extras)}
    assert runs[stopped.run_id].status == "interrupted"

    files = {p for p in root.rglob("*") if p.is_file()}
    assert named <= files, sorted(map(str, named - files))
    for path in sorted(files - named):
        where = path.parent
        if where == root:
            assert path.name.startswith(layout.db.name) and DB_COMPANION.fullmatch(path.name[len(layout.db.name):]), path
        elif where in {layout.run_records(r) for r in runs}:
            assert re.fullmatch(r"epoch=\d{5}\.parquet", path.name) or path.name == records.CHECKSUMS, path  # flctl.records' own
        else:
            assert where == layout.sweep_jobs(sweep["id"]) and SUBMITIT_FILE.fullmatch(path.name), path
    assert {p for p in root.rglob("*") if p.is_dir()} <= folders, sorted(map(str, folders))
    # the jobs folders stay private to their owner (flctl.launch.private_folder)
    for folder in (layout.jobs, layout.sweep_jobs(sweep["id"]), layout.workers(sweep["id"])):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder


# ---- no module but flctl/layout.py spells a results path ----

FOLDERS = ("jobs", "records", "reports", "runs", "workers")
FILES = ("flctl.db", "checkpoint.pt", "model.pt", "extras.npz", "submitted.json", "controllers.log")
PATH_CALLS = {"Path", "PurePath", "joinpath", "join", "with_name"}
# a formatted value followed by "/<name>": f"{root}/jobs", f"sqlite:///{root}/flctl.db"
AFTER_VALUE = re.compile(r"\x00/(" + "|".join(re.escape(n) for n in (*FOLDERS, *FILES)) + r")(/|\x00|$)")


def _segments(value: str) -> set[str]:
    return set(re.split(r"[/\\]", value))


def _text(node: ast.AST) -> str | None:
    """A str constant's value; an f-string's literal parts with \\x00 for each formatted value; else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "\x00" for v in node.values)
    return None


def spelled_paths(source: str) -> list[tuple[int, str]]:
    """Where ``source`` builds a path under a results folder by hand: a results name as an operand of ``/`` or an
    argument of Path()/joinpath/os.path.join/with_name, a file name of the layout as a string of its own, or an
    f-string that puts one after a formatted value. Messages and docstrings that mention a name are not paths."""
    found = []
    for node in ast.walk(ast.parse(source)):
        parts: list[ast.AST] = []
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            parts = [node.left, node.right]
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            parts = list(node.args) if name in PATH_CALLS else []
        for part in parts:
            text = _text(part)
            if text is not None and _segments(text) & {*FOLDERS, *FILES}:
                found.append((node.lineno, text.replace("\x00", "{}")))
        text = _text(node)
        if text is not None and (text in FILES or AFTER_VALUE.search(text)):
            found.append((node.lineno, text.replace("\x00", "{}")))
    return sorted(set(found))


@pytest.mark.notorch
def test_the_path_detector_finds_hand_built_paths_and_passes_messages() -> None:
    bad = ('root / "jobs" / sid', 'CHECKPOINT = "checkpoint.pt"', "f\"sqlite:///{root / 'flctl.db'}\"",
           'f"{root}/records"', 'Path(root, "reports")', 'run_dir.joinpath("model.pt")', 'root / "runs/x"')
    for line in bad:
        assert spelled_paths(line), line
    fine = ('artifacts["records"]', 'fail("give a file (sqlite:///results/flctl.db)")', 'name == "runs"',
            '"""resuming from ``run_dir/checkpoint.pt``"""', 'root / f"run_id={run_id}"')
    for line in fine:
        assert not spelled_paths(line), line
    # and the one home spells them all
    spelled = " ".join(t for _, t in spelled_paths((REPO / "flctl" / "layout.py").read_text()))
    for name in (*FOLDERS, *FILES):
        assert name in spelled, name


@pytest.mark.notorch
def test_no_module_outside_layout_spells_a_results_path() -> None:
    modules = sorted([*(REPO / "flctl").rglob("*.py"), *(REPO / "tasks").rglob("*.py")])
    assert len(modules) > 20
    found = {str(p.relative_to(REPO)): hits for p in modules if p != REPO / "flctl" / "layout.py"
             if (hits := spelled_paths(p.read_text()))}
    assert found == {}

