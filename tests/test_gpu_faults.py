"""The faults of the first real GPU run (an H200, 2026-11-26), each caught on a CPU: a captured graph reading freed
memory, grouped cells racing across CUDA streams, a checkpoint thread touching the device, and a worker that kept
failing cells on a dead CUDA context. Each test failed on the code that ran there (3623c99)."""

from __future__ import annotations

import dataclasses
import os
import textwrap
from pathlib import Path

import pytest
import torch

from flctl.cell import Cell
from flctl.step import WARMUP_STEPS
from flctl.stepper import Stepper
from flctl.tasks import all_tasks, get_task
from flctl.train import train, train_together
from flctl.writer import Writer
from tests.data_writers import WRITERS
from tests.gpu_emulation import ExternalInputs, fake_cuda_streams, storage_of
from tests.helpers import config
from tests.reference import digest

AUGMENTED = sorted(name for name, task in all_tasks().items() if task.augment is not None)
# Small data in each task's real format, with at least WARMUP_STEPS + 1 full batches and a partial last one, so the
# step a captured engine would capture (the (WARMUP_STEPS + 1)-th of each shape) is one of those compared.
SMALL = {
    "cifar10": (dict(per_batch=16), dict(batch_size=12, options={"width": 4})),                 # 80: 6 x 12 + 8
    "fashion-mnist": (dict(n_train=40), dict(batch_size=6, options={"width": 4})),              # 40: 6 x 6 + 4
    "utkface": (dict(n=100), dict(batch_size=4, options={"width": 4, "size": 16, "split": "70-30"})),  # 18: 4 x 4 + 2
}


def _cells(tmp_path: Path, name: str, k: int) -> tuple[list[Cell], object]:
    write, shape = SMALL[name]
    data_dir = str(WRITERS[name](tmp_path / "data", **write))
    methods = ["fl", "erm", "rfl"][:k]
    cfgs = [config(name, m, seed=i, epochs=4, eval_every=4, data_dir=data_dir, **shape) for i, m in enumerate(methods)]
    task = get_task(name)
    data = task.load(cfgs[0].opts, data_dir).to("cpu")
    cells = [Cell.build(c, task, data, tmp_path / "runs" / c.run_id, torch.device("cpu")) for c in cfgs]
    if k > 1:
        for c in cells:
            c.swap_rng_out()
    return cells, data


@pytest.mark.parametrize("k,grouped", [(1, False), (2, False), (3, True)], ids=["alone", "interleaved", "grouped"])
@pytest.mark.parametrize("name", AUGMENTED)
def test_every_input_a_step_reads_keeps_its_storage_across_epochs(tmp_path: Path, name: str, k: int,
                                                                 grouped: bool) -> None:
    """What a CUDA graph needs: each tensor a step reads but does not make (parameters, optimizer and method state,
    the epoch's batch buffers and augmentation parameters, the data) is at the same address in every epoch. At
    3623c99 the augmentation parameters were new tensors each epoch: 3 of the inputs moved. Grouped cells (flctl.grouped,
    as on CUDA) are one captured step reading the grouped tensors."""
    cells, data = _cells(tmp_path, name, k)
    task = dataclasses.replace(get_task(name), batched=grouped)
    stepper = Stepper(cells, task, data)
    assert stepper.grouping == grouped
    seen: dict[tuple[int, int], list[int]] = {}
    shapes = None
    for epoch in range(2):
        for c in cells:
            with stepper.own(c):
                stepper.begin_epoch(c)
        shapes = stepper.shapes(cells)
        assert shapes.count(False) > WARMUP_STEPS and shapes[-1], "the data must hold a capture step and a last batch"
        for i, last in enumerate(shapes):
            if i in (WARMUP_STEPS, len(shapes) - 1):
                with ExternalInputs() as inputs:
                    stepper.step(cells, last)
                seen[epoch, i] = inputs.addresses
                assert inputs.addresses, "the recorder saw the step"
            else:
                stepper.step(cells, last)
        for c in cells:
            c.epoch += 1
    assert shapes is not None
    for i in (WARMUP_STEPS, len(shapes) - 1):
        moved = [n for n, (a, b) in enumerate(zip(seen[0, i], seen[1, i])) if a != b]
        assert len(seen[0, i]) == len(seen[1, i]) and not moved, \
            f"step {i}: {len(moved)} of {len(seen[0, i])} inputs moved between epochs"


@pytest.mark.parametrize("name", AUGMENTED)
def test_a_captured_step_watches_every_input_it_reads(tmp_path: Path, name: str) -> None:
    """CapturedStep recaptures when an input moves; it can see that only for the tensors flctl.step.step_inputs
    names. Every input the recorder finds must be among them (a new kind of state must be added there)."""
    from flctl.step import step_inputs

    cells, data = _cells(tmp_path, name, 1)
    c = cells[0]
    stepper = Stepper(cells, get_task(name), data)
    stepper.begin_epoch(c)
    for _ in range(WARMUP_STEPS):                      # optimizer state exists from the first step on
        stepper.step(cells, False)
    with ExternalInputs() as inputs:
        stepper.step(cells, False)
    batches = stepper.batches[c.cfg.run_id]
    watched = {storage_of(t) for t in step_inputs(c, data, batches)}
    missed = [(op, shape) for op, p, shape, _ in inputs.external if p not in watched]
    assert not missed, f"inputs CapturedStep does not watch: {missed}"


@pytest.mark.parametrize("name", AUGMENTED)
def test_a_captured_grouped_step_watches_every_input_it_reads(tmp_path: Path, name: str) -> None:
    from flctl.grouped.step import group_inputs

    cells, data = _cells(tmp_path, name, 3)
    stepper = Stepper(cells, dataclasses.replace(get_task(name), batched=True), data)
    for c in cells:
        with stepper.own(c):
            stepper.begin_epoch(c)
    for _ in range(WARMUP_STEPS):
        stepper.step(cells, False)
    with ExternalInputs() as inputs:
        stepper.step(cells, False)
    group = stepper.group
    watched = {storage_of(t) for t in group_inputs(group, data, stepper.group_batches)}
    missed = [(op, shape) for op, p, shape, _ in inputs.external if p not in watched]
    assert not missed, f"inputs a captured grouped step does not watch: {missed}"



@pytest.mark.parametrize("method,extra", [("erm", {}), ("cserm", {"alpha": 2.0}), ("fl", {}),
                                          ("rfl", {"dual_optimizer": "nupi", "kp": 0.5, "ki": 0.8, "nu": 0.3})],
                         ids=["erm", "cserm", "fl", "rfl-nupi"])
def test_a_captured_step_keeps_its_graph_while_no_input_moves(tmp_path: Path, method: str, extra: dict) -> None:
    """The capture's record is taken where CapturedStep takes it (before the captured step runs); the rest of the
    epoch and the next epoch's refill move nothing it watches, so the graph is kept (a method's scratch tensors, made
    anew by each step, are not inputs); a buffer made anew drops it."""
    from flctl.step import CapturedStep, layouts, step_inputs

    write, shape = SMALL["cifar10"]
    data_dir = str(WRITERS["cifar10"](tmp_path / "data", **write))
    cfg = config("cifar10", method, epochs=4, eval_every=4, data_dir=data_dir, **shape, **extra)
    task = get_task("cifar10")
    data = task.load(cfg.opts, data_dir)
    c = Cell.build(cfg, task, data, tmp_path / "run", torch.device("cpu"))
    stepper = Stepper([c], task, data)
    batches = stepper.batches[cfg.run_id]
    step = CapturedStep(lambda: None, None, lambda: step_inputs(c, data, batches))  # type: ignore[arg-type]
    stepper.begin_epoch(c)
    for i, last in enumerate(stepper.shapes([c])):
        if i == WARMUP_STEPS:
            step.graph, step.captured_at = object(), layouts(step.inputs())  # type: ignore[assignment]
        stepper.step([c], last)
    c.epoch += 1
    stepper.begin_epoch(c)
    step.check()
    assert step.graph is not None and step.recaptures == 0, "an input moved: every epoch would capture anew"
    key = next(iter(batches.full_params))
    batches.full_params[key] = batches.full_params[key] + 0
    step.check()
    assert step.graph is None and step.recaptures == 1


def _races(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cfgs: list) -> list:
    with fake_cuda_streams(monkeypatch) as rec:
        results = train_together(cfgs, tmp_path / "records", [tmp_path / "runs" / c.run_id for c in cfgs])
    assert [r.status for r in results] == ["completed"] * len(cfgs)
    assert len(rec.streams_used) > 1, "the recorder saw the hand-over between streams"
    return rec.races


def test_grouped_small_cells_use_their_tensors_in_stream_order(tmp_path: Path, monkeypatch) -> None:
    """Two grouped two-moons cells as on CUDA: at 3623c99 their (then vmapped) step ran on the default stream while each
    cell's epoch set-up and end ran on its own stream, unordered (the H200's 1,000-cell sweep: 704 failed)."""
    cfgs = [config("two-moons", m, seed=s, epochs=3, eval_every=1) for s, m in enumerate(("fl", "erm"))]
    races = _races(tmp_path, monkeypatch, cfgs)
    assert not races, f"{len(races)} unordered cross-stream uses, first: {races[:5]}"


def test_grouped_image_cells_use_their_tensors_in_stream_order(tmp_path: Path, monkeypatch) -> None:
    data_dir = str(WRITERS["cifar10"](tmp_path / "data", per_batch=8))
    cfgs = [config("cifar10", m, seed=s, epochs=2, eval_every=1, batch_size=12, data_dir=data_dir,
                   options={"width": 4}) for s, m in enumerate(("fl", "erm"))]
    races = _races(tmp_path, monkeypatch, cfgs)
    assert not races, f"{len(races)} unordered cross-stream uses, first: {races[:5]}"


@pytest.mark.parametrize("joins", [True, False])
def test_cells_on_streams_of_their_own_use_their_tensors_in_stream_order(tmp_path: Path, monkeypatch,
                                                                         joins: bool) -> None:
    """--engine captured-streams (candidate (b) of cells at the GPU's pace): each cell steps on a stream of its own,
    between the epoch's joins (docs/design.md, "Streams and threads on CUDA"); its records equal the cell alone's bit
    for bit (the same kernels, its own tensors). A replay runs the step's ops on the stream it was captured on, so
    an eager stand-in for CapturedStep on that stream shows what the graphs would read. Without the joins the
    recorder finds the races."""
    import flctl.stepper

    ran_on: list[str] = []

    class Eager:            # CapturedStep's stand-in: the step, on the stream it was given, as a replay runs it
        def __init__(self, step, stream, inputs, fallback=False) -> None:
            self.step, self.stream = step, stream

        def check(self) -> None:
            pass

        def __call__(self) -> None:
            ran_on.append(self.stream.name)
            with torch.cuda.stream(self.stream):
                self.step()

    monkeypatch.setattr(flctl.stepper, "CapturedStep", Eager)
    cfgs = [dataclasses.replace(config("two-moons", m, seed=s, epochs=3, eval_every=1), engine="captured-streams")
            for s, m in enumerate(("fl", "erm"))]
    with fake_cuda_streams(monkeypatch) as rec:
        made = iter(range(1000))
        monkeypatch.setattr(flctl.stepper, "cell_stream", lambda device: rec.new_stream(f"cell{next(made)}"))
        if not joins:
            monkeypatch.setattr(Stepper, "_join_in", lambda self, active: None)
            monkeypatch.setattr(Stepper, "_join_out", lambda self, active: None)
        results = train_together(cfgs, tmp_path / "records", [tmp_path / "runs" / c.run_id for c in cfgs])
    assert {"cell0", "cell1"} <= set(ran_on) and {r.trained_with["engine"] for r in results} == {"captured-streams"}
    if not joins:
        assert rec.races, "the recorder missed a cell stream reading what the group's stream wrote"
        return
    assert not rec.races, f"{len(rec.races)} unordered cross-stream uses, first: {rec.races[:5]}"
    for cfg, together in zip(cfgs, results):
        alone = train(dataclasses.replace(cfg, engine="eager"), tmp_path / "alone", tmp_path / "a" / cfg.run_id)
        assert together.metrics == alone.metrics
        assert digest(tmp_path / "records", cfg.run_id) == digest(tmp_path / "alone", cfg.run_id)


def test_the_stream_recorder_finds_an_unordered_use(monkeypatch) -> None:
    """The recorder itself: a write on one stream read on another is a race until the reader waits for the writer."""
    with fake_cuda_streams(monkeypatch) as rec:
        a, b = rec.new_stream("a"), rec.new_stream("b")
        with torch.cuda.stream(a):
            x = torch.ones(3)
        with torch.cuda.stream(b):
            x.sum()
        assert [(r.stream, r.written_on) for r in rec.races] == [("b", "a")]
        with torch.cuda.stream(a):
            x.add_(1)
        b.wait_stream(a)
        with torch.cuda.stream(b):
            x.sum()
        assert len(rec.races) == 1


def test_the_checkpoint_writer_is_handed_host_memory_only(tmp_path: Path) -> None:
    """The writer thread does file I/O only: a state holding a device tensor (a meta tensor stands in for a CUDA one
    here) is refused before anything is written. At 3623c99 the thread copied CUDA tensors itself, on another stream
    than the one they were written on, and beside a graph capture."""
    path = tmp_path / "checkpoint.pt"
    with Writer() as writer, pytest.raises(ValueError, match="not in host memory"):
        writer.checkpoint("r", {"model": {"w": torch.ones(2)}, "opt": [torch.empty(3, device="meta")]}, path)
    assert not path.exists()


def test_the_checkpoint_writer_thread_runs_no_torch_op_and_frees_no_copy(tmp_path: Path, monkeypatch) -> None:
    """A run checkpointing every epoch: no torch op runs on the writer thread, and each checkpoint's copies are freed
    by the training thread (on CUDA, freeing pinned memory records a CUDA event: a CUDA call). At 3623c99 the writer
    thread held the last reference to the state it saved, so the copies were freed there."""
    import sys
    import threading
    import weakref

    module = sys.modules[Writer.__module__]
    ops: list[str] = []
    freed: list[str] = []
    saved: list[dict] = []
    real_save = module.atomic_save

    class Ops(ExternalInputs):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops.append(f"{func} on {threading.current_thread().name}")
            return func(*args, **(kwargs or {}))

    def save(obj, path):
        if "model" in obj:       # a checkpoint (the final model.pt is saved by the training thread itself)
            for t in obj["model"].values():
                weakref.finalize(t, lambda: freed.append(threading.current_thread().name))
            saved.append({k: v.clone() for k, v in obj["model"].items()})
        with Ops():
            real_save(obj, path)

    monkeypatch.setattr(module, "atomic_save", save)
    cfg = config("two-moons", "fl", epochs=4, eval_every=2)
    assert train(cfg, tmp_path / "records", tmp_path / "runs" / cfg.run_id, checkpoint_every=0.0).status == "completed"
    assert len(saved) == 3 and not ops, ops[:5]
    assert freed and set(freed) == {threading.current_thread().name}, set(freed)
    first = next(iter(saved[0]))
    assert not torch.equal(saved[0][first], saved[-1][first])     # copies of each epoch, not the live tensors


def test_a_run_resumes_from_host_copies_to_the_same_records(tmp_path: Path) -> None:
    """Checkpoints made through host copies resume exactly (the stop lands at an epoch boundary, then a resume)."""
    cfg = config("two-moons", "rfl", epochs=4, eval_every=1)
    whole = train(cfg, tmp_path / "whole", tmp_path / "w")
    stops = iter([False, False, True])      # asked before the first epoch, then at each epoch's end
    stopped = train(cfg, tmp_path / "parts", tmp_path / "p", stop=lambda: next(stops, False))
    assert stopped.status == "stopped" and stopped.epochs_done == 2
    resumed = train(cfg, tmp_path / "parts", tmp_path / "p")
    assert resumed.resumed_from == 2 and resumed.metrics == whole.metrics
    assert digest(tmp_path / "parts", cfg.run_id) == digest(tmp_path / "whole", cfg.run_id)


# Two moons whose model meets a fatal CUDA error (the exception torch raises after a device-side assert, with its
# message) at its first forward: in the first cell any worker builds while the file $POISON names exists (the file
# is taken then, so exactly one cell is poisoned). What the H200's captured engine met, raised on a CPU.
POISONED_TASK = textwrap.dedent('''
    import dataclasses
    import os
    import torch
    from flctl_tasks.two_moons import TASK as MOONS

    FATAL = getattr(torch, "AcceleratorError", RuntimeError)

    class Poisoned(torch.nn.Module):
        def __init__(self, body):
            super().__init__()
            self.body = body

        def forward(self, x):
            raise FATAL("CUDA error: device-side assert triggered\\nCompile with TORCH_USE_CUDA_DSA to enable "
                        "device-side assertions.")

    def build_model(options, data):
        model = MOONS.build_model(options, data)
        try:
            os.unlink(os.environ["POISON"])
        except (KeyError, FileNotFoundError):
            return model
        return Poisoned(model)

    TASK = dataclasses.replace(MOONS, name="poisoned-moons", description="two moons whose first cell's device dies",
                               build_model=build_model, batched=False)
''')


@pytest.mark.slow    # a sweep of local workers, one of which loses its device: 21 s
def test_a_fatal_device_error_ends_its_worker_and_the_sweep_finishes(tmp_path: Path) -> None:
    """A fatal CUDA error in one cell of a local sweep: that cell is failed with the error (its attempt counted), its
    worker exits with DEVICE_LOST_EXIT after starting a fresh worker, and every other cell completes. At 3623c99 the
    worker went on claiming cells on its dead context and failed them all."""
    import sys

    from flctl.db import Store
    from flctl.errors import DEVICE_LOST_EXIT
    from flctl.launch.jobs import submitted_jobs
    from tests import warm
    from tests.helpers import wait_until

    task_file, poison = tmp_path / "poisoned_moons.py", tmp_path / "poison"
    task_file.write_text(POISONED_TASK)
    poison.touch()
    results = tmp_path / "results"
    env = {**os.environ, "FLCTL_TASKS": str(task_file), "POISON": str(poison)}
    out = warm.run([sys.executable, "-m", "flctl", "sweep", "poisoned-moons", "-m", "fl", "--seeds", "6",
                    "--epochs", "100", "--workers", "2", "--threads", "1", "--batch-runs", "1", "--max-attempts", "1",
                    "--executor", "local", "--results-dir", str(results)],
                   capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    store = Store.open(f"sqlite:///{results / 'flctl.db'}")
    settled = lambda: all(r.status in ("completed", "failed") for r in store.list_runs())    # noqa: E731
    wait_until(settled, "every cell to complete or fail", timeout=240)
    failed = [r for r in store.list_runs() if r.status != "completed"]
    assert len(failed) == 1 and not poison.exists(), [(r.seed, r.status) for r in store.list_runs()]
    [cell] = failed
    assert cell.status == "failed" and cell.attempts == 1 and "device-side assert" in (cell.error or "")
    logs = "".join(p.read_text() for p in (results / "jobs").rglob("*_log.err"))
    said = [line for line in logs.splitlines() if "fatal device error" in line]
    assert len(said) == 1 and cell.id in said[0] and f"(exit {DEVICE_LOST_EXIT})" in said[0], said
    assert "a fresh worker takes its place" in said[0]
    [sweep] = store.list_sweeps()
    assert len(submitted_jobs(results, sweep["id"])) == 3           # the two workers asked for, and the fresh one
    wait_until(lambda: not _alive(cell.pid), "the failed cell's worker to exit")


@pytest.mark.slow    # a sweep to its end after a lost device: 8 s
def test_a_fatal_device_error_under_the_debug_executor_does_not_end_the_command(tmp_path: Path) -> None:
    """The debug executor runs its worker in the calling process: a device loss there stops the worker (one line
    says so) but never exits the command's process; the cells not trained stay queued for a later sweep, and so does
    the one whose device died (its attempt counted: another process may not meet the fault)."""
    import sys

    from flctl.db import Store
    from tests import warm

    task_file, poison = tmp_path / "poisoned_moons.py", tmp_path / "poison"
    task_file.write_text(POISONED_TASK)
    poison.touch()
    results = tmp_path / "results"
    out = warm.run([sys.executable, "-m", "flctl", "sweep", "poisoned-moons", "-m", "fl", "--seeds", "3",
                    "--epochs", "5", "--batch-runs", "1", "--executor", "debug", "--wait", "--results-dir",
                    str(results)], capture_output=True, text=True, timeout=300,
                   env={**os.environ, "FLCTL_TASKS": str(task_file), "POISON": str(poison)})
    assert "fatal device error" in out.stderr and "no worker was started in its place" in out.stderr, out.stderr
    # the wait does not wait for ever on cells no worker is left to take: one line, exit 1
    assert out.returncode == 1 and out.stderr.splitlines()[-1].startswith("error: no worker is left for sweep "), \
        out.stdout + out.stderr
    runs = Store.open(f"sqlite:///{results / 'flctl.db'}").list_runs()
    assert sorted((r.status, r.attempts) for r in runs) == [("queued", 0), ("queued", 0), ("queued", 1)]
    assert "device-side assert" in next(r.error for r in runs if r.attempts == 1)


def _alive(pid: int | None) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_a_cuda_error_that_leaves_the_device_working_is_the_cells_own_failure(tmp_path: Path, monkeypatch,
                                                                              clean_plugins) -> None:
    """An error that names CUDA but leaves the device working (a probe's kernel runs) is the cell's own failure,
    not retried; one whose device fails the probe queues the cell again, its attempt counted."""
    import flctl.devices
    from flctl import api
    from flctl.db import RunQueue, Store
    from flctl.layout import Layout
    from flctl.runner import train_claimed

    task_file = tmp_path / "poisoned_moons.py"
    task_file.write_text(POISONED_TASK)
    api.use_tasks(task_file)
    root = tmp_path / "results"
    root.mkdir()                    # a worker's results folder is there: training makes none above its runs
    store = Store.open(f"sqlite:///{tmp_path / 'flctl.db'}")
    for works, status in ((True, "failed"), (False, "queued")):
        (tmp_path / "poison").touch()
        monkeypatch.setenv("POISON", str(tmp_path / "poison"))
        monkeypatch.setattr(flctl.devices, "device_works", lambda works=works: works)
        cfg = api.config("poisoned-moons", "fl", epochs=2, seed=int(works))
        store.add_runs([cfg])
        token = RunQueue(store).claim_run(cfg.run_id)
        assert token is not None
        ending = train_claimed([cfg], {cfg.run_id: token}, store, Layout(root), max_attempts=3)
        assert "device-side assert" in str(ending.error)
        assert ending.outcome.name == ("own error" if works else "device lost")      # the probe asked once, by its row
        run = store.get_run(cfg.run_id)
        assert run is not None and (run.status, run.attempts) == (status, 1), works


@pytest.mark.parametrize("fallback", [True, False], ids=["auto", "captured"])
def test_a_step_that_cannot_be_captured_runs_eager_under_engine_auto_and_fails_under_captured(monkeypatch, capsys,
                                                                                           fallback: bool) -> None:
    """Engine auto is the CUDA default: a capture that fails (an op a graph cannot hold) must not fail the run. The
    failed capture ran no kernel, so the step runs eagerly at once, and from then on; --engine captured fails."""
    from flctl.step import CapturedStep

    class Refused:                      # torch.cuda.graph, whose capture ends in an error
        def __init__(self, *args, **kwargs) -> None:
            pass

        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc) -> None:
            raise RuntimeError("operation not permitted when stream is capturing\nmore")

    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: object())
    monkeypatch.setattr(torch.cuda, "graph", Refused)
    calls: list[int] = []
    step = CapturedStep(lambda: calls.append(1), None, lambda: [], fallback=fallback)  # type: ignore[arg-type]
    for _ in range(WARMUP_STEPS):
        step()
    if not fallback:
        with pytest.raises(RuntimeError, match="not permitted"):
            step()
        return
    step()
    step()
    assert step.eager and step.graph is None
    assert len(calls) == WARMUP_STEPS + 1 + 1 + 1      # warm-up, the capture's trace, its eager run, one more step
    err = capsys.readouterr().err
    assert err.count("flctl: warning: the step cannot be captured") == 1 and "more" not in err
