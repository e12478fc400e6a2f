"""The registries of things declared once by name (methods, report tables, figures, queries): an entry added under
its name, and looked up by it, the same way for each. Kinds that installed packages add to through an entry-point
group (launchers, loggers) are read by one set of functions: entry_names, entry_target, load_named."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TypeVar

from flctl import plugins
from flctl.errors import ConfigError
from flctl.text import first_time

T = TypeVar("T")


def add(registry: dict[str, T], name: str, entry: T, what: str) -> T:
    """Put ``entry`` in ``registry`` under ``name``: the same entry twice is one entry; another one under a name
    already taken is a ValueError (two definitions of one name, found as their modules load)."""
    if name in registry and registry[name] != entry:
        raise ValueError(f"{what} {name!r} is already registered differently")
    registry[name] = entry
    return entry


def find(registry: dict[str, T], name: str, what: str) -> T:
    """The entry named ``name``; ConfigError listing the names when there is none."""
    if name not in registry:
        raise ConfigError(f"unknown {what} {name!r}; choose one of: {', '.join(registry)}")
    return registry[name]


def entry_names(group: str, built_in: Mapping[str, str]) -> list[str]:
    """Every name of a kind of plugin whose own are ``built_in`` (name -> "module:attr"): flctl's own, then those
    installed packages declare in the entry-point group ``group`` (flctl.launchers, flctl.loggers)."""
    return list(built_in) + [ep.name for ep in plugins.entry_points(group) if ep.name not in built_in]


def entry_target(group: str, built_in: Mapping[str, str], name: str, kind: str) -> str | None:
    """Where the plugin ``name`` of entry-point ``group`` lives ("module:attr"; None: no such name). flctl's own comes
    first: an installed one of the same name is not used, and said once per process on stderr (the ``kind``, e.g.
    "launcher", names it). The one reader of installed launchers and loggers; tasks and methods refuse such a clash
    (flctl.tasks, flctl.method_info)."""
    if name not in built_in:
        return next((ep.value for ep in plugins.entry_points(group) if ep.name == name), None)
    if first_time(("clash", group, name)):          # looked at once: entry points take ms to read
        for ep in plugins.entry_points(group):
            if ep.name == name and ep.value != built_in[name]:
                print(f"flctl: warning: the installed {kind} {name!r} ({ep.value}) is not used: flctl's own "
                      f"{name!r} comes first; install it under another name", file=sys.stderr, flush=True)
    return built_in[name]


def load_named(group: str, built_in: Mapping[str, str], name: str, kind: str, base: type[T], unknown: str) -> type[T]:
    """The class of plugin ``name`` (entry_target: flctl's own first), a subclass of ``base`` whose ``name`` is
    ``name``. ConfigError "``unknown`` NAME; choose one of: ..." where there is none of that name, and one naming its
    target where that is not such a class."""
    target = entry_target(group, built_in, name, kind)
    if target is None:
        raise ConfigError(f"{unknown} {name!r}; choose one of: {', '.join(entry_names(group, built_in))}")
    cls = plugins.load_object(target)
    if not (isinstance(cls, type) and issubclass(cls, base) and getattr(cls, "name", None) == name):
        raise ConfigError(f"{target} is not a {base.__module__}.{base.__qualname__} subclass named {name!r}")
    return cls

