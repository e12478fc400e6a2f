"""Runs logged where researchers look (flctl.loggers), read back with each tool's own reader: TensorBoard's event
files with its EventAccumulator, MLflow through a real `mlflow server` on loopback and MlflowClient, W&B's offline
run file with its protobuf records. Live (--log-to) and after the fact (flctl export) give the same numbers; an
export again adds no duplicates; a logger not installed is one line before anything trains; a logger that fails
never fails the training."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flctl import api
from tests.helpers import files_under, in_process, wait_until

pytestmark = pytest.mark.slow

EPOCHS, EVERY = ["--epochs", "6", "--eval-every", "3"], [3, 6]


def needs(*tools: str) -> None:
    """Skip where a tracker is not installed (its extra: `pip install -e '.[dev]'` installs all three, as CI does;
    an image built from another requirements list may not)."""
    for tool in tools:
        pytest.importorskip(tool)


def scalars(folder: Path, tag: str) -> list[tuple[int, float]]:
    """A tag's (step, value) pairs in a TensorBoard run folder, as TensorBoard reads them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def every_scalar(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag's (step, value) pairs in a TensorBoard run folder, and each histogram's steps."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    return {**{tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]},
            **{f"histogram {tag}": [(e.step, e.histogram_value.num) for e in acc.Histograms(tag)]
               for tag in acc.Tags()["histograms"]}}


def histograms(folder: Path) -> list[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"histograms": 0})
    acc.Reload()
    return acc.Tags()["histograms"]


def test_a_run_logged_live_to_tensorboard_is_what_its_records_say(tmp_path: Path) -> None:
    needs("tensorboard")
    root = tmp_path / "results"
    res = in_process("run", "two-moons", "-m", "fl", *EPOCHS, "--log-to", "tensorboard", "--results-dir", str(root))
    assert res.returncode == 0, res.stdout + res.stderr
    run = api.runs(results_dir=root)[0]
    folder = root / "tensorboard" / "runs" / run.id
    logged = scalars(folder, "train.avg_loss")
    assert [step for step, _ in logged] == EVERY
    assert logged[-1][1] == pytest.approx(run.metrics["train.avg_loss"], rel=1e-6)
    assert [s for s, _ in scalars(folder, "epoch.train_avg_loss")] == EVERY     # the training batches, at each eval
    assert scalars(folder, "train.violation_rate")[-1][1] == pytest.approx(run.metrics["train.violation_rate"])
    lam = api.records([run], results_dir=root, split="train", epoch=6)["multiplier"].to_numpy()
    assert scalars(folder, "multipliers.max")[-1][1] == pytest.approx(float(lam.max()), rel=1e-6)
    assert histograms(folder) == ["multipliers"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mlflow_server(tmp_path: Path):
    """A real MLflow tracking server on loopback (its own SQLite store), stopped by its PID."""
    needs("mlflow", "tensorboard")
    port = _free_port()
    store = tmp_path / "mlflow-server"
    store.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                             "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}",
                             "--default-artifact-root", str(store / "artifacts"), "--workers", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"

    def up() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_until(up, "the MLflow server to listen", timeout=120, interval=0.3,
                   explain=lambda: proc.stderr.read() if proc.poll() is not None else "")
        yield uri
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)


def test_a_sweep_logged_live_to_mlflow_and_tensorboard_exports_the_same_numbers(tmp_path: Path,
                                                                                 mlflow_server: str) -> None:
    from mlflow.tracking import MlflowClient

    root = tmp_path / "results"
    env = {"MLFLOW_TRACKING_URI": mlflow_server, "MLFLOW_EXPERIMENT_NAME": "moons"}
    res = in_process("sweep", "two-moons", "-m", "erm,fl", "--seeds", "2", *EPOCHS, "--log-to", "tensorboard",
                     "--log-to", "mlflow", "--workers", "2", "--wait", "--results-dir", str(root), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    runs = {r.id: r for r in api.runs(results_dir=root)}
    client = MlflowClient(tracking_uri=mlflow_server)
    experiment = client.get_experiment_by_name("moons").experiment_id

    def logged() -> dict[str, dict]:
        found = {}
        for m in client.search_runs([experiment]):
            rid = m.data.tags["flctl.run_id"]
            assert rid not in found, f"run {rid} logged twice"
            found[rid] = {"params": m.data.params, "tags": m.data.tags, "status": m.info.status,
                          "metrics": {key: [(h.step, h.value) for h in client.get_metric_history(m.info.run_id, key)]
                                      for key in m.data.metrics}}
            found[rid]["loss"] = found[rid]["metrics"]["test.avg_loss"]
        return found

    live = logged()
    assert set(live) == set(runs)
    for rid, row in live.items():
        assert row["status"] == "FINISHED" and row["params"]["method"] == runs[rid].method
        assert row["params"]["seed"] == str(runs[rid].seed) and row["tags"]["flctl.task"] == "two-moons"
        assert "version.torch" in row["tags"] and row["tags"]["flctl.sweep_id"]
        assert [s for s, _ in row["loss"]] == EVERY
        assert row["loss"][-1][1] == pytest.approx(runs[rid].metrics["test.avg_loss"], rel=1e-6)
    sid = next(iter(live.values()))["tags"]["flctl.sweep_id"]
    tb = {rid: every_scalar(root / "tensorboard" / sid / rid) for rid in runs}
    assert all({"test.avg_loss", "epoch.train_avg_loss", "histogram multipliers"} <= set(tb[rid]) for rid in runs
               if runs[rid].method == "fl")
    for _ in range(2):                 # after the fact, twice: the same numbers, and no run logged twice
        res = in_process("export", sid, "--to", "mlflow", "--to", "tensorboard", "--results-dir", str(root), env=env)
        assert res.returncode == 0 and f"exported {len(runs)} run(s) to mlflow ({mlflow_server}, experiment moons), " \
            f"tensorboard (`tensorboard --logdir {root / 'tensorboard'}`)" in " ".join(res.stdout.split()), res.stdout
        exported = logged()
        # every key at every step, the epoch's training-batch numbers too (the record file keeps them)
        assert {rid: row["metrics"] for rid, row in exported.items()} == \
            {rid: row["metrics"] for rid, row in live.items()}
        assert all({"epoch.train_avg_loss", "epoch.train_max_loss"} <= set(row["metrics"]) for row in exported.values())
        assert {rid: every_scalar(root / "tensorboard" / sid / rid) for rid in runs} == tb


def wandb_records(run_dir: Path) -> list:
    """The records of a W&B offline run file (run-<id>.wandb): W&B's protobuf records in the LevelDB log layout
    it writes them in (32 KiB blocks; a 7-byte ':W&B' header; each record's 7-byte header: CRC, length, type)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = next(run_dir.glob("run-*.wandb")).read_bytes()
    assert data[:4] == b":W&B"
    pos, out, parts = 7, [], b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:
            pos += 32768 - pos % 32768
            continue
        length, kind = struct.unpack("<HB", data[pos + 4:pos + 7])
        parts += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):                 # a whole record, or the last piece of one
            out.append(pb.Record.FromString(parts))
            parts = b""
    return out


def wandb_history(root: Path, run_id: str) -> tuple[list, list[dict]]:
    """A W&B offline run's records, and its history rows without what differs between two logs of one run (when
    they were made, not what they hold)."""
    (folder,) = (root / "wandb" / "wandb").glob(f"offline-run-*-{run_id}")
    records = wandb_records(folder)
    history = [{(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    return records, [{k: v for k, v in h.items() if k not in ("_timestamp", "_runtime") and not k.startswith("_wandb")}
                     for h in history]


def test_a_run_logged_offline_to_wandb_holds_its_metrics_and_config_and_exports_the_same(tmp_path: Path) -> None:
    needs("wandb")
    root = tmp_path / "results"
    env = {"WANDB_MODE": "offline", "WANDB_PROJECT": "moons", "WANDB_SILENT": "true"}
    res = in_process("run", "two-moons", "-m", "fl", *EPOCHS, "--log-to", "wandb", "--results-dir", str(root),
                     env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    run = api.runs(results_dir=root)[0]
    records, live = wandb_history(root, run.id)
    evaluated = [h for h in live if "train.avg_loss" in h]
    assert [h["_step"] for h in evaluated] == EVERY and "epoch.train_max_loss" in evaluated[-1]
    assert evaluated[-1]["train.avg_loss"] == pytest.approx(run.metrics["train.avg_loss"], rel=1e-6)
    assert evaluated[-1]["multipliers/_type"] == "histogram"
    config = {u.key: json.loads(u.value_json) for r in records if r.WhichOneof("record_type") == "run"
              for u in r.run.config.update}
    assert config["method"] == "fl" and config["flctl"]["flctl.run_id"] == run.id
    assert next(r for r in records if r.WhichOneof("record_type") == "run").run.project == "moons"
    # exported after the fact: the live log key for key, step for step (the histograms' bins too)
    res = in_process("export", run.id, "--to", "wandb", "--results-dir", str(root), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert wandb_history(root, run.id)[1] == live


FAULTY = '''
from flctl.loggers import Logger


class Flaky(Logger):
    """Starts, then fails at its second epoch: a server gone mid-run."""

    name = "flaky"

    def start(self, run):
        self.seen = 0

    def log(self, epoch, scalars, multipliers=None):
        self.seen += 1
        if self.seen == 2:
            raise ConnectionError("server at 127.0.0.1:9 went away")

    def finish(self, status):
        pass


class Steady(Logger):
    """Logs every call it is given, in this process (``calls``): a tracker that always answers."""

    name = "steady"
    calls = []

    def start(self, run):
        self.calls.append("start")

    def log(self, epoch, scalars, multipliers=None):
        self.calls.append(epoch)

    def finish(self, status):
        self.calls.append(status)


class Missing(Logger):
    name = "missing"
    needs = "no_such_tracker_module"
    extra = "missing"
'''


@pytest.fixture
def installed_loggers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    (site / "toy_loggers-0.1.dist-info").mkdir(parents=True)
    (site / "toy_loggers.py").write_text(textwrap.dedent(FAULTY))
    (site / "toy_loggers-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: toy\nVersion: 0.1\n")
    (site / "toy_loggers-0.1.dist-info" / "entry_points.txt").write_text(
        "[flctl.loggers]\nflaky = toy_loggers:Flaky\nmissing = toy_loggers:Missing\nsteady = toy_loggers:Steady\n")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    yield
    sys.modules.pop("toy_loggers", None)


def test_a_logger_that_fails_mid_run_never_fails_the_training(tmp_path: Path, installed_loggers: None) -> None:
    root = tmp_path / "results"
    res = in_process("run", "two-moons", "-m", "fl", *EPOCHS, "--log-to", "flaky", "--results-dir", str(root))
    assert res.returncode == 0, res.stdout + res.stderr
    run = api.runs(results_dir=root)[0]
    assert run.status == "completed"
    assert res.stderr.count("flaky stopped logging run") == 1 and "server at 127.0.0.1:9 went away" in res.stderr
    assert f"`flctl export {run.id} --to flaky`" in res.stderr and "flaky did not log 1 run(s)" in res.stderr
    assert len(api.records([run], results_dir=root, split="train")) == 2 * 1000        # two evals, intact


def test_an_installed_loggers_class_is_found_once_for_its_runs_not_at_each_call(tmp_path: Path, installed_loggers: None,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """An installed logger is found by reading the entry points: once where the command checks --log-to, its class
    then held by the run's session (flctl.loggers.session.Logging), and once by a worker's session, given names; never
    at each of the calls a run makes of it (its start, each evaluation, its finish)."""
    import flctl.plugins
    from flctl.loggers import Logging

    read: list[str] = []
    entry_points = flctl.plugins.entry_points
    monkeypatch.setattr(flctl.plugins, "entry_points", lambda group: read.append(group) or entry_points(group))
    run = api.run("two-moons", "fl", results_dir=tmp_path / "results", epochs=6, eval_every=3, threads=1,
                  log_to="steady")
    assert run.status == "completed"
    steady = sys.modules["toy_loggers"].Steady
    assert steady.calls == ["start", 3, 6, "completed"] and read.count("flctl.loggers") == 1, (steady.calls, read)

    read.clear()
    session = Logging(["steady"], tmp_path / "results", "a-sweep")         # a worker's: the names its recipe carries
    for cfg in (api.config("two-moons", "fl", seed=seed) for seed in (1, 2)):
        session.start(cfg)
        session.log(cfg.run_id, 1, {"train.avg_loss": 0.5})
        session.finish(cfg.run_id, "completed")
    assert not session.not_logged and read.count("flctl.loggers") == 1, (session.why, read)


def test_an_installed_logger_named_like_flctls_own_is_said_to_be_unused_once(installed_loggers: None, monkeypatch,
                                                                            capsys) -> None:
    import flctl.text
    from flctl.loggers import get_logger
    from flctl.loggers.tensorboard import TensorBoard

    monkeypatch.setattr(flctl.text, "_MET", set())     # once per process: this process may have looked
    dist = next(p for p in sys.path if (Path(p) / "toy_loggers-0.1.dist-info").is_dir())
    (Path(dist) / "toy_loggers-0.1.dist-info" / "entry_points.txt").write_text("[flctl.loggers]\ntensorboard = "
                                                                               "toy_loggers:Flaky\n")
    importlib.invalidate_caches()
    assert get_logger("tensorboard") is TensorBoard and get_logger("tensorboard") is TensorBoard
    said = capsys.readouterr().err
    assert said.count("the installed logger 'tensorboard' (toy_loggers:Flaky) is not used: flctl's own") == 1, said


@pytest.mark.parametrize("where", ["run", "sweep", "export"])
def test_a_logger_not_installed_is_one_line_naming_the_pip_command(tmp_path: Path, installed_loggers: None,
                                                                   where: str) -> None:
    root = tmp_path / "results"
    args = {"run": ["run", "two-moons", "--log-to", "missing"],
            "sweep": ["sweep", "two-moons", "-m", "fl", "--seeds", "2", "--log-to", "missing", "--wait"],
            "export": ["export", "abcd", "--to", "missing"]}[where]
    res = in_process(*args, *EPOCHS[:2] if where != "export" else (), "--results-dir", str(root))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    # flctl installed from its checkout (`pip install -e .`, as CI and the README do): the command names the checkout,
    # since 'flctl[missing]' would look for flctl on the package index
    editable = json.loads(importlib.metadata.distribution("flctl").read_text("direct_url.json") or "{}").get(
        "dir_info", {}).get("editable")
    how = f"pip install -e '{Path(__file__).resolve().parents[1]}[missing]'" if editable else \
        "pip install 'flctl[missing]'"
    assert res.stderr.strip() == f"error: --log-to missing needs no_such_tracker_module, which is not installed here: {how}"
    assert files_under(tmp_path) == sorted(p for p in files_under(tmp_path) if "site" in p.parts)
    unknown = in_process(*["nosuch" if a == "missing" else a for a in args], *EPOCHS[:2] if where != "export" else (),
                         "--results-dir", str(root))
    assert unknown.returncode == 2 and "unknown logger 'nosuch'; choose one of: tensorboard, mlflow, wandb" in \
        unknown.stderr


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run installs it)")
def test_tensorboard_served_on_loopback_shows_a_sweeps_runs_in_a_browser(tmp_path: Path) -> None:
    """A two-moons sweep logged live to TensorBoard, `tensorboard --logdir RESULTS/tensorboard` served on loopback
    (stopped by its PID) and opened in chromium: each run of the sweep is listed, and its scalars are drawn.
    FLCTL_SCREENSHOT=PATH keeps the screenshot (docs/figures/tensorboard.png was made so)."""
    needs("tensorboard", "playwright")
    from playwright.sync_api import sync_playwright

    root = tmp_path / "results"
    res = in_process("sweep", "two-moons", "-m", "erm,fl", "--seeds", "2", "--epochs", "60", "--eval-every", "6",
                     "--log-to", "tensorboard", "--wait", "--results-dir", str(root))
    assert res.returncode == 0, res.stdout + res.stderr
    ids = [r.id for r in api.runs(results_dir=root)]
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(root / "tensorboard"),
                               "--host", "127.0.0.1", "--port", str(port), "--reload_interval", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    shot = Path(os.environ.get("FLCTL_SCREENSHOT") or tmp_path / "tensorboard.png")
    try:
        def up() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        wait_until(up, "TensorBoard to listen", timeout=120, interval=0.3)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"http://127.0.0.1:{port}/#timeseries")
            for run_id in ids:                     # the runs selector lists sweep/run for every run of the sweep
                page.get_by_text(run_id, exact=False).first.wait_for(timeout=60_000)
            page.get_by_role("combobox", name="Filter tags (regex)").fill("^(test.avg_loss|train.violation_rate|"
                                                                "multipliers.mean)$")
            if page.get_by_text("Settings", exact=True).count():      # its settings pane open: closed
                page.keyboard.press("Escape")
            page.locator("canvas, svg.line-chart, .line-chart").first.wait_for(timeout=60_000)
            page.wait_for_timeout(2000)            # the charts' lines drawn
            page.screenshot(path=str(shot))
            listed = page.content()
            browser.close()
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)
    assert all(run_id in listed for run_id in ids)
    assert shot.stat().st_size > 20_000


@pytest.mark.parametrize("where", ["top", "launch"])
def test_a_specs_log_to_logs_its_sweep(tmp_path: Path, where: str) -> None:
    """`log_to = [...]` at the top of a spec or in its [launch] table, as --log-to."""
    needs("tensorboard")
    line = 'log_to = ["tensorboard"]\n'
    spec = tmp_path / "moons.toml"
    spec.write_text('task = "two-moons"\nmethod = ["fl"]\nseeds = 2\nepochs = 3\n' + (line if where == "top" else "")
                    + '[launch]\nexecutor = "debug"\n' + (line if where == "launch" else ""))
    root = tmp_path / "results"
    res = in_process("sweep", "--spec", str(spec), "--results-dir", str(root))
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(p.name for p in root.glob("tensorboard/*/*")) == sorted(r.id for r in api.runs(results_dir=root))


def test_a_logged_launch_over_finished_cells_says_how_to_log_them(tmp_path: Path) -> None:
    """--log-to logs what a launch trains; a sweep that grows over cells finished before says so, with the export
    that logs them (before: 2 of 6 runs of the README's example were logged, silently)."""
    root = tmp_path / "results"
    first = in_process("sweep", "two-moons", "-m", "erm", *EPOCHS, "--executor", "debug", "--results-dir", str(root))
    assert first.returncode == 0, first.stdout + first.stderr
    grown = in_process("sweep", "two-moons", "-m", "erm", "--seeds", "2", *EPOCHS, "--executor", "debug",
                       "--log-to", "tensorboard", "--results-dir", str(root))
    assert grown.returncode == 0, grown.stdout + grown.stderr
    line = [x for x in grown.stdout.splitlines() if x.startswith("--log-to logs")]
    assert len(line) == 1 and "the 1 finished before are logged by `flctl export " in line[0] \
        and "--to tensorboard`" in line[0], grown.stdout
    assert len({p.parent for p in (root / "tensorboard").rglob("events.out.tfevents.*")}) == 1     # one run logged
    # and where it went, with the command that reads it
    assert f"logging to tensorboard (`tensorboard --logdir {root / 'tensorboard'}`)" in grown.stdout, grown.stdout
    ran = in_process("run", "two-moons", "-m", "erm", "--seed", "5", *EPOCHS, "--log-to", "tensorboard",
                     "--results-dir", str(root))
    assert ran.stdout.strip().splitlines()[-1] == f"logged to tensorboard (`tensorboard --logdir {root / 'tensorboard'}`)"
