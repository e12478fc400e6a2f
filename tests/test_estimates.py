"""What a dry run says a plan costs, checked by hand against fixed durations: a resumed cell priced from the epochs
it has left, never more cells at once than there are cells, no term that counts nothing, and `flctl run --dry-run`
priced as `flctl sweep --dry-run` is."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from typer.testing import CliRunner

from flctl import api
from flctl.cli import app
from flctl.cost import estimate_cost, format_seconds, start_up
from flctl.cost.reference import first_cell_extra

# Runs of `flctl run`, each its own process's first: of their fitted start-up, what a worker's first cell pays once
# is the committed benchmark's (s_per_process), the rest each cell's.
EXTRA = first_cell_extra("two-moons", "cpu")

runner = CliRunner()


def flctl(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "400"})


def _history(results: Path) -> None:
    """Two finished two-moons runs of 4 and 44 epochs that took 3 s and 5 s: seconds = 2.8 + 0.05 x epochs."""
    assert flctl("run", "two-moons", "-m", "erm", "--epochs", "4").exit_code == 0
    assert flctl("run", "two-moons", "-m", "erm", "--epochs", "44").exit_code == 0
    with sqlite3.connect(results / "flctl.db") as conn:
        conn.execute("UPDATE runs SET duration_s = CASE epochs_done WHEN 4 THEN 3.0 ELSE 5.0 END")


def test_a_resumed_cell_is_priced_from_the_epochs_it_has_left(results: Path) -> None:
    _history(results)
    plan = ["sweep", "two-moons", "-m", "fl", "--seeds", "2", "--epochs", "30", "--workers", "1", "--batch-runs", "1",
            "--dry-run"]
    start = start_up("two-moons", "cpu")
    fresh = flctl(*plan).output
    cell = format_seconds(2.8 - EXTRA, "cpu")
    assert f"2 cell(s) x {cell} + 60 epochs x 0.05 s (fitted to 2 finished" in fresh, fresh
    assert f"cost: about {format_seconds(start + EXTRA + 2 * (2.8 - EXTRA) + 60 * 0.05, 'cpu')} " in fresh, fresh
    # seed 0's cell trained to epoch 25 of 30 and was interrupted: the sweep resumes it, 5 epochs left
    seed0 = api.config("two-moons", "fl", epochs=30, seed=0)
    assert seed0.run_id in fresh
    assert flctl("run", "two-moons", "-m", "fl", "--epochs", "30", "--seed", "0").exit_code == 0
    with sqlite3.connect(results / "flctl.db") as conn:
        conn.execute("UPDATE runs SET status = 'interrupted', epochs_done = 25 WHERE id = ?", (seed0.run_id,))
    resumed = flctl(*plan).output
    assert f"2 cell(s) x {cell} + 35 epochs left (1 cell(s) resumed) x 0.05 s (fitted to 2 finished" in resumed, resumed
    assert f"cost: about {format_seconds(start + EXTRA + 2 * (2.8 - EXTRA) + 35 * 0.05, 'cpu')} " in resumed, resumed
    # a diverged cell trains afresh: all its epochs
    with sqlite3.connect(results / "flctl.db") as conn:
        conn.execute("UPDATE runs SET status = 'diverged' WHERE id = ?", (seed0.run_id,))
    assert "+ 60 epochs x 0.05 s" in flctl(*plan).output


def test_never_more_cells_at_once_than_cells_and_no_term_that_counts_nothing(results: Path) -> None:
    _history(results)
    [short, long] = sorted(api.runs(results_dir=results), key=lambda r: r.epochs_done)
    cells = [api.config("two-moons", "fl", epochs=40, seed=s) for s in range(25)]
    cost = estimate_cost([short, long], cells, 26)
    assert cost is not None and cost.cells_per_device == 25         # not "/ 26 cells at once" for 25 cells
    # every run took as long whatever its epochs: nothing per epoch, and no "+ 60 epochs x 0 s" said
    with sqlite3.connect(results / "flctl.db") as conn:
        conn.execute("UPDATE runs SET duration_s = 3.0")
    out = flctl("sweep", "two-moons", "-m", "fl", "--seeds", "2", "--epochs", "30", "--workers", "1", "--batch-runs",
                "1", "--dry-run").output.replace("\n", " ")
    assert f"2 cell(s) x {format_seconds(3.0 - EXTRA, 'cpu')} (fitted to 2 finished" in out and "epochs x" not in out, out


def test_run_dry_run_prints_its_cost_until_it_is_trained(results: Path) -> None:
    dry = flctl("run", "two-moons", "--epochs", "30", "--dry-run")
    assert dry.exit_code == 0 and "not trained yet" in dry.output
    assert "cost: about " in dry.output and "from benchmarks/results/task-costs-" in dry.output, dry.output
    assert not (results / "flctl.db").exists()
    _history(results)
    dry = flctl("run", "two-moons", "--epochs", "30", "--dry-run").output.replace("\n", " ")
    start = start_up("two-moons", "cpu")
    assert f"cost: about {format_seconds(start + 2.8 + 30 * 0.05, 'cpu')} " in dry, dry
    assert f"1 cell(s) x {format_seconds(2.8 - EXTRA, 'cpu')} + 30 epochs x 0.05 s (fitted to 2 finished two-moons runs on cpu)" \
        in dry, dry
    assert flctl("run", "two-moons", "--epochs", "30").exit_code == 0
    done = flctl("run", "two-moons", "--epochs", "30", "--dry-run").output
    assert "completed in the database" in done and "cost:" not in done


def test_a_paper_plan_s_total_pays_the_start_up_once_an_item_not_once_a_cell(results: Path) -> None:
    """figure:1 at the smoke scale is one launch of 6 polyfit cells: its total is the item's cost (the processes'
    start-up once), not six start-ups (33 s for 12 s of work, before)."""
    out = flctl("paper", "--scale", "smoke", "--only", "figure:1", "--dry-run").output
    [row] = [line for line in out.splitlines() if line.startswith("│ figure:1")]
    item = row.split("│")[6].strip()
    assert f"6 cell(s) to do, about {item} (expected within " in out, out


def test_a_worker_s_first_cell_pays_its_extra_once_not_once_a_cell(results: Path) -> None:
    """A solver's first cell in a worker imports the solver (4 s here); its next cells take 0.03 s. The history of one
    worker's cells tells the two apart (flctl.cost.first_of_process): a plan pays the extra once, not once a cell
    (18 polyfit cells were priced 16 s and took 5.4 s)."""
    sweep = ["sweep", "polyfit", "-m", "erm", "--seeds", "3", "--batch-runs", "1", "--executor", "debug"]
    assert flctl(*sweep, "--wait").exit_code == 0
    runs = sorted(api.runs(results_dir=results), key=lambda r: r.started_at)
    assert len({(r.host, r.pid) for r in runs}) == 1
    from flctl.cost import first_of_process
    assert first_of_process(runs) == {runs[0].id}
    with sqlite3.connect(results / "flctl.db") as conn:          # fixed durations: the fit is checked by hand
        conn.execute("UPDATE runs SET duration_s = CASE id WHEN ? THEN 4.0 ELSE 0.5 END", (runs[0].id,))
    history = api.runs(results_dir=results)
    cells = [api.config("polyfit", "fl", seed=s) for s in range(6)]
    cost = estimate_cost(history, cells, 1)
    assert cost is not None and cost.s_per_process == 3.5 and cost.s_per_epoch_here == 0.5
    assert cost.device_hours * 3600 == start_up("polyfit", "cpu") + 3.5 + 6 * 0.5
    out = flctl("sweep", "polyfit", "-m", "fl", "--seeds", "6", "--workers", "1", "--dry-run").output
    assert "3.5 s more for a worker's first cell + " in out, out


def test_a_smaller_cell_than_the_history_s_pays_the_start_up_that_grows_with_samples_at_its_size(
        results: Path, tmp_path: Path, monkeypatch) -> None:
    """A smoke cell after larger runs of its task: of the fitted start-up, the share that grows with the samples (its
    evaluations; the committed benchmark's s_per_cell_full_data beside s_per_cell) is priced at the cell's size
    (a smoke paper after --subset runs was priced 6.1 min and took 8.5 s)."""
    import json

    import flctl.cost.reference as reference

    figures = {"s_per_start": 2.0, "s_per_process": 0.0, "s_per_cell": 1.0, "s_per_cell_full_data": 3.0,
               "s_per_epoch": 0.01, "n_train": 1000}
    folder = tmp_path / "figures"
    folder.mkdir()
    (folder / "task-costs-2026-01-01-cpu.json").write_text(json.dumps({"tasks": {"two-moons": figures}}))
    monkeypatch.setattr(reference, "REFERENCE", folder)
    _history(results)                   # 2.8 s + 0.05 s an epoch, at 1,000 samples: a start-up 3/4 of which grows
    cost = estimate_cost(api.runs(results_dir=results), [api.config("two-moons", "fl", epochs=40, subset=100)], 1)
    assert cost is not None
    assert abs(cost.s_per_cell - 0.7) < 1e-12 and abs(cost.s_per_cell_scaled - 2.1) < 1e-12
    assert abs(cost.device_hours * 3600 - (2.0 + 0.7 + 2.1 * 0.1 + 40 * 0.05 * 0.1)) < 1e-9


def test_a_task_measured_on_a_gpu_only_says_its_gpu_price_on_a_cpu(results: Path) -> None:
    out = flctl("run", "cifar10", "--dry-run").output.replace("\n", " ")
    assert "cost: unknown: no finished cifar10 runs on cpu" in out, out
    assert "; on a GPU (--device cuda) about " in out and "-cuda.json" in out, out
