"""Sweep planning: axis syntax, dedup of ignored axes, spec files, dry runs and bad input."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flctl.axes import parse_axis
from flctl.cli import app
from flctl.errors import ConfigError
from flctl.sweep import load_spec, plan, spec_from_values
from tests.helpers import files_under

SWEEPS = Path(__file__).resolve().parents[1] / "sweeps"
runner = CliRunner()


@pytest.mark.notorch
def test_log_range_has_one_point_per_decade_exactly() -> None:
    assert parse_axis("alpha", "1e-4..1") == [1e-4, 1e-3, 1e-2, 1e-1, 1.0]
    assert parse_axis("lr", "1..1e-5") == [1.0, 1e-1, 1e-2, 1e-3, 1e-4, 1e-5]


@pytest.mark.notorch
def test_log_range_with_count_and_lists() -> None:
    nine = parse_axis("alpha", "1e-4..1:9")
    assert len(nine) == 9 and nine[0] == 1e-4 and nine[-1] == 1.0
    assert nine[2] == pytest.approx(1e-3) and nine[1] == pytest.approx(10 ** -3.5)
    assert parse_axis("eps", "0,0.51") == [0.0, 0.51]
    assert parse_axis("method", "erm,fl,rfl,cserm") == ["erm", "fl", "rfl", "cserm"]
    assert parse_axis("seed", "0,1,2") == [0, 1, 2]
    assert parse_axis("alpha", [0.1, "1..10"]) == [0.1, 1.0, 10.0]


@pytest.mark.parametrize("text", ["1e-4..", "a..b", "1..1e-4:0", "0..1", "-1..1", "1..10:x", "1..10:1", "x,1"])
@pytest.mark.notorch
def test_malformed_ranges(text: str) -> None:
    with pytest.raises(ConfigError, match="--alpha"):
        parse_axis("alpha", text)


@pytest.mark.notorch
def test_methods_that_ignore_an_axis_are_not_multiplied_by_it() -> None:
    spec = spec_from_values("two-moons", {"method": "erm,fl,rfl,cserm", "eps": "0,0.5", "alpha": "1e-2..1",
                                          "epochs": "1"}, seeds=2)
    configs = plan(spec)
    by_method: dict[str, int] = {}
    for c in configs:
        by_method[c.method] = by_method.get(c.method, 0) + 1
    # erm: seeds only; fl: eps x seeds; rfl and cserm: eps x alpha x seeds
    assert by_method == {"erm": 2, "fl": 4, "rfl": 12, "cserm": 12}
    assert len({c.run_id for c in configs}) == len(configs)


SPECS = sorted(SWEEPS.glob("*.toml"))


@pytest.mark.notorch
def test_the_papers_specs_are_shipped() -> None:
    assert {p.stem for p in SPECS} >= {"two-moons", "polyfit", "cifar10-main", "cifar10-alpha", "cifar10-lr",
                                       "utkface-main", "utkface-alpha", "utkface-lr", "orca-dpo", "two-moons-nupi",
                                       "digits-nupi", "two-moons-pruning", "utkface-groups"}
    cifar_lr = load_spec(SWEEPS / "cifar10-lr.toml")
    assert cifar_lr.axes["lr"] == (1.0, 0.1, 0.01, 0.001, 0.0001, 1e-05)
    assert cifar_lr.axes["dual_lr"] == (3e-2, 1e-2, 3e-3, 1e-3, 3e-4, 1e-4)


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_every_shipped_spec_parses_and_built_tasks_plan(tmp_path: Path, path: Path) -> None:
    import dataclasses

    from flctl.tasks import all_tasks
    from tests.data_writers import REAL, WRITERS

    spec = load_spec(path)
    if spec.task in REAL:     # planning checks the real data (fashion-mnist): skips where it is not installed
        REAL[spec.task]()
    if spec.task in WRITERS:  # tasks with external data plan against a copy in the real format
        spec = dataclasses.replace(spec, data_dir=str(WRITERS[spec.task](tmp_path / spec.task)))
    if spec.task == "orca-dpo":   # the paper's LLMs are not in this machine's cache: a clear error ...
        with pytest.raises(ConfigError, match="cannot load model 'meta-llama/Llama-3.1-8B-Instruct'"):
            plan(spec)
        # ... and the same grid plans with the tiny model.
        assert len(plan(dataclasses.replace(spec, options={"model": ("tiny",)}))) == 2
    else:
        assert spec.task in all_tasks() and plan(spec)


@pytest.mark.notorch
def test_polyfit_spec_sweeps_a_task_option() -> None:
    configs = plan(load_spec(SWEEPS / "polyfit.toml"))
    assert sorted((c.method, c.opts["degree"]) for c in configs) == [
        ("erm", 10), ("erm", 20), ("erm", 30), ("fl", 10), ("fl", 20), ("fl", 30)]


@pytest.mark.notorch
def test_dry_run_prints_the_plan_and_writes_nothing(results: Path) -> None:
    res = runner.invoke(app, ["sweep", "two-moons", "--method", "fl,rfl", "--alpha", "1e-2..1", "--seeds", "3",
                              "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "12 runs; nothing was written" in res.output
    assert "launch through local: worker processes on this machine" in res.output      # Launcher.describe
    assert files_under(results) == []


def test_seeds_of_a_task_that_ignores_the_seed_are_planned_with_a_note(results: Path, tmp_path: Path) -> None:
    """polyfit's numbers do not depend on the seed (flctl.tasks.Task.seed_free): two seeds solve to the same numbers,
    so a sweep over seeds says in one line that its cells are identical copies; one seed, or a seeded task, no note."""
    from flctl import api

    def note(*args: str) -> list[str]:
        res = runner.invoke(app, ["sweep", *args, "--dry-run"])
        assert res.exit_code == 0, res.output
        return [line for line in res.stdout.splitlines() if "ignores the seed" in line]

    said = note("polyfit", "-m", "erm,fl", "-o", "degree=10,20,30", "--seeds", "3")
    assert said == ["polyfit ignores the seed: its 3 seeds plan 3 identical copies of each cell (its samples are "
                    "drawn by -o data_seed, its solvers deterministic: sweep -o data_seed=0,1,2 for others)"]
    assert note("polyfit", "-m", "erm,fl", "--seeds", "1") == []
    assert note("two-moons", "-m", "erm", "--seeds", "3") == []
    assert files_under(results) == []
    # what the note claims: two seeds, the same numbers
    twice = [api.run("polyfit", "fl", seed=seed, results_dir=tmp_path / "solved").metrics for seed in (0, 1)]
    assert twice[0] == twice[1]


def bad(args: list[str], *needles: str) -> None:
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    for n in needles:
        assert n in lines[0]


@pytest.mark.parametrize("args,needles", [
    (["sweep", "two-moons", "--alpha", "1e-4.."], ["--alpha '1e-4..'"]),
    (["sweep", "two-moons", "--alpha", "a..b"], ["--alpha 'a..b'"]),
    (["sweep", "two-moons", "--alpha", "1..1e-4:0"], ["at least 2 points"]),
    (["sweep", "two-moons", "--seed", ","], ["--seed is empty"]),
    (["sweep", "two-moons", "--method", "fl,sgd"], ["unknown method 'sgd'"]),
    (["sweep", "two-moons", "--eps", "-1"], ["--eps must be"]),
    (["sweep", "two-moons", "--seeds", "0"], ["seeds must be a whole number of seeds in 1..10,000"]),
    (["sweep", "two-moons", "--executor", "pbs"], ["unknown executor 'pbs'", "debug, local, slurm"]),
    (["sweep", "two-moons", "--workers", "0"], ["--workers must be an integer of at least 1"]),
    (["sweep", "two-moons", "--threads", "0"], ["--threads must be an integer of at least 1"]),
    (["sweep", "two-moons", "--per-gpu", "0"], ["--per-gpu must be an integer of at least 1"]),
    (["sweep", "two-moons", "--checkpoint-every", "-1"], ["--checkpoint-every must be"]),
    (["sweep", "two-moons", "--batch-runs", "0"], ["--batch-runs must be an integer of at least 1"]),
    (["cancel", "ffff"], ["no run database"]),
    (["sweep", "--spec", "sweeps/nope.toml"], ["no spec file"]),
    (["sweep"], ["name a task"]),
    (["status", "ffff"], ["no run database"]),
])
@pytest.mark.notorch
def test_bad_sweep_input_is_rejected_with_nothing_written(results: Path, args, needles) -> None:
    bad(args, *needles)
    assert files_under(results) == []


def test_a_sweep_on_cuda_is_refused_on_a_machine_without_it(results: Path, no_cuda: None) -> None:
    bad(["sweep", "two-moons", "--device", "cuda"], "--device cuda", "CUDA is not available")
    assert files_under(results) == []


def test_unknown_spec_keys_and_unknown_sweep(results: Path, tmp_path: Path) -> None:
    spec = tmp_path / "s.toml"
    spec.write_text('task = "two-moons"\nmethod = ["fl"]\nlearning_rate = [0.1]\n')
    bad(["sweep", "--spec", str(spec)], "unknown key(s) learning_rate")
    spec.write_text('task = "two-moons"\n[launch]\nnodes = 3\n')
    bad(["sweep", "--spec", str(spec), "--dry-run"], "unknown [launch] key(s) nodes")
    assert files_under(results) == []
    assert runner.invoke(app, ["run", "polyfit", "-m", "erm"]).exit_code == 0
    bad(["status", "ffff"], "no sweep 'ffff'")


@pytest.mark.notorch
def test_slurm_without_slurm_commands(results: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    bad(["sweep", "two-moons", "--executor", "slurm"], "--executor slurm needs Slurm's commands")
    assert files_under(results) == []


def test_debug_executor_fills_the_grid_and_a_rerun_adds_nothing(results: Path) -> None:
    args = ["sweep", "polyfit", "--method", "erm,fl", "-o", "degree=10,20", "--executor", "debug"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "4 cells, 4 new" in first.output
    ledger = json.loads(runner.invoke(app, ["status", "--json"]).stdout)
    assert ledger["total"]["completed"] == 4 and ledger["cells"] == 4
    again = runner.invoke(app, args)
    assert "0 new, 4 completed" in again.output and "0 to do" in again.output and "through" not in again.output
    sweeps = json.loads(runner.invoke(app, ["sweeps", "--json"]).stdout)
    assert [(s["cells"], s["completed"], s["submissions"]) for s in sweeps] == [(4, 4, 1)]


def test_grid_sweep_is_mirrored_as_an_optuna_study(results: Path) -> None:
    import optuna

    res = runner.invoke(app, ["sweep", "polyfit", "-m", "erm,fl", "-o", "degree=10,30", "--executor", "debug",
                              "--objective", "test.max_loss"])
    assert res.exit_code == 0, res.output
    # Every connection the sweep and its in-process worker opened, the study's included, is closed when it returns:
    # SQLite removes its -wal file with the last one (the Python API and the debug executor live on after a sweep).
    assert not (results / "flctl.db-wal").exists()
    [summary] = optuna.get_all_study_summaries(f"sqlite:///{results / 'flctl.db'}")
    study = optuna.load_study(study_name=summary.study_name, storage=f"sqlite:///{results / 'flctl.db'}")
    trials = study.get_trials()
    assert len(trials) == 4 and all({"method", "opt.degree"} <= set(t.params) for t in trials)
    assert {(t.params["method"], t.params["opt.degree"]) for t in trials} == {("erm", 10), ("erm", 30), ("fl", 10),
                                                                             ("fl", 30)}
    runs = {r["id"]: r for r in json.loads(runner.invoke(app, ["runs", "--json"]).stdout)}
    for t in trials:
        run = runs[t.user_attrs["run_id"]]
        assert t.value == run["metrics"]["test.max_loss"]
        # The run's own end and training time, not the moment the study was synced (Optuna keeps naive local time).
        finished = datetime.fromisoformat(run["finished_at"])
        assert t.datetime_complete.astimezone(UTC) == finished.replace(tzinfo=finished.tzinfo or UTC)
        assert (t.datetime_complete - t.datetime_start).total_seconds() == pytest.approx(run["duration_s"], abs=1e-5)
    runner.invoke(app, ["sweep", "polyfit", "-m", "erm,fl", "-o", "degree=10,30", "--executor", "debug",
                        "--objective", "test.max_loss"])          # syncing again adds no duplicate trial
    assert len(study.get_trials()) == 4


def test_tune_runs_n_tpe_trials_over_a_log_range(results: Path) -> None:
    import optuna

    res = runner.invoke(app, ["sweep", "diabetes", "-m", "rfl", "--alpha", "1e-3..10", "--epochs", "2",
                              "--tune", "3", "--objective", "test.max_loss", "--executor", "debug"])
    assert res.exit_code == 0, res.output
    assert "best test.max_loss" in res.output
    (name,) = optuna.get_all_study_names(storage=f"sqlite:///{results / 'flctl.db'}")
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{results / 'flctl.db'}")
    trials = study.get_trials()
    assert len(trials) == 3 and all(1e-3 <= t.params["alpha"] <= 10 for t in trials)
    assert len(json.loads(runner.invoke(app, ["runs", "--json"]).stdout)) == 3
    bad(["sweep", "diabetes", "--tune", "2", "--objective", "test.loss"], "unknown objective 'test.loss'")


def test_a_tune_dry_run_names_the_search_that_runs_and_writes_nothing(results: Path) -> None:
    import optuna

    args = ["sweep", "diabetes", "-m", "rfl", "--alpha", "1e-3..10", "--lr", "1e-3,1e-2", "--epochs", "1", "--tune",
            "2", "--objective", "test.max_loss", "--executor", "debug"]
    plan = runner.invoke(app, [*args, "--dry-run"])
    assert plan.exit_code == 0 and files_under(results) == [], plan.output
    assert "TPE search, 2 trials of diabetes for the min of test.max_loss over lr in {0.001, 0.01}; alpha in " \
           "0.001..10 (log); nothing was written" in " ".join(plan.output.split())
    assert runner.invoke(app, args).exit_code == 0
    (name,) = optuna.get_all_study_names(storage=f"sqlite:///{results / 'flctl.db'}")
    assert f"sweep {name.removeprefix('flctl-')} (dry run)" in plan.output


def test_tune_stops_at_its_first_trial_when_the_runs_never_record_the_objective(results: Path) -> None:
    """A regression task records no accuracy: the search stops after one trial with the metrics it does record,
    not after training every trial for a study with no best (it once ended in Optuna's 'Record does not exist')."""
    res = runner.invoke(app, ["sweep", "diabetes", "-m", "rfl", "--alpha", "1e-3..10", "--epochs", "2",
                              "--tune", "4", "--objective", "test.accuracy", "--executor", "debug"])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert "finished without 'test.accuracy'" in res.output and "test.max_loss" in res.output
    assert len(json.loads(runner.invoke(app, ["runs", "--json"]).stdout)) == 1
    # where a searched axis decides whether the metric exists (ERM has no multipliers, FL has), the search goes on
    res = runner.invoke(app, ["sweep", "two-moons", "-m", "erm,fl", "--epochs", "2", "--tune", "4", "--objective",
                              "train.max_multiplier", "--executor", "debug"])
    assert res.exit_code == 0 and "method=erm → completed" in res.output and "best train.max_multiplier" in res.output


def test_debug_worker_trains_batched_cells_together_and_records_each(results: Path) -> None:
    from flctl import records

    args = ["sweep", "two-moons", "-m", "erm,fl,rfl", "--alpha", "0.5", "--seed", "0,1", "--epochs", "4",
            "--eval-every", "2", "--executor", "debug", "--batch-runs", "6"]
    out = runner.invoke(app, args)
    assert out.exit_code == 0, out.output
    runs = json.loads(runner.invoke(app, ["runs", "--json"]).stdout)
    assert sorted(r["status"] for r in runs) == ["completed"] * 6 and all(r["attempts"] == 1 for r in runs)
    for r in runs:   # each cell its own records: two eval epochs of 1000 train + 1000 test samples
        assert len(records.read(results / "records", [r["id"]])) == 2 * 2000


@pytest.mark.notorch
def test_dry_run_plans_without_the_dataset(results: Path, tmp_path: Path) -> None:
    # Planning a cluster sweep on a machine without CIFAR-10: the plan prints; a real launch checks the data.
    args = ["sweep", "cifar10", "-m", "erm,fl", "--seeds", "2", "--data-dir", str(tmp_path / "nowhere")]
    plan = runner.invoke(app, [*args, "--dry-run"])
    assert plan.exit_code == 0, plan.output
    assert "4 runs; nothing was written" in plan.output
    bad(args, "cifar")
    assert files_under(results) == []


@pytest.mark.notorch
def test_a_shipped_spec_is_found_from_any_folder_and_a_local_file_comes_first(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)                      # the README's `--spec sweeps/...`, away from the checkout
    shipped = load_spec(Path("sweeps/two-moons.toml"))
    assert shipped.task == "two-moons" and load_spec(Path("two-moons")) == shipped
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "sweeps" / "two-moons.toml").write_text('task = "digits"\nmethod = ["erm"]\n')
    assert load_spec(Path("sweeps/two-moons.toml")).task == "digits"
    bad(["sweep", "--spec", "nope.toml", "--dry-run"], "no spec file 'nope.toml' here or among the shipped specs")
    # a path of the user's own is theirs: a typo in it does not load the shipped spec of the same name
    bad(["sweep", "--spec", "my/experiments/two-moons.toml", "--dry-run"], "no spec file 'my/experiments/two-moons.toml'")


@pytest.mark.notorch
def test_a_gpu_sweep_and_programme_are_planned_on_a_machine_without_one(results: Path) -> None:
    """A dry run only plans: `--device cuda` is checked by name, not against this machine (the README plans a
    cluster's CIFAR-10 sweep from a laptop); the same sweep launched here is still refused."""
    for args in (["sweep", "cifar10", "-m", "fl", "--device", "cuda", "--per-gpu", "2", "--dry-run"],
                 ["paper", "--dry-run", "--device", "cuda", "--only", "table:1"]):
        res = runner.invoke(app, args)
        assert res.exit_code == 0 and "nothing was written" in res.output, res.output
    bad(["sweep", "cifar10", "-m", "fl", "--device", "cuda:x", "--dry-run"], "unknown device 'cuda:x'")
    assert not results.exists()


def test_a_piped_watch_logs_a_line_per_change_then_the_ledger(results: Path) -> None:
    """Piped or logged, `status --watch` writes a timestamped line of counts whenever they change (a log cut short
    still says how far the sweep got), then the final ledger: not a redraw per poll, and not silence until the end."""
    assert runner.invoke(app, ["sweep", "two-moons", "-m", "fl", "--seeds", "2", "--epochs", "2",
                               "--executor", "debug"]).exit_code == 0
    out = runner.invoke(app, ["status", "--watch"])
    assert out.exit_code == 0, out.output
    said, *lines = out.output.splitlines()
    assert said == "the only sweep in the database:"        # none named: it says which it watches
    assert re.fullmatch(r"\d\d:\d\d:\d\d sweep [0-9a-f]{12}: completed 2", lines[0]), lines[0]
    assert "completed" in lines[3] and lines[-2].split("│")[1].strip() == "all"
