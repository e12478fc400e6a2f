"""The contract of flctl.api, generated from its signatures: every public function, every parameter, given the
values of the wrong kind that its annotation rules out (a str for a bool — "no" is not False —, a bool for an int,
an int for a str or a list, ...) raises one ConfigError of one line and leaves the results folder exactly as it
was. A function that is not under flctl.api_args.checked, or a parameter of a kind this module has no bad values
for, fails test_every_api_parameter_has_a_kind, so a new parameter is in the matrix the day it is added.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

from flctl import api
from flctl.api_args import _Unchecked, annotation
from flctl.errors import ConfigError
from tests.test_bad_input import populated, snapshot, template  # noqa: F401 - fixtures

# flctl.api's functions: those it lists in __all__ (its own, and those of flctl.api_launch it re-exports)
PUBLIC = {name: getattr(api, name) for name in api.__all__ if inspect.isfunction(getattr(api, name))}

# The values each kind rules out (the kinds of a union are taken together: a value is bad for the union when no
# member takes it).
BAD: list[Any] = ["no", "", 1, 1.5, True, float("nan"), b"bytes", ["x"], [5], {"a": 1}, object()]

# Each function called as a user would, with the results folder of the test: the arguments a case keeps.
BASES: dict[str, dict[str, Any]] = {
    "results_root": {}, "database_url": {"db": None, "root": Path("results")}, "use_tasks": {},
    "config": {"task": "two-moons"}, "open_store": {}, "run": {"task": "two-moons", "epochs": 1},
    "sweep": {"task": "two-moons", "dry_run": True}, "paper": {"only": "figure:3", "scale": "smoke", "dry_run": True},
    "runs": {}, "report": {"table": "main"}, "records": {"runs": []}, "reproduce": {"run": "zzzz"},
    "export": {"ref": "zzzz", "to": ["tensorboard"]},
}


def kind_of(fn: Callable, name: str) -> Any:
    return annotation(inspect.unwrap(fn), name)


def members(kind: Any) -> list[Any]:
    import types

    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return [m for k in typing.get_args(kind) for m in members(k)]
    return [kind]


def known(kind: Any) -> bool:
    """A kind whose bad values BAD covers: the plain types, containers of them, functions, or a type only a type
    checker sees (checked by its function)."""
    for m in members(kind):
        origin = typing.get_origin(m) or m
        if m in (bool, int, float, str, Path, type(None), Any) or origin in (dict, Mapping, list, tuple, Iterable,
                                                                                Callable):
            continue
        if isinstance(m, type) and issubclass(m, _Unchecked):
            continue
        return False
    return True


def parameters():
    for fname, fn in sorted(PUBLIC.items()):
        for name, p in inspect.signature(fn).parameters.items():
            if p.kind is not p.VAR_KEYWORD:
                yield fname, fn, name, p


def test_every_api_parameter_has_a_kind() -> None:
    unchecked = [name for name, fn in PUBLIC.items() if not hasattr(fn, "__wrapped__")]
    assert not unchecked, f"put these under flctl.api_args.checked: {unchecked}"
    unknown = [f"{f}({n}: {p.annotation})" for f, fn, n, p in parameters() if not known(kind_of(fn, n))]
    assert not unknown, f"give these a kind this module has bad values for: {unknown}"
    assert set(PUBLIC) <= set(BASES), f"give each new function a base call: {set(PUBLIC) - set(BASES)}"


def cases():
    from flctl.api_args import fits

    for fname, fn, name, _ in parameters():
        kind = kind_of(fn, name)
        for value in BAD:
            if not fits(value, kind):
                yield pytest.param(fname, name, value, id=f"{fname}({name}={'object()' if type(value) is object else repr(value)})")


def test_the_matrix_is_big() -> None:
    assert sum(1 for _ in cases()) > 250


@pytest.mark.usefixtures("no_cuda")
@pytest.mark.parametrize("fname,name,value", list(cases()))
def test_a_value_of_the_wrong_kind_is_one_config_error(template: Path, populated: Path,  # noqa: F811
                                                        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                        fname: str, name: str, value: Any) -> None:
    monkeypatch.setenv("FLCTL_RESULTS", str(populated))
    cwd = tmp_path / "cwd"          # nothing is made in the current folder either
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    fn = PUBLIC[fname]
    args = dict(BASES[fname])
    positional = inspect.signature(fn).parameters[name].kind is inspect.Parameter.VAR_POSITIONAL
    if not positional:
        args[name] = value
    before = snapshot(populated)
    with pytest.raises(ConfigError) as raised:
        fn(value, **args) if positional else fn(**args)
    assert len(str(raised.value).splitlines()) == 1, str(raised.value)
    assert str(raised.value).startswith(f"{name}="), str(raised.value)
    assert snapshot(populated) == before
    assert list(cwd.iterdir()) == []


# The arguments that hold more arguments: api.sweep and api.paper's `launch` (flctl.launch.LaunchFlags, a field
# each) and api.config / api.run's run fields (flctl.config.FIELDS): each key given the values of the wrong kind too.
def nested_cases():
    import dataclasses

    from flctl.api_args import fits
    from flctl.config import FIELDS
    from flctl.launch.settings import LaunchFlags

    hints = typing.get_type_hints(LaunchFlags)
    for f in dataclasses.fields(LaunchFlags):
        kind = hints[f.name]
        if typing.get_origin(members(kind)[0]) is dict:      # --sbatch KEY=VALUE: a table
            kind = dict
        for value in BAD:
            if not fits(value, kind) and not (f.name == "log_to" and isinstance(value, str)):
                yield pytest.param("launch", f.name, value, id=f"launch[{f.name}={_shown(value)}]")
    for name, spec in FIELDS.items():
        kind = spec.kind | None if name not in ("options",) else dict
        for value in BAD:
            if not fits(value, kind):
                yield pytest.param("field", name, value, id=f"config({name}={_shown(value)})")


def _shown(value: Any) -> str:
    return "object()" if type(value) is object else repr(value)


@pytest.mark.usefixtures("no_cuda")
@pytest.mark.parametrize("where,name,value", list(nested_cases()))
def test_a_launch_flag_or_run_field_of_the_wrong_kind_is_one_config_error(populated: Path,  # noqa: F811
                                                                          monkeypatch: pytest.MonkeyPatch,
                                                                          where: str, name: str, value: Any) -> None:
    monkeypatch.setenv("FLCTL_RESULTS", str(populated))
    before = snapshot(populated)
    with pytest.raises(ConfigError) as raised:
        if where == "launch":
            api.sweep("two-moons", method="erm", epochs=1, dry_run=True, launch={name: value})
        else:
            api.config("two-moons", "fl", **{name: value})
    assert len(str(raised.value).splitlines()) == 1, str(raised.value)
    assert snapshot(populated) == before


def test_what_a_user_holds_is_taken_numpy_numbers_and_paths_included(populated: Path,  # noqa: F811
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks refuse the wrong kind, not the right kind in another dress: numpy's integers and floats where an
    int or a number is annotated, a Path where a folder is, a tuple where a list is."""
    import numpy as np

    monkeypatch.setenv("FLCTL_RESULTS", str(populated))
    plan = api.sweep("two-moons", method="erm", epochs=1, seeds=np.int64(2), data_dir=None, dry_run=True,
                     launch={"workers": 1})
    assert len(plan.configs) == 2
    assert api.paper(only="figure:3", scale="smoke", data_dir=Path("d"), dry_run=True) is not None
    found = api.report(table="main", task="two-moons", k=np.int64(16), eps=np.float32(0.5),
                       columns=("train.avg_loss",))
    assert found.table is not None
    with pytest.raises(ConfigError, match=r"^k=np.True_|^k=True"):
        api.report(table="main", k=np.bool_(True))
