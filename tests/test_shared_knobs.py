"""Facts with one home: --db and --results-dir declared once for every command, launch knobs checked once, a sweep's
ledger and when it is settled (flctl.status)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import typer
from sqlalchemy import update

from flctl.cli import app
from flctl.db import Store
from flctl.db.schema import Run, now
from flctl.errors import ConfigError
from flctl.knobs import check_checkpoint_every, check_count
from flctl.launch.backends.local import local_slots
from flctl.launch.backends.slurm import slurm_workers
from flctl.launch.settings import LaunchFlags, LaunchSettings
from flctl.status import DIVERGED_ERROR, LEDGER_COLUMNS, Status, failed_for_good, ledger, settled
from tests.helpers import config

pytestmark = pytest.mark.notorch


def test_every_command_that_opens_the_database_declares_db_and_results_dir_alike() -> None:
    group = typer.main.get_command(app)
    seen: dict[str, set[tuple[str | None, str | None]]] = {"db": set(), "results_dir": set()}
    commands = 0
    for command in group.commands.values():      # type: ignore[attr-defined]
        params = {p.name: p for p in command.params}
        if "db" in params:
            commands += 1
            assert "results_dir" in params, command.name
        for name in seen:
            if name in params:
                seen[name].add((params[name].help, getattr(params[name], "rich_help_panel", None)))
    assert commands == 13          # run sweep cancel status sweeps runs show migrate report paper export verify
    #                                reproduce
    assert all(len(found) == 1 for found in seen.values()), seen


def test_the_launch_flags_are_declared_once_for_sweep_and_paper_and_cover_the_settings() -> None:
    """LaunchFlags is the one list of launch options: `flctl sweep` and `flctl paper` offer each with the same help
    and panel, a spec's [launch] table takes the same keys, and every one lands in LaunchSettings."""
    import dataclasses

    from flctl.launch.backends.slurm import SlurmOptions

    group = typer.main.get_command(app)
    names = [f.name for f in dataclasses.fields(LaunchFlags)]
    shown = {}
    for command in ("sweep", "paper"):
        params = {p.name: p for p in group.commands[command].params}      # type: ignore[attr-defined]
        shown[command] = {n: (params[n].opts, params[n].help, params[n].rich_help_panel) for n in names}
    assert shown["sweep"] == shown["paper"]
    assert shown["sweep"]["batch_runs"][0] == ["--batch-runs"]
    assert shown["sweep"]["partition"][2] == "Slurm" and shown["sweep"]["workers"][2] == "Launch"
    settings = {f.name for f in dataclasses.fields(LaunchSettings)} - {"options"}
    slurm = {f.name for f in dataclasses.fields(SlurmOptions)}
    assert set(names) == settings | slurm and not settings & slurm
    given = LaunchFlags(workers=3, per_gpu=2, batch_runs=4, partition="gpu", sbatch={"constraint": "a100"})
    resolved = LaunchSettings.resolve({"executor": "slurm", "workers": 1, "threads": 2, "partition": "cpu"}, given)
    assert (resolved.workers, resolved.threads, resolved.options.partition) == (3, 2, "gpu")  # the command line wins
    assert resolved.options.sbatch == {"constraint": "a100"}
    with pytest.raises(ConfigError, match=r"^--partition is not an option of --executor local$"):
        LaunchSettings.resolve({"partition": "cpu"})
    assert resolved.cells_per_device("two-moons", 50, "cuda:1") == 8
    assert resolved.cells_per_device("two-moons", 50, "cpu") == 4 * len(resolved.slots(50, "cpu"))  # 4 in each worker
    with pytest.raises(ConfigError, match=r"unknown \[launch\] key\(s\) batchruns; valid: account, array_parallelism"):
        LaunchSettings.resolve({"batchruns": 2})


def test_omp_num_threads_is_the_default_threads_and_a_flag_or_the_spec_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert LaunchSettings.resolve({}).threads == 3
    assert LaunchSettings.resolve({"threads": 2}).threads == 2
    assert LaunchSettings.resolve({"threads": 2}, LaunchFlags(threads=4)).threads == 4
    assert [s.threads for s in LaunchSettings.resolve({}).slots(5, "cpu")][:1] == [3]
    for ignored in ("0", "4,2", "many", ""):        # not a count: torch's business, not a launch setting
        monkeypatch.setenv("OMP_NUM_THREADS", ignored)
        assert LaunchSettings.resolve({}).threads is None
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert LaunchSettings.resolve({}).threads is None


@pytest.mark.parametrize("value", [0, -3, True, 2.0, "4"])
def test_a_count_is_an_integer_of_at_least_one_wherever_it_is_checked(value) -> None:
    with pytest.raises(ConfigError, match=f"--workers must be an integer of at least 1, got {value!r}"):
        check_count("--workers", value)
    with pytest.raises(ConfigError, match="--workers must be an integer of at least 1"):
        LaunchSettings.resolve({"workers": value})
    if isinstance(value, int) and not isinstance(value, bool):
        with pytest.raises(ConfigError, match="--workers must be an integer of at least 1"):
            local_slots(4, device="cpu", workers=value)
        with pytest.raises(ConfigError, match="--workers must be an integer of at least 1"):
            slurm_workers(4, value, 1)
    check_count("--workers", None)
    check_count("--workers", 1)


@pytest.mark.parametrize("value", [-1.0, float("nan"), True, "60"])
def test_checkpoint_every_is_seconds_at_least_zero(value) -> None:
    with pytest.raises(ConfigError, match="--checkpoint-every must be a number of seconds >= 0"):
        check_checkpoint_every(value)
    with pytest.raises(ConfigError, match="--checkpoint-every must be a number of seconds >= 0"):
        LaunchSettings.resolve({"checkpoint_every": value})
    check_checkpoint_every(0)
    assert LaunchSettings.resolve({}).checkpoint_every == 60.0


def _sweep(tmp_path: Path, rows: list[tuple[str, str, str | None]], sweep_id: str = "s1") -> tuple[Store, list[str]]:
    """A sweep in a real database whose cells are ``rows`` (method, state, error; state "stale": running, its
    heartbeat an hour old; any other's is now), each a run of its own; the store and the cells' ids in the order of ``rows``."""
    store = Store.open(f"sqlite:///{tmp_path / 'flctl.db'}")
    seeds = len(store.list_runs())
    configs = [config("two-moons", method, seed=seeds + k) for k, (method, _, _) in enumerate(rows)]
    store.create_sweep(sweep_id, None, "two-moons", {}, configs)
    with store.session() as s:
        for cfg, (_, state, error) in zip(configs, rows):
            beat = now() - timedelta(hours=1 if state == "stale" else 0)
            s.execute(update(Run).where(Run.id == cfg.run_id).values(
                status=Status.RUNNING if state == "stale" else state, error=error, heartbeat_at=beat))
    return store, [c.run_id for c in configs]


def test_the_ledger_counts_states_per_method_and_settles_when_no_cell_is_held_or_to_do(tmp_path: Path) -> None:
    finished = [("fl", "completed", None), ("fl", "failed", None), ("erm", "diverged", None)]
    store, _ = _sweep(tmp_path, finished)
    data = ledger(store, "s1")
    assert data["cells"] == 3 and list(data["total"]) == list(LEDGER_COLUMNS)
    assert data["methods"]["fl"]["completed"] == 1 and data["methods"]["fl"]["failed"] == 1
    assert settled(data)
    for k, pending in enumerate(("queued", "interrupted", "running", "stale")):
        store, _ = _sweep(tmp_path, [*finished, ("fl", pending, None)], sweep_id=f"s{k + 2}")
        assert not settled(ledger(store, f"s{k + 2}")), pending
        assert ledger(store, f"s{k + 2}")["total"]["stale"] == (pending == "stale")


def test_the_ledger_counts_failed_and_diverged_cells_by_error(tmp_path: Path) -> None:
    """The error of a failed cell is its traceback's exception line, counted with what differs between occurrences
    (numbers, ids, paths) set aside; a diverged cell counts as its own kind."""
    trace = "Traceback (most recent call last):\n  File \"x.py\", line 3, in f\n    g()\nValueError: bad step {}\n"
    lost = "worker lost (heartbeat stale); gave up after 3 attempts"
    store, ids = _sweep(tmp_path, [("fl", "failed", trace.format(3)), ("fl", "failed", trace.format(7)),
                                   ("erm", "failed", lost), ("erm", "diverged", None), ("erm", "completed", None)])
    data = ledger(store, "s1")
    first = min(ids[:2])         # of the two tracebacks, the cell of the lower id is the one shown
    assert [(e["count"], e["message"], e["run"]) for e in data["errors"]] == [
        (2, f"ValueError: bad step {(3, 7)[ids.index(first)]}", first), (1, DIVERGED_ERROR, ids[3]),
        (1, lost, ids[2])]
    assert [e["count"] for e in data["method_errors"]["fl"]] == [2] and failed_for_good(data) == 4
