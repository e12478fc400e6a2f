"""Trackers that fail never hold a command longer than FLCTL_TRACKER_TIMEOUT_S a call: `flctl run`, `flctl sweep
--wait` (debug and local executors) and `flctl export` against an MLflow server that nothing listens for
(unreachable), one that accepts and never answers (slow: a socket server on loopback, stopped at teardown) and a
malformed tracking URI, each beside TensorBoard made to raise by its environment (its folder a file) and W&B online
with no API key. Each ends in bounded time, with its documented exit code (0 for run and sweep: training is not the
tracker's; 1 for export), one warning per logger and run (an export: one `error:` line), no traceback, and its runs
completed in the database."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flctl import api
from flctl.loggers import call_tracker, describe, get_logger
from tests import warm
from tests.helpers import bound

TIMEOUT_S = 3          # FLCTL_TRACKER_TIMEOUT_S in these tests: a call given up on well within LIMIT_S
# A command's wall time, start-up and training included (a local sweep took 54 s on 2 busy cores); without the bound,
# MLflow alone retried a refused connection for about 4 minutes, and a stalled server 120 s a try, 8 tries.
LIMIT_S = 120
LOGGERS = ("mlflow", "tensorboard", "wandb")
FAULTS = ("unreachable", "slow", "malformed")


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def stalled() -> Iterator[str]:
    """An HTTP server on loopback that accepts each connection and never answers; stopped at teardown."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    server.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        for conn in held:
            conn.close()
        server.close()


def _env(tmp: Path, uri: str) -> dict[str, str]:
    """MLflow at ``uri``, W&B online with no key (a HOME of its own: no ~/.netrc), the tracker timeout small."""
    (tmp / "home").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_"))}
    return env | {"HOME": str(tmp / "home"), "MLFLOW_TRACKING_URI": uri, "FLCTL_TRACKER_TIMEOUT_S": str(TIMEOUT_S),
                  "COLUMNS": "200"}


def _uri(fault: str, request: pytest.FixtureRequest) -> str:
    return {"unreachable": lambda: f"http://127.0.0.1:{_closed_port()}",
            "slow": lambda: request.getfixturevalue("stalled"), "malformed": lambda: "ftp://x"}[fault]()


def _flctl(*args: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    """`flctl *args` as a process of its own, forked warm (tests/warm.py: stdin closed, as under nohup or CI); its
    result and wall time."""
    started = time.monotonic()
    res = warm.run([sys.executable, "-m", "flctl", *args], env=env, capture_output=True, text=True,
                   timeout=10 * LIMIT_S)
    return res, time.monotonic() - started


def _broken_tensorboard(root: Path) -> None:
    """TensorBoard made to raise at each run's start: its folder is a file."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "tensorboard").write_text("not a folder\n")


def _sweep_of(root: Path, run_id: str) -> str | None:
    from flctl.db.reads import sweep_of

    store = api.open_store(root, create=False)
    try:
        return sweep_of(store, run_id)
    finally:
        store.close()


def _warnings(text: str) -> list[str]:
    return [line for line in text.splitlines() if "warning:" in line]


def _worker_logs(root: Path) -> str:
    """What the local executor's subprocess workers printed (submitit's logs under results/jobs)."""
    return "".join(p.read_text(errors="replace") for p in sorted((root / "jobs").rglob("*")) if p.is_file()
                   and p.suffix in (".err", ".out", ".log"))


def _assert_told_once(said: str, ids: list[str], sweep_id: str | None) -> None:
    """One warning per logger and run (a sweep's MLflow: one for its set-up), each naming the export that fills it
    in, and nothing else warned."""
    warned = _warnings(said)
    if sweep_id is None:
        for name in LOGGERS:
            assert [w for w in warned if f"{name} stopped logging run {ids[0]}" in w] == \
                [w for w in warned if f"--to {name}`" in w], said
            assert len([w for w in warned if f"--to {name}`" in w]) == 1, said
    else:
        (setup,) = [w for w in warned if "mlflow could not be set up" in w]
        assert f"`flctl export {sweep_id} --to mlflow`" in setup, said
        for name in LOGGERS[1:]:
            for run_id in ids:
                assert len([w for w in warned if f"{name} stopped logging run {run_id}" in w]) == 1, said
    assert len(warned) == (3 if sweep_id is None else 1 + 2 * len(ids)), said


RUN = ["two-moons", "-m", "fl", "--epochs", "2"]
COMMANDS = {"run": ["run", *RUN],
            "sweep-debug": ["sweep", *RUN, "--seeds", "2", "--executor", "debug", "--wait"],
            "sweep-local": ["sweep", *RUN, "--seeds", "2", "--executor", "local", "--workers", "2", "--wait"]}


# Every fault under `run` and under a sweep's debug executor (its set-up and its runs in the command's process);
# the local executor's subprocess workers (each a new interpreter, ~20 s a case here) under the fault that waits
# longest, which is the one whose bound matters: the others fail at once, in the same guarded calls.
CASES = [(command, fault) for command in ("run", "sweep-debug") for fault in FAULTS] + [("sweep-local", "slow")]


@pytest.mark.slow
@pytest.mark.parametrize("command,fault", CASES)
def test_a_failing_tracker_never_holds_training(tmp_path: Path, request: pytest.FixtureRequest, command: str,
                                                fault: str) -> None:
    root = tmp_path / "results"
    _broken_tensorboard(root)
    res, took = _flctl(*COMMANDS[command], *[a for name in LOGGERS for a in ("--log-to", name)],
                       "--results-dir", str(root), env=_env(tmp_path, _uri(fault, request)))
    assert res.returncode == 0, res.stdout + res.stderr
    assert took < bound(LIMIT_S), f"{command} against a {fault} tracker took {took:.0f}s\n{res.stderr}"
    runs = api.runs(results_dir=root)
    assert len(runs) == (1 if command == "run" else 2) and {r.status for r in runs} == {"completed"}, runs
    said = res.stderr + (_worker_logs(root) if command == "sweep-local" else "")
    assert "Traceback" not in said, said
    sweep_id = _sweep_of(root, runs[0].id) if command != "run" else None
    _assert_told_once(said, [r.id for r in runs], sweep_id)
    assert "no W&B API key here" in said and "WANDB_MODE=offline" in said and "WANDB_API_KEY" in said
    if fault == "slow":
        assert f"no answer within {TIMEOUT_S} s" in said
    if command == "run":          # the end line names the export that fills in each logger
        for name in LOGGERS:
            assert (f"{name} did not log 1 run(s) ({runs[0].id}): once it works here, "
                    f"`flctl export {runs[0].id} --to {name}`") in said


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A finished two-cell sweep, logged nowhere, its TensorBoard folder then made a file: (results, sweep id)."""
    root = tmp_path_factory.mktemp("finished") / "results"
    res, _ = _flctl(*COMMANDS["sweep-debug"], "--results-dir", str(root), env=dict(os.environ))
    assert res.returncode == 0, res.stdout + res.stderr
    _broken_tensorboard(root)
    sweep_id = _sweep_of(root, api.runs(results_dir=root)[0].id)
    assert sweep_id is not None
    return root, sweep_id


@pytest.mark.slow
@pytest.mark.parametrize("fault", FAULTS)
def test_an_export_to_a_failing_tracker_is_one_error_line(tmp_path: Path, request: pytest.FixtureRequest,
                                                          finished: tuple[Path, str], fault: str) -> None:
    root, sweep_id = finished
    res, took = _flctl("export", sweep_id, *[a for name in LOGGERS for a in ("--to", name)], "--results-dir",
                       str(root), env=_env(tmp_path, _uri(fault, request)))
    assert res.returncode == 1, res.stdout + res.stderr
    assert took < bound(LIMIT_S), f"export to a {fault} tracker took {took:.0f}s\n{res.stderr}"
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("error: mlflow did not log 2 of 2 run(s) (") and "Traceback" not in res.stderr, line
    for name in LOGGERS[1:]:
        assert f"; {name} did not log 2 of 2 run(s) (" in line
    assert line.endswith(f"`flctl export {sweep_id} --to mlflow --to tensorboard --to wandb` again once it answers")
    assert {r.status for r in api.runs(results_dir=root)} == {"completed"}


def test_the_guard_gives_up_on_a_call_that_never_returns_and_keeps_a_tools_interrupt(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard every tracker call goes through: a call that outlives FLCTL_TRACKER_TIMEOUT_S is a TimeoutError
    within it, and a KeyboardInterrupt a tool raises (a prompt's closed stdin) is that call's failure, not the
    command's."""
    monkeypatch.setenv("FLCTL_TRACKER_TIMEOUT_S", "0.5")
    release = threading.Event()
    started = time.monotonic()
    failure = call_tracker(get_logger("tensorboard"), lambda: release.wait(30))
    assert isinstance(failure, TimeoutError) and time.monotonic() - started < 5
    assert describe(failure) == "TimeoutError: no answer within 0.5 s (FLCTL_TRACKER_TIMEOUT_S)"
    release.set()

    def interrupted() -> None:
        raise KeyboardInterrupt

    assert isinstance(call_tracker(get_logger("tensorboard"), interrupted), KeyboardInterrupt)
    assert call_tracker(get_logger("tensorboard"), lambda: None) is None


@pytest.mark.parametrize("value", ["soon", "0", "-1", "inf", "nan"])
def test_a_bad_tracker_timeout_is_one_line_before_anything_trains(tmp_path: Path, value: str) -> None:
    from tests.helpers import files_under, in_process

    res = in_process("run", *RUN, "--log-to", "tensorboard", "--results-dir", str(tmp_path / "results"),
                     env={"FLCTL_TRACKER_TIMEOUT_S": value})
    assert res.returncode == 2 and res.stderr.strip() == ("error: FLCTL_TRACKER_TIMEOUT_S must be a positive number "
                                                          f"of seconds (e.g. 30), got {value!r}"), res.stderr
    assert files_under(tmp_path) == []


@pytest.mark.slow
def test_wandb_without_a_key_at_a_terminal_is_a_warning_never_a_prompt(tmp_path: Path) -> None:
    """W&B online with no API key asks for one where stdin and stderr are a terminal: under flctl, one warning
    naming WANDB_API_KEY and WANDB_MODE=offline instead, and the run trains on."""
    import pty

    root = tmp_path / "results"
    main, terminal = pty.openpty()
    said: list[bytes] = []

    def read() -> None:                 # the terminal drained, as a user's would be
        while True:
            try:
                chunk = os.read(main, 4096)
            except OSError:             # the process ended and its side of the terminal closed
                return
            if not chunk:
                return
            said.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    started = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "flctl", "run", *RUN, "--log-to", "wandb", "--results-dir",
                               str(root)], env=_env(tmp_path, "http://127.0.0.1:9"), stdin=terminal,
                              stderr=terminal, stdout=subprocess.PIPE, text=True, timeout=10 * LIMIT_S)
    finally:
        os.close(terminal)
        reader.join(timeout=10)
        os.close(main)
    took, text = time.monotonic() - started, b"".join(said).decode(errors="replace")
    assert proc.returncode == 0 and took < bound(LIMIT_S), (took, text)
    assert "Enter your choice" not in text and "Traceback" not in text, text
    (warned,) = [line for line in text.splitlines() if "warning:" in line]
    assert "WANDB_API_KEY" in warned and "WANDB_MODE=offline" in warned, warned
    assert {r.status for r in api.runs(results_dir=root)} == {"completed"}
