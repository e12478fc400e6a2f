"""The registries of things declared once by name (methods, report tables, figures, queries): an entry added under
its name, and looked up by it, the same way for each."""

from __future__ import annotations

from typing import TypeVar

from flctl.errors import ConfigError

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
