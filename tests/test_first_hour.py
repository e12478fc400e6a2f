"""A new user's first hour: the conventions a first session reaches for (--version, `run --dry-run`, FL as the
paper writes it, an option's values when it is given none) and reports that say what they are of."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flctl import api
from flctl.cli import app
from flctl.report.table_specs import TABLE_SPECS

runner = CliRunner()


def _errors(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error:")]


@pytest.mark.notorch
def test_version_is_one_line_and_exits_0() -> None:
    import importlib.metadata

    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0, res.output
    assert re.fullmatch(rf"flctl {re.escape(importlib.metadata.version('flctl'))}( \(commit [0-9a-f]{{12}}\))?\n",
                        res.stdout), res.stdout


def test_run_dry_run_shows_the_run_and_writes_nothing(tmp_path: Path) -> None:
    results = tmp_path / "results"
    res = runner.invoke(app, ["run", "two-moons", "--method", "FL", "--eps", "0.1", "--dry-run",
                              "--results-dir", str(results)])
    assert res.exit_code == 0, res.output
    cfg = api.config("two-moons", "fl", eps=0.1)
    assert res.stdout.splitlines()[0] == f"run {cfg.run_id}: two-moons · fl"
    assert "not trained yet; nothing was written" in res.stdout
    assert not tmp_path.joinpath("results").exists()
    # once trained, the dry run says where it stands, and still writes nothing
    assert runner.invoke(app, ["run", "two-moons", "--eps", "0.1", "--epochs", "2", "--results-dir",
                               str(results)]).exit_code == 0
    before = sorted(p.relative_to(results) for p in results.rglob("*"))
    res = runner.invoke(app, ["run", "two-moons", "--eps", "0.1", "--epochs", "2", "--dry-run", "--results-dir",
                              str(results)])
    assert res.exit_code == 0, res.output
    assert "completed in the database (2 epoch(s) done)" in res.stdout
    assert sorted(p.relative_to(results) for p in results.rglob("*")) == before


@pytest.mark.notorch
@pytest.mark.parametrize("written", ["FL", "Rfl", "ERM"])
def test_a_method_is_its_name_whatever_its_case(written: str) -> None:
    assert api.config("two-moons", written).method == written.lower()
    assert api.config("two-moons", written).run_id == api.config("two-moons", written.lower()).run_id


@pytest.mark.notorch
@pytest.mark.parametrize(("args", "values"), [(["report", "--table"], list(TABLE_SPECS)),
                                              (["report", "--format"], ["rich", "markdown", "latex", "csv"]),
                                              (["sweep", "two-moons", "-m"], ["erm", "fl", "rfl", "cserm"])])
def test_an_option_given_no_value_lists_its_values(args: list[str], values: list[str]) -> None:
    res = runner.invoke(app, args)
    assert res.exit_code == 2
    [line] = _errors(res.output)
    assert line.startswith(f"error: Option '{args[-1]}' requires an argument; give one of: {', '.join(values)}"), line


def test_a_report_says_what_it_is_of_and_its_figure_is_named_for_it(tmp_path: Path) -> None:
    results = tmp_path / "results"
    for method in ("erm", "fl"):
        assert runner.invoke(app, ["run", "two-moons", "-m", method, "--epochs", "2", "--eval-every", "1",
                                   "--results-dir", str(results)]).exit_code == 0
    res = runner.invoke(app, ["report", "--table", "main", "--format", "markdown", "--results-dir", str(results)])
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[0].endswith("(two-moons)**"), res.stdout
    res = runner.invoke(app, ["report", "--plot", "cdf", "--results-dir", str(results)])
    assert res.exit_code == 0, res.output
    assert (results / "reports" / "cdf-two-moons.png").is_file() and not (results / "reports" / "cdf.png").exists()


def test_unique_prefix_is_at_least_8_and_as_long_as_a_shared_prefix_needs() -> None:
    from flctl.cli.runs import unique_prefix

    every = ["0123456789abcdef", "0123456789abffff", "fedcba9876543210"]
    assert unique_prefix(["fedcba9876543210"], every) == 8
    assert unique_prefix(["0123456789abcdef"], every) == 13    # shares 12 digits with another run
    assert unique_prefix([], every) == 8


@pytest.mark.parametrize("width", [80, 100, 120])
def test_runs_in_a_narrow_terminal_keeps_ids_whole_and_tells_lookalikes_apart(tmp_path: Path, monkeypatch,
                                                                              width: int) -> None:
    """Two polyfit runs that differ only in their degree, and a two-moons run: at 80 to 120 columns each id reads
    whole enough for `flctl show`, and the two polyfit rows say how they differ."""
    from rich.console import Console

    import flctl.cli.runs

    results = tmp_path / "results"
    for args in (["polyfit", "-o", "degree=2"], ["polyfit", "-o", "degree=3"], ["two-moons", "--epochs", "1"]):
        runner.invoke(app, ["run", *args, "--results-dir", str(results)])
    monkeypatch.setattr(flctl.cli.runs, "console", Console(width=width, emoji=False))
    res = runner.invoke(app, ["runs", "--results-dir", str(results)])
    assert res.exit_code == 0, res.output
    rows = [line for line in res.stdout.splitlines() if line.startswith("│")]
    assert len(rows) == 3 and all(len(line) <= width for line in res.stdout.splitlines())
    ids = [row.split("│")[1].strip() for row in rows]
    assert all(len(i) >= 8 and "…" not in i for i in ids), ids
    for i in ids:
        assert runner.invoke(app, ["show", i, "--results-dir", str(results)]).exit_code == 0
    polyfit = [row for row in rows if "polyfit" in row]
    assert sorted(re.search(r"degree=\d", row).group(0) for row in polyfit) == ["degree=2", "degree=3"], polyfit


def test_tasks_in_a_narrow_terminal_cut_no_default(monkeypatch) -> None:
    from rich.console import Console

    import flctl.cli.info

    monkeypatch.setattr(flctl.cli.info, "console", Console(width=100, emoji=False))
    res = runner.invoke(app, ["tasks"])
    assert res.exit_code == 0 and "…" not in res.stdout and "weight_decay=0." in res.stdout, res.stdout


@pytest.mark.parametrize("folder", ["records", "runs"])
def test_a_results_subfolder_replaced_by_a_file_is_refused_before_training(tmp_path: Path, folder: str) -> None:
    results = tmp_path / "results"
    assert runner.invoke(app, ["run", "two-moons", "--epochs", "1", "--results-dir", str(results)]).exit_code == 0
    import shutil

    shutil.rmtree(results / folder)
    (results / folder).write_text("not a folder")
    before = {p: p.stat().st_mtime_ns for p in results.rglob("*")}
    res = runner.invoke(app, ["run", "two-moons", "--epochs", "2", "--results-dir", str(results)])
    assert res.exit_code == 2
    assert _errors(res.output) == [f"error: {str(results / folder)!r} is a file, not a folder: flctl keeps its "
                                   f"{folder} there; move the file aside"]
    assert {p: p.stat().st_mtime_ns for p in results.rglob("*")} == before      # nothing written, no run recorded


def test_a_cpu_run_chooses_its_threads_and_records_the_choice(tmp_path: Path, monkeypatch) -> None:
    """One thread for a model as small as two-moons' (more only spin, worse on a busy machine); --threads rules;
    OMP_NUM_THREADS rules where set. trained_with says which, and the process's setting comes back after."""
    import torch

    import flctl.knobs
    from flctl.knobs import ONE_THREAD_BELOW_FLOP, cpu_threads, usable_cores

    assert cpu_threads(5_000, 512) == 1 and usable_cores() >= 1
    monkeypatch.setattr(flctl.knobs, "usable_cores", lambda: 3)    # as on a 3-core machine
    assert cpu_threads(int(ONE_THREAD_BELOW_FLOP), 128) == 3
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS")
    runs = {}
    for threads in (None, 2):
        run = api.run("two-moons", "fl", epochs=1, seed=0 if threads is None else 1, threads=threads,
                      results_dir=tmp_path / "results")
        runs[threads] = run.trained_with
        assert torch.get_num_threads() == before
    assert (runs[None]["threads"], runs[None]["threads_from"]) == (1, "auto")
    assert (runs[2]["threads"], runs[2]["threads_from"]) == (2, "--threads")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    run = api.run("two-moons", "fl", epochs=1, seed=2, results_dir=tmp_path / "results")
    assert run.trained_with["threads_from"] == "OMP_NUM_THREADS"
    res = runner.invoke(app, ["run", "two-moons", "--threads", "0", "--results-dir", str(tmp_path / "results")])
    assert res.exit_code == 2 and _errors(res.output) == ["error: --threads must be an integer of at least 1, got 0"]


@pytest.mark.notorch
def test_a_cost_with_no_run_to_fit_comes_from_the_newest_committed_benchmark_of_that_device(tmp_path: Path) -> None:
    import json

    from flctl.cost import reference_cost

    def write(date: str, kind: str, tasks: dict) -> None:
        (tmp_path / f"task-costs-{date}-{kind}.json").write_text(json.dumps({"tasks": tasks}))

    write("2026-01-01", "cpu", {"two-moons": {"s_per_cell": 9.0, "s_per_epoch": 9.0}, "digits": {
        "s_per_cell": 1.0, "s_per_epoch": 0.5}})
    write("2026-02-01", "cpu", {"two-moons": {"s_per_start": 5.0, "s_per_cell": 4.0, "s_per_epoch": 0.01}})
    write("2026-03-01", "cuda", {"two-moons": {"s_per_cell": 2.0, "s_per_epoch": 0.001}})
    moons = [api.config("two-moons", "fl", epochs=100, seed=s) for s in range(3)]
    cost = reference_cost(moons, 1, tmp_path)
    assert cost is not None and cost.source == "benchmarks/results/task-costs-2026-02-01-cpu.json"
    # the processes' start-up once (workers start side by side), then the cells' own seconds over those at once
    assert cost.hours(moons) == pytest.approx((5.0 + 3 * 4.0 + 300 * 0.01) / 3600)
    assert reference_cost(moons, 3, tmp_path).hours(moons) == pytest.approx((5.0 + (3 * 4.0 + 300 * 0.01) / 3) / 3600)
    assert cost.hours([]) == 0.0
    # what of a cell's start-up grows with its samples (its evaluations) is priced at the cell's size: a tenth of it
    # for a --subset of a tenth of the data the benchmark trained on
    write("2026-04-01", "cpu", {"two-moons": {"s_per_start": 5.0, "s_per_cell": 4.0, "s_per_cell_full_data": 2.0,
                                              "s_per_epoch": 0.01, "n_train": 1000}})
    tenth = [api.config("two-moons", "fl", epochs=100, seed=s, subset=100) for s in range(3)]
    cost = reference_cost(tenth, 1, tmp_path)
    assert cost.hours(tenth) == pytest.approx((5.0 + 3 * (4.0 + 0.2) + 300 * 0.01 * 0.1) / 3600)
    assert cost.device_hours == pytest.approx(cost.hours(tenth)) and cost.s_per_cell_here == pytest.approx(4.2)
    digits = [api.config("digits", "fl", epochs=10)]
    assert reference_cost(digits, 1, tmp_path).source.endswith("2026-01-01-cpu.json")   # the newest that has it
    assert reference_cost([api.config("polyfit", "fl")], 1, tmp_path) is None
    on_gpu = [dataclasses.replace(api.config("two-moons", "fl"), device="cuda:0")]
    assert reference_cost(on_gpu, 1, tmp_path).source.endswith("cuda.json")


def test_the_papers_dry_run_prices_every_cell_it_can_and_names_the_rest(tmp_path: Path) -> None:
    """No run in the database: the committed CPU benchmark prices the tasks it measured; the line says how many
    cells that covers, where the figures come from, and which tasks stay unknown."""
    from flctl.cost import REFERENCE

    res = runner.invoke(app, ["paper", "--dry-run", "--results-dir", str(tmp_path / "results")])
    assert res.exit_code == 0, res.output
    [line] = [t for t in res.stdout.splitlines() if "cell(s) to do" in t]
    assert re.match(r"\d+ cell\(s\) to do; the \d+ priced take about ", line), line
    assert sorted(REFERENCE.glob("task-costs-*-cpu.json")) and "from benchmarks/results/task-costs-" in line, line
    assert "unknown: no run or benchmark on cpu of cifar10" in line, line
    assert not (tmp_path / "results").exists()


@pytest.mark.notorch
@pytest.mark.parametrize(("args", "said"), [(["--table", "nope"], "unknown table 'nope'; choose one of: main,"),
                                            (["--plot", "nope"], "unknown plot 'nope'; choose one of: cdf,"),
                                            (["--samples", "nope"], "unknown query 'nope'; choose one of: violators,")])
def test_a_report_of_an_unknown_name_says_so_before_it_looks_for_a_database(tmp_path: Path, args: list[str],
                                                                            said: str) -> None:
    res = runner.invoke(app, ["report", *args, "--results-dir", str(tmp_path / "results")])
    assert res.exit_code == 2
    [line] = _errors(res.output)
    assert line.startswith(f"error: {said}"), line
    assert not (tmp_path / "results").exists()
