"""The checks of flctl.api's arguments, one rule each, so that bad input is a ConfigError naming the argument and
what it takes, before anything is written (the results folder and database are flctl.results')."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from flctl.errors import ConfigError

if TYPE_CHECKING:
    from flctl.db import Store

F = TypeVar("F", bound=Callable[..., Any])


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


def check_known(store: Store, task: str | None, method: str | None, *, as_option: bool = False) -> None:
    """``runs`` found nothing: a task or method name that neither flctl nor any recorded run knows is a typo (said
    as an API argument, ``task='x'``, or ``as_option``, ``--task 'x'``, with the closest name)."""
    import difflib

    from flctl.method_info import METHOD_INFO, canonical
    from flctl.tasks import all_tasks, canonical_name

    task = None if task is None else canonical_name(task)
    method = None if method is None else canonical(method)
    for name, value, known, count in (("task", task, all_tasks(), lambda: store.count_runs(task=task)),
                                      ("method", method, list(METHOD_INFO), lambda: store.count_runs(method=method))):
        if value is None or value in known or count():
            continue
        close = difflib.get_close_matches(value, known, n=1)
        said = f"--{name} {value!r}" if as_option else f"{name}={value!r}"
        raise ConfigError(f"{said}: no such {name}" + (f"; did you mean {close[0]!r}?" if close else "")
                          + f" (choose one of: {', '.join(known)})")


class _Unchecked:
    """A name an annotation uses that is imported only for type checkers (RunRecord, Store): such an argument is
    checked by its function, not by ``checked``."""


class _Names(dict):
    def __missing__(self, key: str) -> type:
        return type(key, (_Unchecked,), {})       # keeps its name for what ConfigError says


def annotation(fn: Any, name: str) -> Any:
    """The annotation of ``fn``'s parameter ``name`` as an object (they are strings under `from __future__ import
    annotations`); names imported only for type checkers become _Unchecked."""
    import collections.abc
    import inspect
    import typing

    raw = inspect.signature(fn).parameters[name].annotation
    if not isinstance(raw, str):
        return raw
    import builtins

    scope = _Names({**vars(builtins), **vars(typing), **vars(collections.abc), **fn.__globals__})
    return eval(raw, {}, scope)  # noqa: S307 - flctl's own annotations, not user input


def describe(kind: Any) -> str:
    """What an argument of annotation ``kind`` takes, as a ConfigError says it."""
    import typing

    members = [k for k in typing.get_args(kind) if k is not type(None)] if _is_union(kind) else [kind]
    words = {bool: "True or False", int: "an int", float: "a number", str: "a str", Path: "a Path"}
    said = []
    for k in members:
        origin = typing.get_origin(k) or k
        if k in words:
            said.append(words[k])
        elif origin in (dict, Mapping):
            said.append("a dict")
        elif origin in (list, tuple, Iterable):
            import re

            item = describe(typing.get_args(k)[0]) if typing.get_args(k) else "values"
            said.append("a list of " + re.sub(r"\b(a|an) ", "", item))
        elif origin is Callable:
            said.append("a function")
        else:
            said.append(getattr(k, "__name__", str(k)))
    return " or ".join(dict.fromkeys(said))


def fits(value: Any, kind: Any) -> bool:
    """Whether ``value`` is of annotation ``kind``: exactly, with no reading of "no" as true, of 1 as True, of True
    as 1, or of a str as a list of letters."""
    import typing

    if kind is Any or kind is inspect_empty() or (isinstance(kind, type) and issubclass(kind, _Unchecked)):
        return True
    if _is_union(kind):
        return any(fits(value, k) for k in typing.get_args(kind))
    if kind is type(None):
        return value is None
    if kind is bool:
        return isinstance(value, bool)
    if kind in (int, float):        # numpy's numbers too (np.int64 is no int); a bool or np.bool_ is no number
        import math
        import numbers

        number = isinstance(value, numbers.Integral if kind is int else numbers.Real)
        return number and not isinstance(value, bool) and type(value).__name__ != "bool_" and math.isfinite(value)
    if kind is str:
        return isinstance(value, str)
    if kind is Path:
        return isinstance(value, os.PathLike)
    origin, args = typing.get_origin(kind) or kind, typing.get_args(kind)
    if origin is Callable:
        return callable(value)
    if origin in (dict, Mapping):
        return isinstance(value, Mapping)
    if origin in (list, tuple, Iterable):
        if isinstance(value, (str, bytes)) or not isinstance(value, Iterable) or isinstance(value, Mapping):
            return False
        items = list(value) if isinstance(value, (list, tuple)) else None    # a generator is read once: unchecked
        return items is None or not args or all(fits(v, args[0]) for v in items)
    return isinstance(value, origin) if isinstance(origin, type) else True


def plain(value: Any) -> Any:
    """A numpy number as the Python int or float it holds (what every check below the API expects); anything else
    as it is."""
    import numbers

    if isinstance(value, (bool, int, float)) or not isinstance(value, numbers.Real):
        return value
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def _is_union(kind: Any) -> bool:
    import types
    import typing

    return typing.get_origin(kind) in (typing.Union, types.UnionType)


def inspect_empty() -> Any:
    import inspect

    return inspect.Parameter.empty


def checked(**hints: str) -> Callable[[F], F]:
    """Check every argument of the decorated API function against its annotation before its body runs: a value
    of another kind is one ConfigError, ``name=value: give KIND``, or ``name=value: HINT`` with the function's
    hint for that argument (``hints``, what it takes said in words) — the one place where the API reads a bool, an int, a path or a
    list."""
    import functools
    import inspect
    import typing

    def decorate(fn: F) -> F:
        signature = inspect.signature(fn)
        kinds = {name: annotation(fn, name) for name, p in signature.parameters.items()
                 if p.kind not in (p.VAR_KEYWORD,)}

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError as exc:     # a missing or unknown argument: said as the API says bad input
                raise ConfigError(f"{fn.__name__}(): {exc}") from None
            for name, value in bound.arguments.items():
                kind = kinds.get(name)
                if kind is None:
                    continue
                parameter = signature.parameters[name]
                values = value if parameter.kind is parameter.VAR_POSITIONAL else (value,)
                for one in values:
                    if not fits(one, kind):
                        raise ConfigError(f"{name}={one!r}: {hints.get(name) or 'give ' + describe(kind)}")
                if parameter.kind is not parameter.VAR_POSITIONAL:
                    bound.arguments[name] = plain(value)
            return fn(*bound.args, **bound.kwargs)

        return typing.cast(F, call)

    return decorate

