"""Issue 71's campaign of faults, by someone who wrote none of its code: the dry runs' cost line (run and sweep),
a resume priced from the epochs left, a worker's first cell, the committed benchmark's figures, paper's GPU hint,
reproduce's versions, shell completion, polyfit's seed note, the torch pair's fix and `sweep --wait`'s live line,
each tried as a new user and a hostile environment would: damaged rows, damaged or foreign benchmark files, old and
new schemas, unreachable servers, read-only folders, concurrent writers, huge plans, broken plugins. Each case is
what a user would expect; one that was not clean is a strict xfail naming its defect, for the owners to fix."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flctl import api
from tests.helpers import bound, files_under, in_process, one_line_error

ROOT = Path(__file__).resolve().parents[1]
PLAN = ["sweep", "two-moons", "-m", "fl", "--seeds", "2", "--dry-run"]          # with --epochs: plan()
# `flctl ARGS` in a process of its own whose committed benchmark folder (flctl.cost.reference.REFERENCE) is argv[1]
FLCTL = shutil.which("flctl", path=str(Path(sys.executable).parent)) or "flctl"
WITH_REFERENCE = ("import pathlib, sys; import flctl.cost.reference as r; r.REFERENCE = pathlib.Path(sys.argv[1]); "
                  "sys.argv = ['flctl', *sys.argv[2:]]; from flctl.__main__ import main; main()")
SEED0 = api.config("two-moons", "fl", epochs=30, seed=0).run_id


def plan(epochs: int = 30) -> list[str]:
    """The two-cell fl sweep a test prices (seed 0's cell is the fixture's third run)."""
    return [*PLAN, "--epochs", str(epochs)]


def flctl(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
          timeout: float = 180) -> subprocess.CompletedProcess:
    """`flctl ARGS` as a real process."""
    return subprocess.run([sys.executable, "-m", "flctl", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "COLUMNS": "400", **(env or {})}, timeout=timeout)


def flctl_ref(reference: Path, *args: str) -> subprocess.CompletedProcess:
    """`flctl ARGS` with the committed benchmark folder moved to ``reference`` (a copy: the committed files are
    never edited)."""
    return subprocess.run([sys.executable, "-c", WITH_REFERENCE, str(reference), *args], capture_output=True,
                          text=True, env={**os.environ, "COLUMNS": "400"}, timeout=180)


def clean(res: subprocess.CompletedProcess) -> str:
    """The cost line of a dry run that exited 0 without a traceback."""
    assert res.returncode == 0, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr, res.stderr
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("cost:")]
    assert len(lines) == 1, res.stdout
    return lines[0]


def warnings(res: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in res.stderr.splitlines() if ln.startswith("flctl: warning:")]


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results folder with three finished two-moons runs: erm of 4 and 44 epochs, and the plan's seed-0 fl cell
    (30 epochs), copied by each test that changes it."""
    root = tmp_path_factory.mktemp("c71") / "results"
    for args in (["-m", "erm", "--epochs", "4"], ["-m", "erm", "--epochs", "44"],
                 ["-m", "fl", "--epochs", "30", "--seed", "0"]):
        res = in_process("run", "two-moons", *args, "--results-dir", str(root))
        assert res.returncode == 0, res.stderr
    # seconds = 2.8 + 0.05 x epochs, each run its own process (as `flctl run`'s): the fit reads 2.8 s a cell
    with sqlite3.connect(root / "flctl.db") as conn:
        conn.execute("UPDATE runs SET duration_s = 2.8 + 0.05 * epochs_done, pid = rowid")
    return root


@pytest.fixture
def damaged(trained: Path, tmp_path: Path):
    """A copy of ``trained`` with SQL run on its database; returns the copy."""
    def make(sql: str) -> Path:
        root = tmp_path / "copy"
        shutil.copytree(trained, root)
        with sqlite3.connect(root / "flctl.db") as conn:
            conn.executescript(sql)
        return root
    return make


@pytest.fixture
def reference(tmp_path: Path) -> Path:
    """A copy of benchmarks/results' task-cost files in a temp folder."""
    folder = tmp_path / "reference"
    folder.mkdir()
    for p in (ROOT / "benchmarks" / "results").glob("task-costs-*.json"):
        shutil.copy(p, folder / p.name)
    return folder


def newest(reference: Path, kind: str = "cpu") -> Path:
    return sorted(reference.glob(f"task-costs-*-{kind}.json"))[-1]


# ---------------------------------------------------------------- damaged rows in the runs table

def test_c01_text_duration_is_left_out_with_one_warning(damaged) -> None:
    root = damaged("UPDATE runs SET duration_s = 'abc' WHERE epochs_done = 4;")
    res = flctl(*plan(), "--results-dir", str(root))
    assert "cost: about" in clean(res)
    [warning] = warnings(res)
    assert "'abc'" in warning


def test_c02_text_epochs_done_is_named_in_the_warning(damaged) -> None:
    root = damaged("UPDATE runs SET epochs_done = 'abc' WHERE epochs_done = 4;")
    res = flctl(*plan(), "--results-dir", str(root))
    assert "cost: about" in clean(res)
    [warning] = warnings(res)
    assert "epochs_done" in warning and "'abc'" in warning, warning


def test_c03_garbage_started_at_does_not_break_the_dry_run(damaged) -> None:
    root = damaged("UPDATE runs SET started_at = 'yesterday' WHERE epochs_done = 4;")
    assert "cost: about" in clean(flctl(*plan(), "--results-dir", str(root)))


def test_c04_garbage_finished_at_does_not_break_the_dry_run(damaged) -> None:
    root = damaged("UPDATE runs SET finished_at = 'garbage' WHERE epochs_done = 44;")
    assert "cost: about" in clean(flctl(*plan(31), "--results-dir", str(root)))


def test_c05_null_host_and_pid_count_as_first_cells(damaged) -> None:
    root = damaged("UPDATE runs SET host = NULL, pid = NULL;")
    assert "fitted to 3 finished two-moons runs" in clean(flctl(*plan(31), "--results-dir", str(root)))


def test_c06_one_timezone_aware_time_in_a_process(damaged) -> None:
    root = damaged("UPDATE runs SET host = 'h', pid = 1; "
                   "UPDATE runs SET finished_at = '2026-01-01 10:00:00+00:00' WHERE epochs_done = 4;")
    assert "cost: about" in clean(flctl(*plan(31), "--results-dir", str(root)))


def test_c07_negative_epochs_done_in_the_history(damaged) -> None:
    root = damaged("UPDATE runs SET epochs_done = -5 WHERE epochs_done = 4;")
    line = clean(flctl(*plan(31), "--results-dir", str(root)))
    assert " x 0 s" not in line, line


def test_c08_negative_duration_is_left_out(damaged) -> None:
    root = damaged("UPDATE runs SET duration_s = -1 WHERE epochs_done = 4;")
    res = flctl(*plan(), "--results-dir", str(root))
    assert "fitted to 2 finished" in clean(res) and len(warnings(res)) == 1


def test_c09_infinite_duration_is_left_out(damaged) -> None:
    root = damaged("UPDATE runs SET duration_s = 1e999 WHERE epochs_done = 4;")
    res = flctl(*plan(), "--results-dir", str(root))
    line = clean(res)
    assert "fitted to 2 finished" in line and "inf" not in line and len(warnings(res)) == 1


def test_c10_resumed_cell_with_text_epochs_done(damaged) -> None:
    root = damaged(f"UPDATE runs SET status = 'interrupted', epochs_done = 'abc' WHERE id = '{SEED0}';")
    assert "cost: about" in clean(flctl(*plan(), "--results-dir", str(root)))


def test_c11_resumed_cell_past_its_epochs_has_none_left(damaged) -> None:
    root = damaged(f"UPDATE runs SET status = 'interrupted', epochs_done = 50 WHERE id = '{SEED0}';")
    assert "30 epochs left (1 cell(s) resumed)" in clean(flctl(*plan(), "--results-dir", str(root)))


def test_c12_resumed_cell_with_negative_epochs_done_trains_afresh(damaged) -> None:
    root = damaged(f"UPDATE runs SET status = 'interrupted', epochs_done = -3 WHERE id = '{SEED0}';")
    line = clean(flctl(*plan(), "--results-dir", str(root)))
    assert "60 epochs x" in line and "resumed" not in line


def test_c13_resumed_cell_with_fractional_epochs_done(damaged) -> None:
    root = damaged(f"UPDATE runs SET status = 'interrupted', epochs_done = 2.5 WHERE id = '{SEED0}';")
    assert ".5 epochs" not in clean(flctl(*plan(), "--results-dir", str(root)))


def test_c14_resumed_cell_whose_epochs_changed_is_another_cell(damaged) -> None:
    """Interrupted at 25 of 30, planned again with 40 epochs: other cells (other ids), each priced whole."""
    root = damaged(f"UPDATE runs SET status = 'interrupted', epochs_done = 25 WHERE id = '{SEED0}';")
    line = clean(flctl(*plan(40), "--results-dir", str(root)))
    assert "80 epochs x" in line and "resumed" not in line, line


def test_c15_resumed_row_whose_task_changed_is_not_this_task_s(damaged) -> None:
    root = damaged(f"UPDATE runs SET status = 'interrupted', epochs_done = 25, task = 'digits' WHERE id = '{SEED0}';")
    res = flctl(*plan(), "--results-dir", str(root))
    assert "Traceback" not in res.stderr and res.returncode in (0, 2), res.stderr
    if res.returncode == 0:
        assert "resumed" not in clean(res)


def test_c16_run_dry_run_prices_a_resume_from_its_epochs_left(damaged) -> None:
    root = damaged(f"UPDATE runs SET status = 'interrupted', epochs_done = 25 WHERE id = '{SEED0}';")
    before = files_under(root)
    line = clean(flctl("run", "two-moons", "-m", "fl", "--epochs", "30", "--seed", "0", "--dry-run",
                       "--results-dir", str(root)))
    assert "5 epochs left (1 cell(s) resumed)" in line, line
    assert files_under(root) == before


def test_c17_run_dry_run_with_no_results_folder_writes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "none"
    line = clean(flctl("run", "two-moons", "-m", "fl", "--dry-run", "--results-dir", str(root)))
    assert "from benchmarks/results/task-costs-" in line and not root.exists()


# ---------------------------------------------------------------- schemas, servers, folders, writers

def test_c18_older_schema_is_priced_without_its_runs_and_not_upgraded(damaged) -> None:
    root = damaged("UPDATE flctl_alembic_version SET version_num = '0009';")
    res = flctl(*plan(), "--results-dir", str(root))
    assert "older flctl" in res.stderr and "cost:" in res.stdout and res.returncode == 0, res.stderr
    with sqlite3.connect(root / "flctl.db") as conn:
        assert conn.execute("SELECT version_num FROM flctl_alembic_version").fetchone() == ("0009",)


def test_c19_newer_schema_is_one_line_exit_2(damaged) -> None:
    root = damaged("UPDATE flctl_alembic_version SET version_num = '0099';")
    assert "newer" in one_line_error(flctl(*plan(), "--results-dir", str(root)))
    assert "newer" in one_line_error(flctl("run", "two-moons", "--dry-run", "--results-dir", str(root)))


def test_c20_unreachable_postgresql_is_one_line_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "r"
    start = time.monotonic()
    for cmd in (plan(), ["run", "two-moons", "--dry-run"]):
        one_line_error(flctl(*cmd, "--results-dir", str(root), "--db", "postgresql://nobody@127.0.0.1:1/none"))
    assert not root.exists() and time.monotonic() - start < bound(30)


def test_c21_an_empty_postgresql_database_gets_no_tables_from_a_dry_run() -> None:
    import sqlalchemy as sa

    from flctl.db import normalize_url
    from tests.test_concurrency import pg_database

    url = pg_database()
    assert "from benchmarks/results/task-costs-" in clean(flctl(*plan(), "--db", url))
    assert "from benchmarks/results/task-costs-" in clean(flctl("run", "two-moons", "--dry-run", "--db", url))
    engine = sa.create_engine(normalize_url(url))
    try:
        assert sa.inspect(engine).get_table_names() == []
    finally:
        engine.dispose()


def read_only(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """`flctl ARGS` with ``folder`` read-only: a read-only bind mount in a mount namespace of its own for root (whom
    permissions do not stop), else its permissions taken away for the call."""
    if os.geteuid() == 0:
        script = ('mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"')
        for _ in range(3):      # the mount itself can fail while other tests unshare beside it: tried again
            res = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", str(folder),
                                  sys.executable, "-m", "flctl", *args], capture_output=True, text=True,
                                 env={**os.environ, "COLUMNS": "400"}, timeout=180)
            if not res.stderr.startswith(("mount:", "unshare:")):
                break
        return res
    mode = folder.stat().st_mode
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        return flctl(*args)
    finally:
        folder.chmod(mode)


def test_c22_read_only_results_folder_with_its_database(damaged) -> None:
    root = damaged("")
    before = {p: p.stat().st_mtime_ns for p in files_under(root)}
    res = read_only(root, *plan(31), "--results-dir", str(root))
    # the real sweep would refuse it, and so does its dry run (sweep._dry_run: make_folder(dry=True)), in one line
    assert "not writable" in one_line_error(res)
    assert {p: p.stat().st_mtime_ns for p in files_under(root)} == before


def test_c23_read_only_parent_refused_in_one_line(tmp_path: Path) -> None:
    parent = tmp_path / "ro"
    parent.mkdir()
    line = one_line_error(read_only(parent, *plan(), "--results-dir", str(parent / "results")))
    assert "results" in line and not (parent / "results").exists()


def test_c24_a_writer_holding_the_database_does_not_break_the_dry_run(damaged) -> None:
    """Another process writes the database (rows of a running sweep, one transaction held 3 s) while a dry run
    prices the plan."""
    root = damaged("")
    writer = subprocess.Popen([sys.executable, "-c", (
        "import sqlite3, sys, time\n"
        "c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)\n"
        "c.execute('BEGIN IMMEDIATE')\n"
        "c.execute(\"UPDATE runs SET heartbeat_at = '2026-01-01 00:00:00'\")\n"
        "print('held', flush=True)\n"
        "time.sleep(3)\n"
        "c.execute('COMMIT')\n"), str(root / "flctl.db")], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "held"
        assert "fitted to 3 finished" in clean(flctl(*plan(31), "--results-dir", str(root)))
    finally:
        writer.wait(timeout=30)


@pytest.mark.slow
def test_c25_a_100000_cell_plan_with_a_resumed_cell_is_priced_quickly(damaged) -> None:
    root = damaged(f"UPDATE runs SET status = 'interrupted', epochs_done = 25 WHERE id = '{SEED0}';")
    start = time.monotonic()
    res = flctl("sweep", "two-moons", "-m", "fl", "--seeds", "10000", "--eps", "0.01,0.02,0.03,0.04,0.05,0.06,0.07,"
                "0.08,0.09,0.1", "--epochs", "30", "--yes", "--dry-run", "--results-dir", str(root))
    took = time.monotonic() - start
    line = clean(res)
    assert "100,000 cell(s)" in line and "(1 cell(s) resumed)" in line, line
    assert took < bound(60), took


# ---------------------------------------------------------------- the committed benchmark's figures

def test_c26_a_malformed_newest_file_is_passed_over_for_an_older_one(reference: Path, tmp_path: Path) -> None:
    bad = newest(reference)
    bad.write_text("{not json")
    res = flctl_ref(reference, *plan(), "--results-dir", str(tmp_path / "r"))
    line = clean(res)
    assert "from benchmarks/results/task-costs-" in line and bad.name not in line
    assert len(warnings(res)) == 1 and bad.name in warnings(res)[0]


@pytest.mark.parametrize("text", ["[1, 2, 3]", '{"tasks": ["two-moons"]}', '{"tasks": {"two-moons": "fast"}}',
                                  '{"tasks": {"two-moons": {"s_per_cell": 0.2, "s_per_epoch": "fast"}}}',
                                  '{"tasks": {"two-moons": {"s_per_cell": 0.2, "s_per_epoch": true}}}',
                                  '{"tasks": {"two-moons": {"s_per_cell": 0.2, "s_per_epoch": 0.1, '
                                  '"s_per_process": "x"}}}'],
                         ids=["c27-list", "c28-tasks-list", "c29-figures-text", "c30-text-figure", "c31-bool-figure",
                              "c32-text-optional-figure"])
def test_c27_to_c32_foreign_figures_are_passed_over(reference: Path, tmp_path: Path, text: str) -> None:
    bad = newest(reference)
    bad.write_text(text)
    res = flctl_ref(reference, *plan(), "--results-dir", str(tmp_path / "r"))
    assert bad.name not in clean(res)
    assert len(warnings(res)) == 1 and bad.name in warnings(res)[0], res.stderr


def test_c33_an_absurd_figure_prints_no_infinity(reference: Path, tmp_path: Path) -> None:
    bad = newest(reference)
    data = json.loads(bad.read_text())
    data["tasks"]["two-moons"]["s_per_epoch"] = 1e308
    bad.write_text(json.dumps(data))
    line = clean(flctl_ref(reference, *plan(), "--results-dir", str(tmp_path / "r")))
    assert "inf" not in line, line


def test_c34_non_utf8_file_and_a_folder_named_like_one(reference: Path, tmp_path: Path) -> None:
    newest(reference).write_bytes(b"\xff\xfe\x00garbage")
    (reference / "task-costs-2099-01-01-cpu.json").mkdir()
    res = flctl_ref(reference, *plan(), "--results-dir", str(tmp_path / "r"))
    assert "from benchmarks/results/task-costs-" in clean(res)
    assert len(warnings(res)) == 2, res.stderr


def test_c35_no_committed_benchmark_at_all(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    res = flctl_ref(tmp_path / "empty", *plan(), "--results-dir", str(tmp_path / "r"))
    assert clean(res).startswith("cost: unknown: no finished two-moons runs") and res.stderr == ""


def test_c36_zero_training_samples_with_a_subset(reference: Path, tmp_path: Path) -> None:
    bad = newest(reference)
    data = json.loads(bad.read_text())
    data["tasks"]["two-moons"]["n_train"] = 0
    bad.write_text(json.dumps(data))
    res = flctl_ref(reference, *plan(), "--subset", "64", "--results-dir", str(tmp_path / "r"))
    assert "cost: about" in clean(res)


def test_c37_paper_without_a_gpu_benchmark_names_no_cuda_dry_run(reference: Path, tmp_path: Path) -> None:
    for p in reference.glob("task-costs-*-cuda.json"):
        p.unlink()
    res = flctl_ref(reference, "paper", "--dry-run", "--results-dir", str(tmp_path / "r"))
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert "--device cuda" not in res.stdout and "cell(s) unknown" in res.stdout
    assert not (tmp_path / "r").exists()


def test_c38_paper_with_a_damaged_gpu_benchmark(reference: Path, tmp_path: Path) -> None:
    cuda = newest(reference, "cuda")
    cuda.write_text('{"tasks": {"cifar10": {"s_per_cell": "x", "s_per_epoch": 1}}}')
    res = flctl_ref(reference, "paper", "--dry-run", "--results-dir", str(tmp_path / "r"))
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert "--device cuda" not in res.stdout
    assert any(cuda.name in w for w in warnings(res)), res.stderr


def test_c39_paper_dry_run_totals_each_item_and_the_sum(tmp_path: Path) -> None:
    res = flctl("paper", "--dry-run", "--scale", "smoke", "--results-dir", str(tmp_path / "r"))
    assert res.returncode == 0, res.stderr
    total = [ln for ln in res.stdout.splitlines() if "cell(s) to do" in ln]
    assert len(total) == 1 and "take about" in total[0], res.stdout
    assert not (tmp_path / "r").exists()


# ---------------------------------------------------------------- reproduce's versions

def test_c40_reproduce_judges_only_versions_that_move_numbers() -> None:
    from flctl.reproduce import version_changes

    here = {"flctl": "1.0", "numpy": "2.0", "pyarrow": "25.0.1", "optuna": "4.0", "cuda": None, "python": "3.11.9"}
    assert version_changes(None, here) == {}
    assert version_changes({"pyarrow": "26.0.1", "optuna": "3.0", "python": "3.12.0", "flctl_commit": "abc"},
                           here) == {}
    assert version_changes({"numpy": "1.26", "flctl": "0.9", "cuda": "12.8"}, here) == {
        "numpy": ("1.26", "2.0"), "flctl": ("0.9", "1.0"), "cuda": ("12.8", None)}


def test_c41_a_package_named_in_another_case_is_still_compared() -> None:
    from flctl.reproduce import version_changes

    here = {"numpy": "2.0", "scikit-learn": "1.6"}
    assert set(version_changes({"NumPy": "1.26", "scikit_learn": "1.0"}, here)) == {"numpy", "scikit-learn"}


def test_c42_reproduce_with_damaged_recorded_versions(damaged) -> None:
    root = damaged(f"UPDATE runs SET provenance = json_set(provenance, '$.libraries', json('[1, 2]')) "
                   f"WHERE id = '{SEED0}';")
    res = in_process("reproduce", SEED0, "--results-dir", str(root))
    assert "Traceback" not in res.stderr and res.returncode in (0, 1, 2), res.stderr


# ---------------------------------------------------------------- shell completion

def completion(words: str, tmp_path: Path, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    shown = {**{k: v for k, v in os.environ.items() if k not in ("FLCTL_TASKS", "FLCTL_DB")}, **env,
             "_FLCTL_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(len(words.split(" ")) - 1)}
    return subprocess.run([FLCTL], env=shown, cwd=tmp_path, capture_output=True, text=True,
                          timeout=timeout)


def quiet(res: subprocess.CompletedProcess) -> list[str]:
    assert res.returncode == 0 and res.stderr == "", (res.returncode, res.stderr)
    return res.stdout.split()


def test_c43_a_broken_plugin_completes_flctl_s_own_tasks(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("raise RuntimeError('plugin broke')\n")
    assert quiet(completion("flctl run tw", tmp_path, FLCTL_TASKS=str(tmp_path / "bad.py"))) == ["two-moons"]


def test_c44_a_plugin_folder_of_many_files(tmp_path: Path) -> None:
    folder = tmp_path / "plugins"
    folder.mkdir()
    task = (ROOT / "tasks" / "two_moons.py").read_text()
    for i in range(150):
        (folder / f"t{i:03}.py").write_text(task.replace('name="two-moons"', f'name="lab-{i:03}"'))
    for i in range(50):
        (folder / f"broken{i}.py").write_text("import not_a_module_anywhere\n")
    start = time.monotonic()
    found = quiet(completion("flctl run lab-14", tmp_path, FLCTL_TASKS=str(folder)))
    assert found == [f"lab-{i}" for i in range(140, 150)] and time.monotonic() - start < bound(30)


def test_c45_non_utf8_plugin_file_names(tmp_path: Path) -> None:
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / os.fsdecode(b"caf\xe9.py")).write_text("raise SystemError('x')\n")
    (folder / os.fsdecode(b"\xff\xfe.py")).write_bytes(b"TASK = '\xff'\n")
    assert quiet(completion("flctl run tw", tmp_path, FLCTL_TASKS=str(folder))) == ["two-moons"]


def test_c46_a_plugin_that_exits_at_import(tmp_path: Path) -> None:
    (tmp_path / "exits.py").write_text("import sys\nsys.exit(3)\n")
    assert quiet(completion("flctl run tw", tmp_path, FLCTL_TASKS=str(tmp_path / "exits.py"))) == ["two-moons"]


def test_c47_a_plugin_writing_to_descriptor_2(tmp_path: Path) -> None:
    (tmp_path / "noisy.py").write_text("import os\nos.write(2, b'loading CUDA kernels...\\n')\n")
    assert quiet(completion("flctl run tw", tmp_path, FLCTL_TASKS=str(tmp_path / "noisy.py"))) == ["two-moons"]


def test_c48_a_plugin_that_hangs_at_import(tmp_path: Path) -> None:
    (tmp_path / "slow.py").write_text("import time\ntime.sleep(60)\n")
    try:
        res = completion("flctl run tw", tmp_path, timeout=15, FLCTL_TASKS=str(tmp_path / "slow.py"))
    except subprocess.TimeoutExpired:
        pytest.fail("completion hung on a plugin's import")
    assert quiet(res) == ["two-moons"]


def test_c49_run_ids_with_no_results_folder(tmp_path: Path) -> None:
    assert quiet(completion("flctl show ", tmp_path, FLCTL_RESULTS=str(tmp_path / "none"))) == []
    assert not (tmp_path / "none").exists()


def test_c50_run_ids_with_a_damaged_database(tmp_path: Path) -> None:
    root = tmp_path / "results"
    root.mkdir()
    (root / "flctl.db").write_bytes(b"SQLite format 3\x00" + os.urandom(4096))
    before = (root / "flctl.db").read_bytes()
    assert quiet(completion("flctl show ", tmp_path, FLCTL_RESULTS=str(root))) == []
    assert (root / "flctl.db").read_bytes() == before and files_under(root) == [root / "flctl.db"]


def test_c51_run_ids_with_a_damaged_row_and_an_older_schema(damaged, tmp_path: Path) -> None:
    root = damaged("UPDATE runs SET started_at = 'yesterday' WHERE epochs_done = 4;")
    quiet(completion("flctl show ", tmp_path, FLCTL_RESULTS=str(root)))
    with sqlite3.connect(root / "flctl.db") as conn:
        conn.execute("UPDATE flctl_alembic_version SET version_num = '0009'")
    assert quiet(completion("flctl show ", tmp_path, FLCTL_RESULTS=str(root))) == []
    with sqlite3.connect(root / "flctl.db") as conn:
        assert conn.execute("SELECT version_num FROM flctl_alembic_version").fetchone() == ("0009",)


def test_c52_run_ids_with_an_unreachable_server(tmp_path: Path) -> None:
    start = time.monotonic()
    assert quiet(completion("flctl show ", tmp_path, FLCTL_DB="postgresql://nobody@127.0.0.1:1/none")) == []
    assert time.monotonic() - start < bound(20)


# ---------------------------------------------------------------- polyfit's seed note

def test_c53_seeds_zero_is_one_line_exit_2(tmp_path: Path) -> None:
    one_line_error(flctl("sweep", "polyfit", "--seeds", "0", "--dry-run", "--results-dir", str(tmp_path / "r")))


def test_c54_one_seed_has_no_note_and_many_seeds_one_note(tmp_path: Path) -> None:
    one = flctl("sweep", "polyfit", "--seeds", "1", "--dry-run", "--results-dir", str(tmp_path / "r"))
    assert "ignores the seed" not in one.stdout + one.stderr
    many = flctl("sweep", "polyfit", "--seeds", "10000", "--dry-run", "--results-dir", str(tmp_path / "r"))
    clean(many)
    notes = [ln for ln in (many.stdout + many.stderr).splitlines() if "ignores the seed" in ln]
    assert len(notes) == 1 and "10000 seeds" in notes[0].replace(",", ""), notes


def test_c55_a_spec_file_s_seeds_get_the_note_and_a_non_seed_free_task_none(tmp_path: Path) -> None:
    spec = tmp_path / "poly.toml"
    spec.write_text('task = "polyfit"\nmethod = ["erm"]\nseeds = 3\n')
    res = flctl("sweep", "--spec", str(spec), "--dry-run", "--results-dir", str(tmp_path / "r"))
    clean(res)
    assert "ignores the seed: its 3 seeds plan 3 identical copies" in res.stdout + res.stderr
    spec.write_text('task = "two-moons"\nmethod = ["erm"]\nseeds = 3\n')
    res = flctl("sweep", "--spec", str(spec), "--dry-run", "--results-dir", str(tmp_path / "r"))
    assert "ignores the seed" not in clean(res) + res.stdout + res.stderr


# ---------------------------------------------------------------- the torch pair's fix

def _pair(monkeypatch: pytest.MonkeyPatch, torch: tuple[str, str], vision: tuple[str, str]) -> str | None:
    """torch_pair_problem for an installed (built, metadata) torch and torchvision."""
    from flctl import versions

    built = {"torch": torch[0], "torchvision": vision[0]}
    meta = {"torch": torch[1], "torchvision": vision[1]}
    monkeypatch.setattr(versions, "_built", built.get)
    monkeypatch.setattr(versions, "_version", meta.get)
    return versions.torch_pair_problem()


def test_c56_the_printed_fix_never_installs_the_installed_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    import re

    from flctl.versions import NEWEST_PAIR

    for torch, vision in [(("2.13.0+cpu", "2.13.0+cpu"), ("0.28.0+cu128", "0.28.0")),
                          (("2.14.1+cpu", "2.14.1+cpu"), ("0.29.1+cu130", "0.29.1")),
                          (("2.12.0+cpu", "2.12.0+cpu"), ("0.28.0+cpu", "0.28.0+cpu"))]:
        line = _pair(monkeypatch, torch, vision)
        assert line is not None
        wanted = re.findall(r"'(torch(?:vision)?)===([^']+)'", line)
        assert wanted and all(v != (torch if n == "torch" else vision)[0] for n, v in wanted), line
        assert f"torchvision==={vision[0]}" not in line
        if torch[0].endswith("+cpu"):
            assert f"'torch==={NEWEST_PAIR[0]}'" in line


def test_c57_a_from_source_pair_is_not_called_broken(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _pair(monkeypatch, ("2.6.0a0+ecf3bae40a.nv25.01", "2.6.0a0+ecf3bae40a.nv25.01"),
                 ("0.21.0a0+8a9f5a1", "0.21.0a0+8a9f5a1")) is None


# ---------------------------------------------------------------- sweep --wait, outside a quiet terminal

@pytest.mark.slow
def test_c58_wait_with_stdout_closed_and_a_pipe_that_breaks(tmp_path: Path) -> None:
    """`flctl sweep --wait >&-` and `flctl sweep --wait | head -1`: the sweep trains; no traceback."""
    root = tmp_path / "r"
    args = [sys.executable, "-m", "flctl", "sweep", "two-moons", "-m", "erm", "--epochs", "2", "-o", "n_train=64",
            "--workers", "1", "--wait", "--results-dir", str(root)]
    closed = subprocess.run(args, stdout=None, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, timeout=300,
                            preexec_fn=lambda: os.close(1))
    assert "Traceback" not in closed.stderr, closed.stderr
    piped = subprocess.run(f"{' '.join(map(str, args))} -o n_test=64 | head -c 1", shell=True, capture_output=True,
                           text=True, timeout=300)
    assert "Traceback" not in piped.stderr, piped.stderr
    runs = api.runs(results_dir=root)
    assert runs and all(r.status == "completed" for r in runs), [(r.id, r.status, r.error) for r in runs]


def _read_until_exit(out: Path, each: str = "") -> str:
    """A pty driver's end: read the terminal (running ``each`` first at every turn) until the child closes it or the
    deadline passes, write what was drawn to ``out``, and exit with the child's exit code."""
    return ("while time.monotonic() < deadline:\n" + each +
            "    if select.select([master], [], [], 0.1)[0]:\n"
            "        try:\n"
            "            chunk = os.read(master, 65536)\n"
            "        except OSError:\n"
            "            break\n"
            "        if not chunk:\n"
            "            break\n"
            "        buf += chunk\n"
            f"open({str(out)!r}, 'wb').write(buf)\n"
            "sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n")


@pytest.mark.slow
def test_c59_wait_in_a_tiny_terminal_where_every_cell_fails(tmp_path: Path) -> None:
    """A 20-column pty, a task whose cells all fail: the command ends, says they failed, exits non-zero, and leaves
    the cursor shown."""
    task = (ROOT / "tasks" / "two_moons.py").read_text().replace('name="two-moons"', 'name="doomed"')
    task = task.replace("def load(", "def load(*a, **k):\n    raise RuntimeError('doomed data')\n\n\ndef _unused_load(")
    (tmp_path / "doomed.py").write_text(task)
    out = tmp_path / "screen.bin"
    driver = (
        "import os, pty, select, struct, fcntl, termios, sys, time\n"
        "pid, master = pty.fork()\n"
        "if pid == 0:\n"
        "    os.environ.update(COLUMNS='20', LINES='5', TERM='xterm')\n"
        f"    os.execv(sys.executable, [sys.executable, '-m', 'flctl', 'sweep', 'doomed', '-m', 'erm', '--seeds', '2',"
        f" '--epochs', '2', '--workers', '1', '--wait', '--results-dir', {str(tmp_path / 'r')!r}])\n"
        "fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack('HHHH', 5, 20, 0, 0))\n"
        "buf, deadline = b'', time.monotonic() + 240\n"
        + _read_until_exit(out))
    res = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "FLCTL_TASKS": str(tmp_path / "doomed.py")})
    shown = out.read_bytes().decode(errors="replace")
    assert res.returncode not in (0, 124), (res.returncode, shown)
    assert "Traceback" not in shown and "fail" in shown.lower(), shown
    assert shown.rfind("\x1b[?25l") <= shown.rfind("\x1b[?25h"), shown      # the cursor shown again


@pytest.mark.slow
def test_c60_wait_through_a_terminal_resized_twice(tmp_path: Path) -> None:
    """The terminal narrowed to 30 columns, then widened to 200, while the live line is drawn: the sweep ends, no
    traceback, the cursor shown again."""
    out = tmp_path / "screen.bin"
    driver = (
        "import os, pty, select, signal, struct, fcntl, termios, sys, time\n"
        "pid, master = pty.fork()\n"
        "if pid == 0:\n"
        "    os.environ.update(TERM='xterm')\n"
        "    os.environ.pop('COLUMNS', None)\n"
        f"    os.execv(sys.executable, [sys.executable, '-m', 'flctl', 'sweep', 'two-moons', '-m', 'erm', '--seeds', "
        f"'2', '--epochs', '40', '--workers', '1', '--wait', '--results-dir', {str(tmp_path / 'r')!r}])\n"
        "def size(cols):\n"
        "    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack('HHHH', 24, cols, 0, 0))\n"
        "    os.kill(pid, signal.SIGWINCH)\n"
        "size(120)\n"
        "buf, deadline, sizes = b'', time.monotonic() + 240, [30, 200]\n"
        + _read_until_exit(out, each="    if sizes and buf.count(b' done ') >= 2 * (3 - len(sizes)):\n"
                                    "        size(sizes.pop(0))\n"))
    res = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=300)
    shown = out.read_bytes().decode(errors="replace")
    assert res.returncode == 0, (res.returncode, shown[-2000:])
    assert "Traceback" not in shown and shown.rfind("\x1b[?25l") <= shown.rfind("\x1b[?25h"), shown[-2000:]
    assert all(r.status == "completed" for r in api.runs(results_dir=tmp_path / "r"))


def test_c61_run_dry_run_of_a_gpu_only_task_with_a_damaged_gpu_benchmark(reference: Path, tmp_path: Path) -> None:
    ok = flctl_ref(reference, "run", "cifar10", "--dry-run", "--results-dir", str(tmp_path / "r"))
    assert "on a GPU (--device cuda) about" in clean(ok)
    for p in reference.glob("task-costs-*-cuda.json"):
        p.write_text('{"tasks": {"cifar10": [1]}}')
    res = flctl_ref(reference, "run", "cifar10", "--dry-run", "--results-dir", str(tmp_path / "r"))
    line = clean(res)
    assert line.startswith("cost: unknown") and "--device cuda" not in line, line
    assert warnings(res) and not (tmp_path / "r").exists()


def test_c62_a_worker_s_first_cell_extra_is_paid_once(damaged) -> None:
    """One worker (one host and pid) trained the three runs one after the other; its first paid 3 s more than the
    fit of the other two: the line prices that extra once, not once a cell."""
    root = damaged("UPDATE runs SET host = 'h', pid = 7, "
                   "started_at = '2026-01-01 10:0' || rowid || ':00', finished_at = '2026-01-01 10:0' || rowid || ':30';"
                   "UPDATE runs SET duration_s = duration_s + 3 WHERE rowid = 1;")
    line = clean(flctl("sweep", "two-moons", "-m", "fl", "--seeds", "8", "--epochs", "31", "--workers", "1",
                       "--dry-run", "--results-dir", str(root)))
    assert "3.0 s more for a worker's first cell" in line and "8 cell(s) x 2.8 s" in line, line


@pytest.mark.slow
def test_c63_the_from_python_block_run_twice_in_one_folder(tmp_path: Path) -> None:
    """docs/extending.md's block as a reader runs it again (a second try, the same folder): it says six things
    again, its run and sweep already there."""
    import re

    text = (ROOT / "docs" / "extending.md").read_text()
    block = re.search(r"## From Python\n.*?```python\n(.*?)```", text, re.S).group(1)
    task = (ROOT / "tasks" / "two_moons.py").read_text().replace('name="two-moons"', 'name="my-task"')
    (tmp_path / "my_task.py").write_text(task)
    (tmp_path / "script.py").write_text(block)
    env = {k: v for k, v in os.environ.items() if k not in ("FLCTL_RESULTS", "FLCTL_DB", "FLCTL_TASKS")}
    said = []
    for _ in range(2):
        res = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True,
                             timeout=600, env=env)
        assert res.returncode == 0, res.stderr
        said.append(res.stdout.splitlines())
    assert len(said[1]) == len(said[0]) == 6, said
    assert said[1][0] == said[0][0] and said[1][4] == said[0][4], said      # the same run, the same sweep done
    assert said[1][2] == "7 completed run(s) of my-task", said              # the run and the sweep's six


# ---------------------------------------------------------------- more: servers, a live writer, intervals, reproduce

def test_c64_postgresql_history_and_a_resume_priced_as_sqlite_s() -> None:
    from tests.test_concurrency import pg_database

    url = pg_database()
    for args in (["-m", "erm", "--epochs", "4"], ["-m", "fl", "--epochs", "30", "--seed", "0"]):
        assert in_process("run", "two-moons", *args, "--db", url).returncode == 0
    import sqlalchemy as sa

    from flctl.db import normalize_url

    engine = sa.create_engine(normalize_url(url))
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE runs SET status = 'interrupted', epochs_done = 25 WHERE id = :id"),
                         {"id": SEED0})
    finally:
        engine.dispose()
    assert "35 epochs left (1 cell(s) resumed)" in clean(flctl(*plan(), "--db", url))      # 5 + seed 1's 30
    assert "5 epochs left (1 cell(s) resumed)" in clean(flctl("run", "two-moons", "-m", "fl", "--epochs", "30",
                                                              "--seed", "0", "--dry-run", "--db", url))


def test_c65_a_dry_run_through_pgbouncer_makes_no_tables() -> None:
    import sqlalchemy as sa

    from flctl.db import normalize_url
    from tests.test_concurrency import bouncer_database

    url = bouncer_database()
    assert "cost: about" in clean(flctl(*plan(), "--db", url))
    engine = sa.create_engine(normalize_url(url))
    try:
        assert sa.inspect(engine).get_table_names() == []
    finally:
        engine.dispose()


def test_c66_run_dry_run_on_an_older_schema_is_priced_as_sweep_s(damaged) -> None:
    root = damaged("UPDATE flctl_alembic_version SET version_num = '0009';")
    res = flctl("run", "two-moons", "--dry-run", "--results-dir", str(root))
    assert res.returncode == 0 and "cost: about" in res.stdout, (res.stdout, res.stderr)


def test_c70_paper_dry_run_on_an_unreachable_server(tmp_path: Path) -> None:
    one_line_error(flctl("paper", "--dry-run", "--results-dir", str(tmp_path / "r"),
                         "--db", "postgresql://nobody@127.0.0.1:1/none"))
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_c67_dry_runs_beside_a_sweep_that_is_writing(tmp_path: Path) -> None:
    """A real sweep trains and writes its rows (claims, heartbeats, epochs done) while dry runs of the same plan
    price it, five times over: each prints its line; the sweep ends well."""
    root = tmp_path / "r"
    sweep = ["sweep", "two-moons", "-m", "erm", "--seeds", "3", "--epochs", "300", "--results-dir", str(root)]
    live = subprocess.Popen([sys.executable, "-m", "flctl", *sweep, "--workers", "1", "--wait"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        from tests.helpers import wait_until
        wait_until(lambda: (root / "flctl.db").exists(), "the sweep's database", timeout=bound(120))
        for _ in range(5):
            assert "cost: about" in clean(flctl(*sweep, "--dry-run"))
    finally:
        _, err = live.communicate(timeout=300)
    assert live.returncode == 0 and "Traceback" not in err, err


def test_c68_intervals_stay_within_their_bounds_over_a_scattered_history(damaged, reference: Path,
                                                                         tmp_path: Path) -> None:
    import re

    from flctl.cost.model import NARROWEST, WIDEST

    def ratio(line: str) -> float:
        def seconds(text: str) -> float:
            n, unit = re.fullmatch(r"([\d.,]+) (s|min|cpu-hours)", text).groups()
            return float(n.replace(",", "")) * {"s": 1, "min": 60, "cpu-hours": 3600}[unit]
        lo, hi = re.search(r"expected within (.+?) to (.+?)\)", line).groups()
        return seconds(hi) / seconds(lo)
    root = damaged("UPDATE runs SET duration_s = 300 WHERE epochs_done = 4;")       # one run 100x the fit
    fitted = ratio(clean(flctl(*plan(31), "--results-dir", str(root))))
    assert NARROWEST ** 2 * 0.95 <= fitted <= WIDEST ** 2 * 1.05, fitted
    from_file = ratio(clean(flctl_ref(reference, *plan(), "--results-dir", str(tmp_path / "r"))))
    assert from_file == pytest.approx(WIDEST ** 2, rel=0.1)


def test_c69_reproduce_warns_of_numpy_not_of_pyarrow(damaged) -> None:
    root = damaged(f"UPDATE runs SET provenance = json_set(provenance, '$.libraries.pyarrow', '0.0.1', "
                   f"'$.libraries.optuna', '0.0.1', '$.libraries.numpy', '0.0.1') WHERE id = '{SEED0}';")
    res = in_process("reproduce", SEED0, "--results-dir", str(root))
    assert "Traceback" not in res.stderr, res.stderr
    said = [ln for ln in res.stderr.splitlines() if "versions differ" in ln]
    assert len(said) == 1 and "numpy" in said[0] and "pyarrow" not in said[0] and "optuna" not in said[0], res.stderr


def test_c71_a_plan_with_nothing_left_to_do(trained: Path) -> None:
    line = clean(flctl("sweep", "two-moons", "-m", "fl", "--seeds", "1", "--epochs", "30", "--dry-run",
                       "--results-dir", str(trained)))
    assert "0 cell(s)" not in line and "to start" not in line, line


def test_c72_the_seed_note_reaches_python_s_dry_run_plan(tmp_path: Path) -> None:
    plan_ = api.sweep("polyfit", method="erm", seeds=3, dry_run=True, results_dir=tmp_path / "r")
    assert any("ignores the seed: its 3 seeds" in n for n in plan_.spec.notes) and len(plan_.configs) == 3
    assert api.sweep("polyfit", method="erm", seeds=1, dry_run=True, results_dir=tmp_path / "r").spec.notes == ()
    assert not (tmp_path / "r").exists()
