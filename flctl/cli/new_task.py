"""`flctl new-task NAME`: a task file of one's own, with its loader, model and a test, that runs at once."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Annotated, Optional

import typer

from flctl.cli.common import console, fail, safe

NAME = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")
# The longest task name: the run database's task column (flctl.db.schema) holds 64 characters.
MAX_NAME = 64

TASK_FILE = '''"""{name}: {description}

A flctl task (docs/extending.md in flctl's repository). Train it with
    FLCTL_TASKS={file} flctl run {name} --method fl --eps 0.1
or install it as a package with an entry point in the group `flctl.tasks`.
Replace the loader and the model with your own; keep sample ids stable (row i is sample id i).
"""

from __future__ import annotations

from flctl.tasks import Task


def load(options: dict, data_dir: str | None):
    """Both splits as tensors. Heavy imports live inside functions, so that planning a sweep stays cheap."""
    import torch
    from sklearn.datasets import make_classification
    from sklearn.model_selection import train_test_split

    from flctl.data import Dataset, Split

    # Tiny synthetic data, fixed by data_seed (never by the run's seed): the same samples in every run.
    x, y = make_classification(n_samples=options["samples"], n_features=8, n_informative=5, n_classes=3,
                               random_state=options["data_seed"])
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.25, stratify=y, random_state=options["data_seed"])

    def split(a, b) -> Split:
        return Split(torch.tensor(a, dtype=torch.float32), torch.tensor(b, dtype=torch.long))

    return Dataset(split(x_tr, y_tr), split(x_te, y_te))


def build_model(options: dict, data):
    from flctl.models import mlp

    return mlp([data.train.x.shape[1], options["hidden"], options["hidden"], 3])


TASK = Task(
    name="{name}",
    kind="classification",
    description="{description}",
    defaults=dict(epochs=20, batch_size=64, optimizer="adamw", lr=1e-3, weight_decay=0.0, eval_every=5,
                  eps=0.1, alpha=1.0, dual_lr=1e-2),
    options=dict(samples=400, hidden=32, data_seed=0),        # -o KEY=VALUE; part of each run's identity
    option_ranges=dict(samples=(10, None), hidden=(1, None), data_seed=(0, None)),
    load=load,
    build_model=build_model,
)
'''

TEST_FILE = '''"""Tests of the {name} task: it loads, and every method trains it and records every sample."""

from pathlib import Path

import pytest

from flctl import api

HERE = Path(__file__).resolve().parent
api.use_tasks(HERE / "{module}.py")


def test_the_data_keep_their_sample_ids() -> None:
    from flctl.tasks import get_task

    task = get_task("{name}")
    first, again = task.load(dict(task.options), None), task.load(dict(task.options), None)
    assert (first.train.x == again.train.x).all() and len(first.train) + len(first.test) == task.options["samples"]


@pytest.mark.parametrize("method", ["erm", "fl", "rfl", "cserm"])
def test_every_method_trains_and_records_each_sample(tmp_path: Path, method: str) -> None:
    run = api.run("{name}", method, epochs=2, eval_every=1, results_dir=tmp_path)
    assert run.status == "completed"
    records = api.records([run], results_dir=tmp_path, split="train", epoch=2)
    assert sorted(records["sample_id"].to_pylist()) == list(range(records.num_rows))
'''


def new_task(
    name: Annotated[str, typer.Argument(help="The task's name: lower-case words joined by '-', e.g. my-task.")],
    directory: Annotated[Optional[Path], typer.Option("--dir", help="Where to write the files [.].")] = None,
    description: Annotated[str, typer.Option(help="One line on the data and the model.")] =
        "3-class synthetic data (scikit-learn make_classification), MLP",
) -> None:
    """Write a task file of your own (loader, model, paper-style defaults) and its test, runnable at once on
    tiny data; flctl finds it through FLCTL_TASKS or an installed package's entry point (docs/extending.md)."""
    from flctl.tasks import listing

    if not NAME.fullmatch(name):
        fail(f"task name {name!r}: use lower-case letters and digits, words joined by '-' (e.g. my-task)")
    if len(name) > MAX_NAME:
        fail(f"task name of {len(name)} characters: at most {MAX_NAME} (the run database holds that many); choose a "
             "shorter name")
    if any(c in description for c in '"\\\n\r'):
        fail("--description: one line without quotes or backslashes")
    if name in {item.task.name for item in listing()}:
        fail(f"a task named {name!r} exists already (see `flctl tasks`); choose another name")
    folder = Path(directory) if directory is not None else Path.cwd()
    module = name.replace("-", "_")
    task_file, test_file = folder / f"{module}.py", folder / f"test_{module}.py"
    where = f"--dir {folder}" if directory is not None else f"this folder ({folder})"
    made = _missing_folders(folder)
    if made is None:
        fail(f"{where} is a file (or lies under one), not a folder; give a folder with --dir")
    written: list[Path] = []
    try:
        for path in (task_file, test_file):
            if path.exists():
                fail(f"{path} exists; nothing was written (choose another --dir or name)")
        folder.mkdir(parents=True, exist_ok=True)
        for path, text in ((task_file, TASK_FILE.format(name=name, description=description, file=task_file)),
                           (test_file, TEST_FILE.format(name=name, module=module))):
            with path.open("x", encoding="utf-8") as handle:        # "x": never over a file that came meanwhile
                written.append(path)
                handle.write(text)
    except OSError as exc:       # read-only, full, a name too long for this file system: leave nothing behind
        for path in written:
            with contextlib.suppress(OSError):
                path.unlink()
        for made_folder in made:
            with contextlib.suppress(OSError):
                made_folder.rmdir()
        fail(f"cannot write {module}.py into {where}: {exc.strerror or exc}; nothing was written (choose another "
             "--dir)")
    console.print(f"wrote {safe(task_file)} and {safe(test_file)}\n"
                  f"  train it:  FLCTL_TASKS={safe(task_file)} flctl run {name} --method fl\n"
                  f"  test it:   python -m pytest {safe(test_file)}")


def _missing_folders(folder: Path) -> list[Path] | None:
    """The folders ``folder.mkdir(parents=True)`` would make, deepest first (removed again when writing fails); None
    when ``folder`` or one of its parents is a file."""
    missing: list[Path] = []
    for path in (folder, *folder.parents):
        try:
            if path.is_dir():
                return missing
            if path.exists():
                return None
        except OSError:          # e.g. a part too long: mkdir says so
            pass
        missing.append(path)
    return missing
