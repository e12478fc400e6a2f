"""flctl.api.sweep and flctl.api.paper do what `flctl sweep` and `flctl paper` do, under the same rules: the same
sweep ids and cells, re-running fills only what is missing, bad input raises ConfigError with nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from flctl import api
from flctl.errors import ConfigError
from flctl.status import Status
from tests.helpers import files_under, in_process


def test_api_sweep_fills_a_grid_and_is_the_cli_sweep(tmp_path: Path) -> None:
    results = tmp_path / "results"
    plan = api.sweep("two-moons", method="fl", lr=[1e-3, 2e-3], seeds=2, epochs=2, results_dir=results,
                     launch={"executor": "debug"}, dry_run=True)
    assert len(plan.configs) == 4 and not files_under(tmp_path)           # a plan, written nowhere
    done = api.sweep("two-moons", method="fl", lr=[1e-3, 2e-3], seeds=2, epochs=2, results_dir=results,
                     launch={"executor": "debug"})
    assert done["sweep"] == plan.sweep_id and {r.id for r in api.runs(results_dir=results)} == {
        c.run_id for c in plan.configs}
    assert done["cells"] == 4 and done["total"][Status.COMPLETED] == 4
    assert {r.status for r in api.runs(results_dir=results)} == {Status.COMPLETED}
    # the command line's spelling of the same grid is the same sweep: nothing left to do
    res = in_process("sweep", "two-moons", "-m", "fl", "--lr", "1e-3,2e-3", "--seeds", "2", "--epochs", "2",
                     "--executor", "debug", "--results-dir", str(results))
    assert res.returncode == 0, res.stderr
    assert f"sweep {done['sweep']}" in res.stdout and "4 completed" in res.stdout and "0 to do" in res.stdout
    again = api.sweep("two-moons", method="fl", lr="1e-3,2e-3", seeds=2, epochs=2, results_dir=results,
                      launch={"executor": "debug"})
    assert again["sweep"] == done["sweep"] and again["total"][Status.COMPLETED] == 4


def test_a_study_a_background_worker_fills_has_the_direction_asked_for(tmp_path: Path) -> None:
    """--direction max with a worker in the background: the launch makes the study before any worker can (a worker
    that made it gave Optuna's default, and best_trial was the worst cell)."""
    import optuna

    results = tmp_path / "results"
    done = api.sweep("two-moons", method="fl", lr=[1e-3, 3e-1], seeds=2, epochs=1, results_dir=results,
                     objective="test.accuracy", direction="max", launch={"workers": 2, "batch_runs": 1})
    assert done["total"][Status.COMPLETED] == 4
    study = optuna.load_study(study_name=f"flctl-{done['sweep']}", storage=f"sqlite:///{results / 'flctl.db'}")
    assert study.direction == optuna.study.StudyDirection.MAXIMIZE and len(study.trials) == 4
    best = max(api.runs(results_dir=results), key=lambda r: r.metrics["test.accuracy"])
    assert study.best_value == best.metrics["test.accuracy"]


@pytest.mark.parametrize("call,message", [
    (dict(method="fl", lr=[1e-3], launch={"executr": "debug"}), r"^unknown \[launch\] key\(s\) executr; valid: "),
    (dict(method="nope"), r"unknown method 'nope'"),
    (dict(method="fl", launch={"executor": "nosuch"}), r"^unknown executor 'nosuch'"),
    (dict(method="fl", launch={"partition": "gpu"}), r"^--partition is not an option of --executor local$"),
])
def test_api_sweep_refuses_bad_input_writing_nothing(tmp_path: Path, call: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        api.sweep("two-moons", epochs=2, results_dir=tmp_path / "results", **call)
    assert not files_under(tmp_path)


def test_api_paper_plans_fills_and_bundles_as_flctl_paper(tmp_path: Path) -> None:
    results = tmp_path / "results"
    plan = api.paper(only="figure:1", scale="smoke", results_dir=results, dry_run=True)
    [item] = plan.programme.items
    assert item.item.ref == "figure:1" and len(item.to_do) == len(item.cells) > 0
    assert not results.exists()                                         # a dry run writes nothing
    done = api.paper(only="figure:1", scale="smoke", results_dir=results, launch={"executor": "debug"})
    assert done.launched == 1 and done.bundle == results / "paper-smoke" / "index.html" and done.bundle.is_file()
    figure = next(p for p in done.programme.items if p.item.ref == "figure:1")
    assert len(figure.finished) == len(figure.cells) and not figure.to_do
    with pytest.raises(ConfigError, match=r"^unknown scale 'huge'; choose one of: paper, smoke$"):
        api.paper(scale="huge", results_dir=tmp_path / "other")
    assert not (tmp_path / "other").exists()


def test_api_sweep_plans_a_tune_search_under_the_id_it_runs_as(tmp_path: Path) -> None:
    results = tmp_path / "results"
    args = dict(method="rfl", alpha="1e-3..10", epochs=1, tune=2, objective="test.max_loss", results_dir=results,
                launch={"executor": "debug"})
    plan = api.sweep("diabetes", dry_run=True, **args)
    assert plan.sweep_id.startswith("t") and not files_under(tmp_path)
    assert api.sweep("diabetes", **args)["sweep"] == plan.sweep_id


SWEEP = dict(epochs=1, launch={"executor": "debug"})


@pytest.mark.parametrize("call,error,message", [
    (lambda r, f: api.sweep(5, results_dir=r, **SWEEP), ConfigError, r"^task=5: give one task's name, a str"),
    (lambda r, f: api.sweep(["two-moons"], results_dir=r, **SWEEP), ConfigError, r"^task=\['two-moons'\]: give one"),
    (lambda r, f: api.sweep("two-moons", options=[1], results_dir=r, **SWEEP), ConfigError,
     r"^options=\[1\]: give the task options as a dict"),
    (lambda r, f: api.sweep("two-moons", epochs=1, launch=["debug"], results_dir=r), ConfigError,
     r"^launch=\['debug'\]: give the launch flags as a dict by name"),
    (lambda r, f: api.paper(launch=["executor"], results_dir=r), ConfigError, r"^launch=\['executor'\]: give the"),
    (lambda r, f: api.sweep(spec=5, results_dir=r), ConfigError, r"^spec=5: give a sweep spec's TOML file"),
    (lambda r, f: api.sweep("two-moons", lr="1e-4..1e-2", tune="3", objective="test.max_loss", results_dir=r,
                            **SWEEP), ConfigError, r"^tune='3': give the number of trials"),
    (lambda r, f: api.sweep("two-moons", tune=True, results_dir=r, **SWEEP), ConfigError, r"^tune=True: give the"),
    (lambda r, f: api.sweep("two-moons", name=5, results_dir=r, **SWEEP), ConfigError, r"^name=5: give the sweep"),
    (lambda r, f: api.run("two-moons", "fl", epochs=1, device=0, results_dir=r), ConfigError,
     r"^device=0: give a device's name, a str"),
    (lambda r, f: api.sweep("two-moons", device=0, results_dir=r, **SWEEP), ConfigError, r"^device=0: give a device"),
    (lambda r, f: api.paper(only=1, results_dir=r), ConfigError, r"^only=1: give the tables and figures as one str"),
    (lambda r, f: api.paper(only=["table:1"], results_dir=r), ConfigError, r"^only=\['table:1'\]: give the tables"),
    (lambda r, f: api.paper(specs=3, results_dir=r), ConfigError, r"^specs=3: give the folder of the paper's specs"),
    (lambda r, f: api.paper(out=3, only="figure:1", scale="smoke", results_dir=r), ConfigError,
     r"^out=3: give the bundle's folder"),
    (lambda r, f: api.paper(report_only=True, only="figure:1", scale="smoke", results_dir=f), ConfigError,
     r"^results_dir '.*file' is a file, not a folder; give a folder$"),
    (lambda r, f: api.paper(report_only=True, only="figure:1", scale="smoke", out=f / "o", results_dir=r),
     ConfigError, r"^--out '.*o' lies under '.*file', which is a file$"),
    (lambda r, f: api.sweep("two-moons", db="bogus://x", results_dir=r.parent / "deep" / "results", **SWEEP),
     ConfigError, r"^'bogus://x' is not a database URL flctl can open: SQLAlchemy has no engine 'bogus'"),
    (lambda r, f: api.open_store(r, "bogus://x"), ConfigError, r"^'bogus://x' is not a database URL flctl can open"),
], ids=["sweep-int-task", "sweep-list-task", "sweep-list-options", "sweep-list-launch", "paper-list-launch",
        "sweep-int-spec", "sweep-str-tune", "sweep-bool-tune", "sweep-int-name", "run-int-device",
        "sweep-int-device", "paper-int-only", "paper-list-only", "paper-int-specs", "paper-int-out",
        "paper-report-only-results-a-file", "paper-report-only-out-under-a-file", "sweep-bad-db",
        "open-store-bad-db"])
def test_api_refuses_arguments_of_the_wrong_kind_writing_nothing(tmp_path: Path, call, error: type,
                                                                  message: str) -> None:
    """A wrong argument raises a flctl error naming it (no AttributeError or TypeError from deep inside, no device=0
    read as cpu) before any results folder or database is made; a database that cannot be opened takes back the
    folders made for it."""
    file = tmp_path / "file"
    file.write_text("")
    with pytest.raises(error, match=message):
        call(tmp_path / "results", file)
    assert [p.name for p in tmp_path.rglob("*")] == ["file"]


def test_api_report_makes_what_flctl_report_makes(tmp_path: Path) -> None:
    """api.report: the table flctl report prints (the same text, the table's rows as values), a figure's two files
    named as the command names them, a per-sample query's frame (the Parquet it wrote); bad input and no database
    are a ConfigError with nothing written."""
    import pyarrow.parquet as pq

    root = tmp_path / "results"
    for method in ("erm", "fl"):
        api.run("two-moons", method, epochs=3, results_dir=root)
    made = api.report(table="main", task="two-moons", fmt="csv", results_dir=root)
    cli = in_process("report", "--table", "main", "--task", "two-moons", "--format", "csv", "--results-dir", str(root))
    assert cli.returncode == 0 and made.text == cli.stdout
    assert made.table.title == "Final performance (two-moons)" and [k[0] for k, _ in made.table.rows] == ["ERM", "FL"]
    drawn = api.report(plot="cdf", results_dir=root)
    assert [p.name for p in drawn.files] == ["cdf-two-moons.png", "cdf-two-moons.pdf"] and all(
        p.is_file() for p in drawn.files)
    query = api.report(samples="violators", results_dir=root)
    assert query.frame.equals(pq.read_table(query.files[0]))
    before = sorted(files_under(tmp_path))
    with pytest.raises(ConfigError, match="unknown table 'nope'"):
        api.report(table="nope", results_dir=root)
    with pytest.raises(ConfigError, match="columns=.*give a list"):
        api.report(table="main", columns="train.avg_loss", results_dir=root)
    with pytest.raises(ConfigError, match="holds no flctl.db"):
        api.report(table="main", results_dir=tmp_path / "none")
    assert sorted(files_under(tmp_path)) == before
