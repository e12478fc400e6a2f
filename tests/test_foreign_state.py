"""State from elsewhere, and inputs read two ways: a database a newer flctl stamped, damaged cost data and rows, an
empty database to migrate, a SQLite URL that asks for read-only, an unreachable server, a key given twice, a method
name in upper case, a sweep name that is another sweep's id prefix, and bad input met after `flctl paper` trained.
Each is what a user met (issue 69's campaign); each test failed on the code before its fix."""

from __future__ import annotations

import json
import socket
import sqlite3
from pathlib import Path

import pytest

import flctl.text
from flctl.cost import reference as cost_figures
from flctl.db import RunQueue, Store
from tests.helpers import config, files_under, in_process
from tests.test_concurrency import pg_database


def one_line(res, code: int, *needles: str) -> str:
    """The command's single stderr line, after it exited ``code``, holding each of ``needles``."""
    lines = res.stderr.strip().splitlines()
    assert res.returncode == code and len(lines) == 1, (res.returncode, res.stdout, res.stderr)
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def completed(url: str, *configs) -> None:
    """Record ``configs`` as completed runs (1 epoch in 2 s), as a worker finishes them, without training."""
    store = Store.open(url)
    store.add_runs(configs)
    queue = RunQueue(store)
    for cfg in configs:
        token = queue.claim_run(cfg.run_id)
        assert token is not None
        queue.finish_run(cfg.run_id, token, status="completed", epochs_done=1, duration_s=2.0, artifacts={},
                         diverged_at=None, lambda_capped=0,
                         metrics={"train.avg_loss": 0.5})
    store.close()


# ---------------------------------------------------------------- a database a newer flctl stamped

def test_a_newer_database_is_refused_by_every_command_dry_runs_too(tmp_path: Path) -> None:
    db = tmp_path / "results" / "flctl.db"
    db.parent.mkdir()
    cfg = config("two-moons", "erm", epochs=1)
    completed(f"sqlite:///{db}", cfg)
    with sqlite3.connect(db) as conn:               # what `flctl migrate` of a newer flctl leaves
        conn.execute("UPDATE flctl_alembic_version SET version_num = '0099'")
    before = db.read_bytes()
    for args in (["sweep", "two-moons", "-m", "erm", "--epochs", "1", "--dry-run"],
                 ["sweep", "two-moons", "--lr", "0.01..0.1", "--tune", "2", "--epochs", "1", "--dry-run"],
                 ["run", "two-moons", "-m", "erm", "--epochs", "1", "--dry-run"],
                 ["paper", "--scale", "smoke", "--only", "figure:3", "--dry-run"],
                 ["run", "two-moons", "-m", "erm", "--epochs", "1"], ["runs"], ["status"], ["migrate"]):
        res = in_process(*args)
        one_line(res, 2, "newer than this flctl", "upgrade flctl")
        assert "not trained yet" not in res.stdout and "cost:" not in res.stdout, res.stdout
    assert db.read_bytes() == before


def test_a_dry_run_of_an_older_database_does_not_say_not_trained(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "results" / "flctl.db"
    db.parent.mkdir()
    completed(f"sqlite:///{db}", config("two-moons", "erm", epochs=1))
    with sqlite3.connect(db) as conn:               # one revision behind: the real command upgrades it first
        conn.execute("UPDATE flctl_alembic_version SET version_num = '0009'")
    run = in_process("run", "two-moons", "-m", "erm", "--epochs", "1", "--dry-run")
    assert run.returncode == 0 and "not trained yet" not in run.stdout and "older flctl" in run.stdout, run.stdout
    assert "cost: about " in run.stdout, run.stdout          # priced from the committed benchmark, as sweep's is
    monkeypatch.setattr(flctl.text, "_MET", set())      # said once per process: the run's dry run said it here
    sweep = in_process("sweep", "two-moons", "-m", "erm", "--epochs", "1", "--dry-run")
    one_line(sweep, 0, "warning", "older flctl")
    assert "cost:" in sweep.stdout


# ---------------------------------------------------------------- damaged cost data and rows

def test_a_text_duration_in_the_runs_table_is_left_out_of_the_estimate_with_one_warning(tmp_path: Path) -> None:
    db = tmp_path / "results" / "flctl.db"
    db.parent.mkdir()
    completed(f"sqlite:///{db}", config("two-moons", "erm", epochs=1), config("two-moons", "fl", epochs=1))
    with sqlite3.connect(db) as conn:       # SQLite keeps text in a REAL column: a hand edit, another tool's write
        conn.execute("UPDATE runs SET duration_s = 'abc', device = 'cpu'")
    res = in_process("sweep", "two-moons", "-m", "erm", "--epochs", "2", "--dry-run")
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    warning = one_line(res, 0, "warning", "not a number", "duration_s='abc'")
    assert "2 finished run(s)" in warning
    assert "cost:" in res.stdout and "finished two-moons runs" not in res.stdout.replace("no finished", "")


def test_damaged_committed_cost_data_reads_as_unknown_with_one_warning(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    figures = json.loads((cost_figures.REFERENCE / "task-costs-2026-11-28-cpu.json").read_text())
    figures["tasks"]["two-moons"]["s_per_epoch"] = "fast"          # a hand edit, a merge gone wrong
    folder = tmp_path / "benchmarks"
    folder.mkdir()
    (folder / "task-costs-2026-11-28-cpu.json").write_text(json.dumps(figures))
    monkeypatch.setattr(cost_figures, "REFERENCE", folder)
    monkeypatch.setattr(flctl.text, "_MET", set())      # said once per process: this process may have said it
    res = in_process("sweep", "two-moons", "-m", "erm", "--epochs", "2", "--dry-run")
    one_line(res, 0, "warning", "task-costs-2026-11-28-cpu.json", "s_per_epoch = 'fast'")
    assert "cost: unknown" in res.stdout, res.stdout

    (folder / "task-costs-2026-11-28-cpu.json").write_text('{"tasks": {"two-moons": ')      # cut short
    monkeypatch.setattr(flctl.text, "_MET", set())      # said once per process: this process may have said it
    res = in_process("sweep", "two-moons", "-m", "erm", "--epochs", "2", "--dry-run")
    one_line(res, 0, "warning", "cannot be read")
    assert "cost: unknown" in res.stdout, res.stdout


# ---------------------------------------------------------------- migrate, URLs, servers

@pytest.mark.notorch
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_migrate_makes_an_empty_databases_tables(tmp_path: Path, backend: str) -> None:
    if backend == "sqlite":
        (tmp_path / "empty.db").touch()
        url = f"sqlite:///{tmp_path / 'empty.db'}"
    else:
        url = pg_database()         # as an operator's administrator makes it: no tables
    res = in_process("migrate", "--db", url)
    assert res.returncode == 0 and "made the empty database's tables" in res.stdout, res.stdout + res.stderr
    assert "no runs yet" in in_process("runs", "--db", url).stdout
    assert "up to date" in in_process("migrate", "--db", url).stdout


@pytest.mark.notorch
def test_a_sqlite_url_asking_for_read_only_is_honoured_and_a_refused_url_leaves_nothing(tmp_path: Path) -> None:
    db = tmp_path / "flctl.db"
    completed(f"sqlite:///{db}", config("two-moons", "erm", epochs=1))
    before = {p: p.read_bytes() for p in tmp_path.iterdir()}
    ro = f"sqlite:///{db}?mode=ro"
    assert "1 run(s)" in in_process("runs", "--db", ro).stdout            # a read reads it
    one_line(in_process("run", "two-moons", "--epochs", "1", "--db", ro), 2, "read-only", "mode=ro")   # a write: refused
    assert {p: p.read_bytes() for p in tmp_path.iterdir()} == before

    fresh = tmp_path / "new"
    fresh.mkdir()
    for url in (f"sqlite:///{fresh / 'a.db'}?mode=ro", f"sqlite:///{fresh / 'b.db'}?cache=bogus"):
        res = in_process("sweep", "two-moons", "--epochs", "1", "--db", url, "--results-dir", str(tmp_path / "r"))
        one_line(res, 2)
    assert files_under(fresh) == [] and not (tmp_path / "r").exists()


@pytest.mark.notorch
def test_a_dry_run_against_an_unreachable_server_says_so(tmp_path: Path) -> None:
    with socket.socket() as s:            # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgresql://flctl:secret@127.0.0.1:{port}/flctl"
    for args in (["run", "two-moons", "--epochs", "1", "--dry-run"], ["sweep", "two-moons", "--epochs", "1",
                                                                       "--dry-run"]):
        res = in_process(*args, "--db", url)
        line = one_line(res, 2, "cannot reach database", f"127.0.0.1:{port}", "server is running")
        assert "secret" not in line and "not trained yet" not in res.stdout and res.stdout == "", res.stdout


# ---------------------------------------------------------------- inputs read two ways

@pytest.mark.notorch
def test_a_key_given_twice_is_refused_unless_both_are_equal() -> None:
    one_line(in_process("run", "two-moons", "-o", "n_train=100", "-o", "n_train=200", "--dry-run"), 2,
             "n_train", "twice", "'100'", "'200'")
    same = in_process("run", "two-moons", "-o", "n_train=100", "-o", "n_train=100", "--dry-run")
    assert same.returncode == 0 and "'n_train': 100" in same.stdout, same.stdout + same.stderr


def test_a_method_name_in_upper_case_is_read_alike_by_every_reader(tmp_path: Path) -> None:
    from flctl import api

    url = f"sqlite:///{tmp_path / 'results' / 'flctl.db'}"
    (tmp_path / "results").mkdir()
    completed(url, config("two-moons", "fl", epochs=1))
    listed = in_process("runs", "--method", "FL", "--json")
    assert listed.returncode == 0 and len(json.loads(listed.stdout)) == 1, listed.stderr
    assert len(api.runs(method="FL")) == 1
    # report --methods reads it as -m does: the refusal, if any, is about the runs, never the name
    diff = in_process("report", "--samples", "diff", "--methods", "ERM,FL")
    assert "no such method" not in diff.stderr and "no completed erm runs" in diff.stderr, diff.stderr
    assert "run " in in_process("run", "two-moons", "-m", "FL", "--epochs", "1", "--dry-run").stdout


@pytest.mark.notorch
def test_a_sweep_name_that_is_another_sweeps_id_prefix_is_ambiguous(tmp_path: Path) -> None:
    (tmp_path / "results").mkdir()
    store = Store.open(f"sqlite:///{tmp_path / 'results' / 'flctl.db'}")
    first = config("two-moons", "erm", epochs=1)
    store.create_sweep("5d84f0bfa7d9", None, "two-moons", {}, [first])
    store.create_sweep("1d3ee114aa50", "5d84f", "two-moons", {}, [config("two-moons", "fl", epochs=1)])
    store.close()
    one_line(in_process("status", "5d84f"), 2, "name of sweep 1d3ee114aa50", "5d84f0bfa7d9")
    assert "1d3ee114aa50" in in_process("status", "1d3ee114aa50").stdout       # the full id still names it
    assert in_process("status", "5d84f0").returncode == 0                        # so does a longer prefix


# ---------------------------------------------------------------- bad input after something was written

def test_paper_with_a_folder_of_some_specs_bundles_what_it_trained(tmp_path: Path) -> None:
    from flctl.sweep import SHIPPED_SPECS

    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "two-moons.toml").write_text((SHIPPED_SPECS / "two-moons.toml").read_text())
    root = tmp_path / "r"
    res = in_process("paper", "--scale", "smoke", "--only", "figure:3", "--specs", str(specs), "--executor", "debug",
                     "--results-dir", str(root))
    assert res.returncode == 0 and (root / "paper-smoke" / "paper.json").is_file(), res.stdout[-2000:] + res.stderr


def test_bad_input_met_after_paper_trained_is_exit_1_not_nothing_written(tmp_path: Path) -> None:
    from flctl.errors import PartlyDone
    from flctl.launch.settings import LaunchFlags
    from flctl.paper.flow import Hooks, fill_paper, plan_paper
    from flctl.results import API, find

    root, out = tmp_path / "r", tmp_path / "bundle"
    url = f"sqlite:///{root / 'flctl.db'}"
    plan = plan_paper(url=url, specs=Path(__file__).parents[1] / "sweeps", launch=LaunchFlags(executor="debug"),
                      only="figure:3", scale="smoke")

    def launched(*_: object) -> None:       # meanwhile another user's file lands in the bundle's folder
        out.mkdir(exist_ok=True)
        (out / "notes.txt").write_text("mine")

    root.mkdir()
    Store.open(url).close()
    with pytest.raises(PartlyDone, match=r"bundle|paper\.json|notes|empty") as caught:
        fill_paper(plan, find(root, url, API), out=out, hooks=Hooks(launched=launched))
    assert caught.value.exit_code == 1 and "flctl paper` again resumes" in str(caught.value)
    store = Store.open(url, readonly=True)
    assert [r.status for r in store.list_runs()] == ["completed"]          # what trained stays recorded
    store.close()
