"""A run field's facts live on the field (flctl.config ``_field``): a field declared there, in one line, is an
option, an axis, a checked value, a stored config key, a report column and an Optuna parameter. The database stores
every field of a run while its id hashes only the identity, so the ids of existing runs do not change."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

import flctl
from flctl import migrations
from flctl.config import FIELDS, RunConfig
from flctl.db import Store
from flctl.db.schema import Run, now
from tests import warm
from tests.helpers import config
from tests.test_migrations import revision, url_for

# The one line that adds a field; Bounds(0, 1, hi_open=True) is a bound of its own (no other field has [0, 1) but nu).
NEW_FIELD = ('    label_smoothing: float = _field(0.0, "Label smoothing of the loss.", "optim", later=True, '
             'bounds=Bounds(0, 1, hi_open=True))\n')
ANCHOR = "    options: tuple[tuple[str, Any], ...] = ()"


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the flctl package with NEW_FIELD inserted into RunConfig: the only change."""
    root = tmp_path_factory.mktemp("with_field")
    shutil.copytree(Path(flctl.__file__).parent, root / "flctl", ignore=shutil.ignore_patterns("__pycache__"))
    source = root / "flctl" / "config.py"
    text = source.read_text()
    assert text.count(ANCHOR) == 1
    source.write_text(text.replace(ANCHOR, NEW_FIELD + ANCHOR))
    return root


def flctl_with_field(package: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``python ARGS`` importing the copy through PYTHONPATH (cwd elsewhere: ``-m`` puts the working folder first on
    the path), as a process forked warm (tests/warm.py lays out sys.path as a new interpreter does)."""
    env = {**os.environ, "PYTHONPATH": str(package), "COLUMNS": "200"}
    return warm.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, timeout=120)


@pytest.mark.slow    # six processes of a copy of flctl with a new field: 6 s
def test_a_field_declared_once_is_everywhere(package: Path, results: Path, tmp_path: Path) -> None:
    def ok(*args: str) -> str:
        res = flctl_with_field(package, tmp_path, "-m", "flctl", *args)
        assert res.returncode == 0, res.stdout + res.stderr
        return res.stdout

    assert "--label-smoothing" in ok("run", "two-moons", "--help")

    plan = ok("sweep", "two-moons", "--label-smoothing", "0,0.1", "--dry-run")
    assert "2 runs; nothing was written" in plan and "label_smoothing" in plan
    assert config("two-moons", "fl").run_id in plan        # at its default the new field leaves the id as it was

    bad = flctl_with_field(package, tmp_path, "-m", "flctl", "run", "two-moons", "--label-smoothing", "1.5")
    assert bad.returncode == 2
    assert bad.stderr.strip() == "error: --label-smoothing must be in [0, 1), got 1.5"

    ok("run", "two-moons", "--label-smoothing", "0.1", "--epochs", "1")
    with sqlite3.connect(results / "flctl.db") as db:
        (stored,) = [json.loads(text) for (text,) in db.execute("SELECT config FROM runs")]
    assert stored["label_smoothing"] == 0.1 and set(stored) == set(RunConfig("t").to_dict()) | {"label_smoothing"}

    ok("report", "--table", "runs", "--format", "csv", "--out", str(tmp_path / "runs.csv"))
    (row,) = csv.DictReader((tmp_path / "runs.csv").open())
    assert row["label_smoothing"] == "0.1"

    study = flctl_with_field(package, tmp_path, "-c", """if True:
        import json
        from flctl.study import search_space, varying
        from flctl.sweep import plan, spec_from_values
        grid = plan(spec_from_values("two-moons", {"label_smoothing": "0,0.1"}), check_data=False)
        tune = search_space(spec_from_values("two-moons", {"label_smoothing": "0.01..0.1"}))["label_smoothing"]
        print(json.dumps({"grid": varying(grid), "tune": [tune.low, tune.high, tune.log]}))""")
    assert study.returncode == 0, study.stderr
    assert json.loads(study.stdout) == {"grid": {"label_smoothing": [0.0, 0.1]}, "tune": [0.01, 0.1, True]}


# Run ids of flctl before the field facts moved onto the fields: (task, method, overrides) -> id.
RECORDED_IDS = [
    ("two-moons", "fl", {}, "874ed8c754e61084"),
    ("two-moons", "erm", {}, "ae8f19af8d81376f"),
    ("two-moons", "erm", {"eps": 0.7}, "ae8f19af8d81376f"),                    # erm reads no ε
    ("two-moons", "rfl", {"alpha": 0.5, "eps": 0.3}, "8ed8f26cd5423e1e"),
    ("digits", "cserm", {}, "ff901099ea1df7d8"),
    ("two-moons", "fl", {"warmup_steps": 10, "precision": "fp32", "micro_batch": 4}, "8a4d3c7e8eea5af0"),
    ("two-moons", "fl", {"dual_optimizer": "nupi", "kp": 1.0, "nu": 0.5}, "482b9bee33d36e31"),
    ("two-moons", "fl", {"kp": 5.0}, "874ed8c754e61084"),                       # gd reads no gains
    ("two-moons", "fl", {"prune_after": 3, "prune_patience": 2}, "366000201b04de7a"),
    ("two-moons", "fl", {"prune_patience": 2}, "874ed8c754e61084"),             # no pruning: patience not read
    ("two-moons", "rfl", {"engine": "compiled"}, "532f0dd15ed0bff1"),
    ("polyfit", "erm", {"options": {"degree": 5}}, "86883a9045c33df2"),
]


@pytest.mark.parametrize(("task", "method", "overrides", "run_id"), RECORDED_IDS)
@pytest.mark.notorch
def test_run_ids_are_those_recorded_before(task: str, method: str, overrides: dict, run_id: str) -> None:
    cfg = config(task, method, **overrides)
    assert cfg.run_id == run_id
    assert RunConfig.from_json(cfg.to_json()) == cfg


@pytest.mark.notorch
def test_switched_off_and_ignored_values_are_still_checked() -> None:
    from flctl.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^--nu must be in \[0, 1\), got 2.0$"):
        config("two-moons", "fl", nu=2.0)                     # gd ignores ν, but 2 is no ν
    with pytest.raises(ConfigError, match=r"^--alpha must be a finite number > 0, got 0.0$"):
        config("two-moons", "erm", alpha=0.0)
    assert config("two-moons", "fl", nu=0.5).nu == FIELDS["nu"].default


def old_stored(cfg: RunConfig) -> dict:
    """What flctl stored as a run's config before revision 0004: its identity plus where it ran."""
    return cfg.identity() | {"device": cfg.device, "data_dir": cfg.data_dir}


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
@pytest.mark.notorch
def test_an_older_database_gets_full_configs_and_keeps_its_ids(tmp_path: Path, backend: str) -> None:
    url = url_for(backend, tmp_path)
    cfgs = [config("two-moons", "fl"), config("two-moons", "erm", seed=3),
            config("two-moons", "fl", dual_optimizer="nupi", kp=1.0, warmup_steps=5),
            config("two-moons", "rfl", engine="compiled", prune_after=2)]
    # more runs than the revision reads at once, so that it pages
    fillers = [RunConfig("two-moons", "erm", seed=s) for s in range(1000, 2001)]
    store = Store.open(url)
    with store.engine.begin() as conn:   # rows as the flctl of revision 0003 wrote them (the same tables)
        conn.execute(sa.insert(Run), [
            {"id": c.run_id, "config_hash": c.config_hash, "task": c.task, "method": c.method, "seed": c.seed,
             "config": old_stored(c), "status": "queued", "epochs_done": 0, "attempts": 0, "created_at": now()}
            for c in cfgs + fillers])
        conn.execute(sa.text("UPDATE flctl_alembic_version SET version_num = '0003'"))
    store.close()
    assert all(set(old_stored(c)) < set(c.to_dict()) for c in cfgs[:2])     # the defaults of later fields were left out

    store = Store.open(url)
    assert revision(url) == migrations.head()
    for c in cfgs + fillers[::250]:
        r = store.get_run(c.run_id)
        # every field, at the value the run used: before revision 0004 a run's engine was eager (the default then;
        # the same run as auto's: engines of the same numbers are not part of the identity)
        used = dataclasses.replace(c, engine="eager") if c.engine == "auto" else c
        assert r is not None and r.config == used.to_dict()
        assert r.cfg == used and r.cfg.run_id == r.id == c.run_id and r.cfg.config_hash == r.config_hash
    assert store.count_runs() == len(cfgs) + len(fillers)
    store.close()


@pytest.mark.notorch
def test_every_later_field_is_filled_in_older_rows_by_a_revision() -> None:
    """A revision that fills later fields writes them out (``LATER``) rather than reading flctl.config, so that it
    does the same to every database. A field declared later=True after it needs a revision of its own: this names
    the field that lacks one."""
    import importlib.util

    filled: dict[str, object] = {}
    for script in sorted((migrations.SCRIPTS / "versions").glob("*.py")):
        spec = importlib.util.spec_from_file_location(f"revision_{script.stem}", script)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        filled.update(getattr(module, "LATER", {}))
    assert filled == {name: f.default for name, f in FIELDS.items() if f.later}
