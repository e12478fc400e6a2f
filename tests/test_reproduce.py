"""Same command, same numbers: the threads a run uses do not follow the machine's load, and `flctl reproduce RUN`
trains a run again and says whether its records are bit-identical (docs/reference.md, "What is bit-identical")."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from flctl import api, records
from flctl.errors import ConfigError
from tests.helpers import in_process

pytestmark = pytest.mark.slow       # each test trains runs twice over: 20-60 s

# A digits step at batch 1024 is 1.8e8 FLOP, above flctl.knobs.ONE_THREAD_BELOW_FLOP: its threads are chosen
# automatically from the cores, and 1 and 2 threads give it other rounding (2e-7 on the train loss, AMD EPYC).
LARGE_STEP = ("run", "digits", "--method", "rfl", "--alpha", "1", "--epochs", "2", "--eval-every", "1",
              "--batch-size", "1024")


def tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` by its relative path, with the SHA-256 of its bytes."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def only_run(results: Path) -> dict:
    runs = json.loads(in_process("runs", "--json", "--results-dir", str(results)).stdout)
    assert len(runs) == 1
    return runs[0]


def values(results: Path, run_id: str) -> dict[str, np.ndarray]:
    table = records.read(results / "records", [run_id]).sort_by([("epoch", "ascending"), ("split", "ascending"),
                                                                  ("sample_id", "ascending")])
    return {c: table[c].to_numpy(zero_copy_only=False).astype(float) for c in ("loss", "multiplier")}


def test_a_run_under_load_records_what_it_records_on_a_quiet_machine(tmp_path: Path, monkeypatch) -> None:
    """The automatic thread choice (OMP_NUM_THREADS unset) beside a process spinning on every core equals the quiet
    machine's: the same threads recorded, every loss and multiplier bit for bit. The old choice (cores less the
    1-minute load) gave a run 1 thread under this load and 2 on the quiet machine, and other numbers."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    quiet = in_process(*LARGE_STEP, "--results-dir", str(tmp_path / "quiet"))
    assert quiet.returncode == 0, quiet.stderr
    cores = len(os.sched_getaffinity(0))
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        deadline = time.monotonic() + 60      # until the 1-minute load shows them (the old choice read it)
        while os.getloadavg()[0] < cores - 0.5 and time.monotonic() < deadline:
            time.sleep(1)
        busy = in_process(*LARGE_STEP, "--results-dir", str(tmp_path / "busy"))
    finally:
        for proc in spinners:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    assert busy.returncode == 0, busy.stderr
    a, b = only_run(tmp_path / "quiet"), only_run(tmp_path / "busy")
    assert a["id"] == b["id"]
    assert a["trained_with"]["threads"] == b["trained_with"]["threads"] == cores
    assert a["trained_with"]["threads_from"] == "auto"
    x, y = values(tmp_path / "quiet", a["id"]), values(tmp_path / "busy", b["id"])
    for column in x:
        np.testing.assert_array_equal(x[column], y[column], err_msg=column)


def test_reproduce_says_identical_for_a_plain_run_and_leaves_the_results_untouched(tmp_path: Path,
                                                                                    monkeypatch) -> None:
    """Trained with --threads 2, reproduced with the recorded 2 under OMP_NUM_THREADS=1: identical, exit 0, and not a
    byte of the results folder (records, run folders, database) changed. A record that kept no threads (flctl before
    it recorded them) is trained with this process's one thread: the first difference, exit 1."""
    results = tmp_path / "results"
    assert in_process(*LARGE_STEP, "--threads", "2", "--results-dir", str(results)).returncode == 0
    run = only_run(results)
    before = tree(results)
    res = in_process("reproduce", run["id"][:8], "--results-dir", str(results))
    assert res.returncode == 0, res.stderr
    assert f"run {run['id']}: all 2 record files bit-identical (trained again with 2 threads)" in res.stdout
    assert "warning" not in res.stderr
    assert tree(results) == before

    with sqlite3.connect(results / "flctl.db") as db:
        db.execute("UPDATE runs SET trained_with = NULL WHERE id = ?", (run["id"],))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    import torch

    before_threads = torch.get_num_threads()        # this process's, which an earlier in-process case may have set
    torch.set_num_threads(1)
    try:
        res = in_process("reproduce", run["id"], "--results-dir", str(results))
    finally:
        torch.set_num_threads(before_threads)
    assert res.returncode == 1, res.stderr
    line = res.stdout.strip().splitlines()[-1]
    assert line.startswith(f"run {run['id']}: first difference at epoch 1, split ")
    assert ", column " in line and ": |difference| " in line and "sample_id " in line


def test_reproduce_a_cell_of_a_grouped_sweep_with_its_group(tmp_path: Path) -> None:
    """Six digits cells, grouped four and two by one worker: a grouped kernel rounds by its group (size and place),
    so each cell is trained again with the cells it was grouped with, in their order: identical."""
    results = tmp_path / "results"
    res = in_process("sweep", "digits", "-m", "fl,rfl", "--alpha", "0.5", "--seeds", "3", "--epochs", "2",
                     "--eval-every", "1", "--batch-runs", "4", "--executor", "debug", "--wait",
                     "--results-dir", str(results))
    assert res.returncode == 0, res.stderr
    runs = json.loads(in_process("runs", "--json", "--results-dir", str(results)).stdout)
    sizes = sorted(r["trained_with"]["cells_together"] for r in runs)
    assert sizes == [2, 2, 4, 4, 4, 4] and {r["trained_with"]["engine"] for r in runs} == {"grouped"}
    # each run names the cells it trained as one model with: the same list, itself in it, for each of its group
    groups = {tuple(r["trained_with"]["cells"]) for r in runs}
    assert sorted(map(len, groups)) == [2, 4] and {r["id"] for r in runs} == {i for g in groups for i in g}
    assert all(r["id"] in r["trained_with"]["cells"] for r in runs)
    db = sqlite3.connect(results / "flctl.db")
    pids = dict(db.execute("SELECT id, pid FROM runs").fetchall())
    # the recorded ids are read, not the worker process that trained them: each run's pid told apart
    with db:
        db.execute("UPDATE runs SET pid = rowid + 100000")

    def reproduced(size: int) -> None:          # the last cell of its group: grouped behind the others
        cell = max((r for r in runs if r["trained_with"]["cells_together"] == size), key=lambda r: r["id"])
        res = in_process("reproduce", cell["id"], "--results-dir", str(results))
        assert res.returncode == 0, res.stdout + res.stderr
        others = f"{size - 1} other cell{'s' if size > 2 else ''}"
        # the threads the sweep's worker recorded (its process's: 1 under xdist's workers, 2 in a serial run)
        n = cell["trained_with"]["threads"]
        said = f"trained again with {n} thread{'s' if n > 1 else ''}, grouped with {others}"
        assert f"all 2 record files bit-identical ({said})" in res.stdout

    for size in (4, 2):
        reproduced(size)
    # a run of an older flctl, which recorded no ids: its group is inferred from its worker process and claim order
    with db:
        for run in runs:
            older = {k: v for k, v in run["trained_with"].items() if k != "cells"}
            db.execute("UPDATE runs SET pid = ?, trained_with = ? WHERE id = ?",
                       (pids[run["id"]], json.dumps(older), run["id"]))
    db.close()
    reproduced(2)


class Interrupt(KeyboardInterrupt):
    pass


def test_reproduce_a_resumed_run_and_refuse_an_unfinished_or_unknown_one(tmp_path: Path) -> None:
    """Interrupted after epoch 2 of 4 (checkpointed at its eval epoch), refused while interrupted (exit 2, one line),
    resumed to completion by the same command, then reproduced from scratch: identical. An unknown id: exit 2."""
    results = tmp_path / "results"
    fields = dict(epochs=4, eval_every=2, seed=5)

    def stop_at_2(stats) -> None:
        if stats.epoch == 2:
            raise Interrupt
    with pytest.raises(KeyboardInterrupt):
        api.run("two-moons", "fl", results_dir=results, on_epoch=stop_at_2, **fields)
    run = only_run(results)
    assert run["status"] == "interrupted"
    res = in_process("reproduce", run["id"], "--results-dir", str(results))
    assert res.returncode == 2 and res.stderr.strip() == (
        f"error: run {run['id']} is interrupted, not completed: only a completed run's records can be reproduced "
        "(`flctl run` or `flctl sweep` finishes it)")
    assert (results / "runs" / run["id"] / "checkpoint.pt").is_file()       # it resumes from epoch 2
    assert api.run("two-moons", "fl", results_dir=results, **fields).status == "completed"
    res = in_process("reproduce", run["id"], "--results-dir", str(results))
    assert res.returncode == 0, res.stderr
    assert "all 2 record files bit-identical" in res.stdout
    res = in_process("reproduce", "abcdef12", "--results-dir", str(results))
    assert res.returncode == 2
    assert res.stderr.strip() == "error: no run 'abcdef12' in the database; list them with `flctl runs`"


def test_reproduce_refuses_before_training_and_what_it_finds_after_is_not_bad_input(tmp_path: Path) -> None:
    """Every input is checked before the first epoch (records gone: ConfigError, no epoch trained); a recorded file
    damaged while the run trains again is found only after the work: NotCompared (the CLI's exit 1), not the
    ConfigError of bad input (exit 2, "nothing written")."""
    import shutil

    from flctl.reproduce import NotCompared

    results = tmp_path / "results"
    run = api.run("two-moons", "erm", results_dir=results, epochs=2, eval_every=1,
                  options={"n_train": 200, "n_test": 200})
    folder = results / "records" / f"run_id={run.id}"
    shutil.copytree(folder, tmp_path / "kept")
    shutil.rmtree(folder)
    heard: list[int] = []
    with pytest.raises(ConfigError, match="no records"):
        api.reproduce(run.id, results_dir=results, on_epoch=lambda stats: heard.append(stats.epoch))
    assert heard == []
    shutil.copytree(tmp_path / "kept", folder)

    def damage(stats) -> None:
        for path in folder.glob(records.EPOCH_GLOB):
            path.write_bytes(b"not parquet")
    with pytest.raises(NotCompared, match="after training"):
        api.reproduce(run.id, results_dir=results, on_epoch=damage)


def test_reproduce_warns_of_versions_that_move_numbers_and_of_no_other(tmp_path: Path) -> None:
    """A run recorded under another pyarrow (a dev install moves it; it writes the records and computes none of
    them, flctl.versions.CHANGES_NUMBERS) reproduces with no warning; recorded under another torch, it warns, naming
    torch alone."""
    results = tmp_path / "results"
    run = api.run("two-moons", "erm", results_dir=results, epochs=2, eval_every=1,
                  options={"n_train": 200, "n_test": 200})

    def recorded_as(**versions: str) -> subprocess.CompletedProcess:
        with sqlite3.connect(results / "flctl.db") as db:
            provenance = json.loads(db.execute("SELECT provenance FROM runs WHERE id = ?", (run.id,)).fetchone()[0])
            provenance["libraries"].update(versions)
            db.execute("UPDATE runs SET provenance = ? WHERE id = ?", (json.dumps(provenance), run.id))
        db.close()
        res = in_process("reproduce", run.id, "--results-dir", str(results))
        assert res.returncode == 0, res.stdout + res.stderr
        return res

    assert recorded_as(pyarrow="0.1.0").stderr == ""
    said = recorded_as(torch="1.0.0").stderr
    assert said.startswith("warning: this machine's versions differ from the run's: torch ") and "pyarrow" not in said
    assert "(recorded 1.0.0); its records may differ for that alone" in said
