"""The checks of flctl.api's arguments, one rule each, so that bad input is a ConfigError naming the argument and
what it takes, before anything is written; and the results folder an API call makes, taken back when what follows
fails (as `flctl` does: flctl.cli.common.open_results)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flctl.errors import ConfigError

if TYPE_CHECKING:
    from flctl.db import Store


def check_fields(task, fields: dict[str, Any]) -> None:
    """A field ``config`` does not know: a task option passed as a field, or a typo (with the closest field)."""
    import dataclasses
    import difflib

    from flctl.config import RunConfig

    known = {f.name for f in dataclasses.fields(RunConfig)} - {"task", "method"}
    for name in fields:
        if name in known:
            continue
        if name in task.options:
            raise ConfigError(f"{name!r} is an option of task {task.name!r}, not a run field: pass "
                              f"options={{{name!r}: ...}}")
        if name in ("task", "method"):
            raise ConfigError(f"{name} is config's own argument: config(task, method, ...), not a field")
        close = difflib.get_close_matches(name, sorted(known), n=1)
        raise ConfigError(f"unknown run field {name!r}" + (f"; did you mean {close[0]!r}?" if close else
                                                           f"; the fields are: {', '.join(sorted(known))}"))
    options = fields.get("options")
    if options is not None and not isinstance(options, dict):
        raise ConfigError(f"options={options!r}: give the task options as a dict, e.g. options={{'degree': 10}}")


# what an argument takes, said by every function that has it
PATH = (str, os.PathLike)
DEVICE = "give a device's name, a str: cpu, cuda, cuda:N or auto"
LAUNCH = "give the launch flags as a dict by name, e.g. launch={'executor': 'debug'}"


def check_arg(name: str, value: Any, kind: type | tuple[type, ...], takes: str) -> None:
    """ConfigError ``name=value: takes`` unless ``value`` is None or a ``kind``. A bool is no int here (True is no
    number of trials), though Python counts it as one."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if value is not None and (not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)):
        raise ConfigError(f"{name}={value!r}: {takes}")


def make_results(root: Path) -> list[Path]:
    """Make the results folder ``root`` (ConfigError where it cannot be); the folders this made, deepest first, for
    ``take_back`` should what follows fail."""
    from flctl.layout import Layout

    not_a_file(root)
    if (why := Layout(root).not_a_folder()) is not None:
        raise ConfigError(why)
    absolute = root.absolute()
    made = [p for p in (absolute, *absolute.parents) if not p.exists()]
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        take_back(made)
        raise ConfigError(f"results_dir {str(root)!r} cannot be made ({exc.strerror or exc}); give a folder "
                          "you can write") from None
    return made


def not_a_file(root: Path) -> None:
    """ConfigError where the results folder ``root`` is a regular file."""
    if root.exists() and not root.is_dir():
        raise ConfigError(f"results_dir {str(root)!r} is a file, not a folder; give a folder")


def take_back(made: list[Path]) -> None:
    """Remove the folders ``make_results`` made, deepest first, while they are empty: never another's files (a
    folder another process began to fill meanwhile stays)."""
    for folder in made:
        try:
            folder.rmdir()
        except OSError:
            break


def check_known(store: Store, task: str | None, method: str | None) -> None:
    """``runs`` found nothing: a task or method name that neither flctl nor any recorded run knows is a typo."""
    from flctl.method_info import METHOD_INFO
    from flctl.tasks import all_tasks

    if task is not None and task not in all_tasks() and not store.count_runs(task=task):
        raise ConfigError(f"task={task!r}: no such task; choose one of: {', '.join(all_tasks())}")
    if method is not None and method not in METHOD_INFO and not store.count_runs(method=method):
        raise ConfigError(f"method={method!r}: no such method; choose one of: {', '.join(METHOD_INFO)}")


def in_memory(url: str) -> bool:
    if not url.startswith("sqlite"):
        return False
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:       # Store.open says what is wrong with it
        return False
    return parsed.get_backend_name() == "sqlite" and (
        not parsed.database or parsed.database == ":memory:" or parsed.query.get("mode") == "memory"
        or parsed.database.startswith("file::memory:"))
