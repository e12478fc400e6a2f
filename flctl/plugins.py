"""Where tasks and methods come from, and the record of it that each run keeps.

Three sources, in this order:

- flctl's own (the ``flctl_tasks`` package, the methods of flctl.methods);
- installed packages, through the entry point groups ``flctl.tasks`` (``name = "module:TASK"``) and
  ``flctl.methods`` (``name = "module:INFO"``, a ``MethodInfo`` whose ``impl`` names its torch class);
- task files or modules named by ``FLCTL_TASKS`` (a path list, like PATH: ``.py`` files, folders of them, or dotted
  module names) and by a sweep spec's ``task_module``, each defining ``TASK``.

A module is imported once per process. One that fails to import is reported as one line (``problems()``) and
the others load; an entry that names no file or folder is also said at once, as one warning line on stderr; a task
name defined twice is refused, naming both sources, by the commands that use it and flagged by `flctl tasks`
(flctl.tasks). A plugin's import writes nothing to stdout: what it prints goes to stderr (``_plugin_code``), so a
command's output (`flctl tasks --json`) stays its own.

No torch here: a plugin module, like flctl's own tasks, imports torch inside its functions.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from flctl.text import said, say_once

T = TypeVar("T")

ENV = "FLCTL_TASKS"
TASK_GROUP, METHOD_GROUP = "flctl.tasks", "flctl.methods"

_extra: list[str] = []                        # added in process: a spec's task_module, a worker's plugin list
_modules: dict[str, ModuleType] = {}          # plugin path or module name -> its module, once imported
_problems: dict[str, str] = {}                # plugin -> one line saying why it did not load


@dataclass(frozen=True)
class Source:
    """Where a task or method's code lives: what a run records about it (``provenance``)."""

    origin: str                   # "built-in" | "entry point" | "file" | "module" (named by FLCTL_TASKS or a spec)
    module: str
    file: str | None
    distribution: str | None = None
    version: str | None = None
    entry_point: str | None = None    # "module:ATTR" as the package declares it
    # other files whose code the name runs: a plugin method's torch class, when it lives beside its MethodInfo
    also: tuple[str, ...] = ()

    @property
    def sha256(self) -> str | None:
        """A hash of the module file's source (and of ``also``'s): two runs of the same name with different code
        differ here."""
        if self.file is None:
            return None
        try:
            h = hashlib.sha256(Path(self.file).read_bytes())
            for other in self.also:
                h.update(Path(other).read_bytes())
        except OSError:
            return None
        return h.hexdigest()

    def where(self) -> str:
        """One short phrase for listings and errors."""
        if self.origin == "built-in":
            return "built-in"
        if self.origin == "entry point":
            return f"package {self.distribution or '?'} {self.version or ''}".rstrip() + f" ({self.entry_point})"
        return f"file {self.file}" if self.origin == "file" else f"module {self.module}"

    def provenance(self) -> dict[str, Any]:
        return {"origin": self.origin, "module": self.module, "file": self.file, "sha256": self.sha256,
                "distribution": self.distribution, "version": self.version, **({"also": list(self.also)} if self.also
                                                                               else {})}


def paths() -> list[str]:
    """The plugin entries in use: FLCTL_TASKS's, then those added in this process, without repeats."""
    listed = [p for p in os.environ.get(ENV, "").split(os.pathsep) if p.strip()]
    return list(dict.fromkeys(listed + _extra))


def add(entries: Iterable[str]) -> None:
    """Use these plugin entries (paths or module names) in this process as if FLCTL_TASKS named them."""
    for entry in entries:
        if entry and entry not in _extra:
            _extra.append(entry)


def resolve_entry(entry: str, relative_to: Path | None = None) -> str:
    """A spec's ``task_module``: a path (absolute, or relative to the spec's folder) or a dotted module name."""
    if is_path(entry):
        path = Path(entry).expanduser()
        if not path.is_absolute() and relative_to is not None:
            path = relative_to / path
        return str(path.resolve())
    return entry


def report(key: str, line: str) -> None:
    """Note a plugin that loaded but is not usable (e.g. its TASK is not a Task)."""
    _problems[key] = line


def warn(key: str, line: str) -> None:
    """Note a problem and say it now, once per process: ``flctl: warning: LINE`` on stderr (the command goes on)."""
    _problems[key] = line
    say_once(_warning(line))


def _warning(line: str) -> str:
    return f"flctl: warning: {line}"


def problems(*, unsaid: bool = False) -> list[str]:
    """One line per plugin that did not load (import error, no TASK, a bad entry point, a path that is not there);
    ``unsaid``: only those not yet written to stderr (``warn``)."""
    return [line for line in _problems.values() if not (unsaid and said(_warning(line)))]


def check(entry: str) -> list[str]:
    """Import one plugin entry (a path or module name) now, as a command that uses it would: a line for each thing
    wrong with it (a module that does not import, or defines no TASK); none when it loads."""
    lines = [f"plugin {key} defines no TASK; a task file ends with `TASK = Task(...)`"
             for key, module in _path_modules(entry) if getattr(module, "TASK", None) is None]
    keys = [entry]
    if is_path(entry):
        path = Path(entry).expanduser().resolve()
        keys += [str(p) for p in (sorted(path.glob("*.py")) if path.is_dir() else [path])]
    return [_problems[k] for k in keys if k in _problems] + lines


def task_modules() -> Iterator[tuple[Any, Source]]:
    """(the module's TASK, where it came from) for every plugin task: entry points first, then FLCTL_TASKS."""
    for ep in entry_points(TASK_GROUP):
        obj = _load_entry_point(ep)
        if obj is not None:
            yield obj, _entry_source(ep, obj)
    for entry in paths():
        for key, module in _path_modules(entry):
            task = getattr(module, "TASK", None)
            if task is None:
                _problems[key] = f"plugin {key} defines no TASK; a task file ends with `TASK = Task(...)`"
                continue
            yield task, Source("file" if is_path(entry) else "module", module.__name__,
                               getattr(module, "__file__", None), *_distribution(module.__name__))


def method_infos() -> Iterator[tuple[Any, Source]]:
    """(MethodInfo, where it came from) for every method an installed package declares."""
    for ep in entry_points(METHOD_GROUP):
        obj = _load_entry_point(ep)
        if obj is not None:
            yield obj, _entry_source(ep, obj)


def module_source(module_name: str, origin: str = "built-in") -> Source:
    """The Source of a module by name, without importing it (flctl's own tasks and methods)."""
    spec = importlib.util.find_spec(module_name)
    return Source(origin, module_name, spec.origin if spec else None, *_distribution(module_name))


def load_object(target: str) -> Any:
    """``module:attr`` imported (a plugin method's torch class); one-line ConfigError when it cannot be."""
    from flctl.errors import ConfigError

    module_name, _, attr = target.partition(":")
    try:
        return getattr(_plugin_code(lambda: importlib.import_module(module_name)), attr)
    except Exception as exc:
        raise ConfigError(f"cannot load {target}: {_one_line(exc)}") from None


# ---- loading ----

def _plugin_code(do: Callable[[], T]) -> T:
    """Run a plugin's import (the one place flctl does): what it prints goes to stderr, not stdout, which holds the
    command's own output (`flctl tasks --json` is read by programs)."""
    with contextlib.redirect_stdout(sys.stderr):
        return do()


def is_path(entry: str) -> bool:
    try:
        return entry.endswith(".py") or os.sep in entry or "/" in entry or Path(entry).is_dir()
    except OSError:          # a name no file system takes (ENAMETOOLONG): no folder, so a module's name
        return False


def entry_points(group: str) -> list[importlib.metadata.EntryPoint]:
    """The entry points installed packages declare in ``group``, by name: the one read of them, for tasks and methods
    here and for launchers and loggers (flctl.registry)."""
    return sorted(importlib.metadata.entry_points(group=group), key=lambda ep: ep.name)


def _load_entry_point(ep: importlib.metadata.EntryPoint) -> Any:
    key = f"entry point {ep.name} = {ep.value}"
    if key in _problems:
        return None
    try:
        return _plugin_code(ep.load)
    except Exception as exc:
        dist = ep.dist.metadata["Name"] if ep.dist is not None else "?"
        _problems[key] = f"plugin {ep.value} (package {dist}, group {ep.group}) failed to import: {_one_line(exc)}"
        return None


def _entry_source(ep: importlib.metadata.EntryPoint, obj: Any) -> Source:
    module = sys.modules.get(ep.module)
    return Source("entry point", ep.module, getattr(module, "__file__", None),
                  ep.dist.metadata["Name"] if ep.dist is not None else None,
                  ep.dist.version if ep.dist is not None else None, ep.value)


def _path_modules(entry: str) -> Iterator[tuple[str, ModuleType]]:
    """The modules one FLCTL_TASKS entry stands for, imported once; failures go to ``_problems``."""
    if not is_path(entry):
        module = _import(entry, lambda: importlib.import_module(entry))
        if module is not None:
            yield entry, module
        return
    from flctl.text import path_problem

    if (why := path_problem(f"{ENV} entry", entry)) is not None:
        warn(entry, f"{why}; ignored")
        return
    path = Path(entry).expanduser().resolve()
    if path.is_dir():
        files = sorted(p for p in path.glob("*.py") if not p.name.startswith("_"))
    elif path.is_file():
        files = [path]
    else:
        named = entry in os.environ.get(ENV, "").split(os.pathsep)
        warn(entry, f"{ENV + ' entry' if named else 'plugin'} {entry!r}: no such file or folder; ignored (fix the "
                    f"path{' or remove it from ' + ENV if named else ''})")
        return
    for file in files:
        module = _import(str(file), lambda f=file: _import_file(f))
        if module is not None:
            yield str(file), module


def _import(key: str, do) -> ModuleType | None:
    if key in _modules:
        return _modules[key]
    if key in _problems:
        return None
    try:
        module = _plugin_code(do)
    except Exception as exc:
        _problems[key] = f"plugin {key} failed to import: {_one_line(exc)}"
        return None
    _modules[key] = module
    return module


def _import_file(file: Path) -> ModuleType:
    # A unique name per file (two folders may both hold my_task.py); in sys.modules, so that pickling and
    # dataclasses resolve the module's own names.
    name = f"flctl_plugin_{file.stem}_{hashlib.sha1(str(file).encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"not a Python file: {file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


@functools.cache
def _distributions() -> Mapping[str, list[str]]:
    return importlib.metadata.packages_distributions()


# flctl's own top-level packages (pyproject's packages): their distribution is known, without reading every installed
# distribution's file list, which costs each process that trains ~0.2 s.
OWN_PACKAGES = ("flctl", "flctl_tasks")


@functools.cache     # once per process and package: a worker records it with each cell (2 ms of metadata each time)
def _distribution(module_name: str) -> tuple[str | None, str | None]:
    """The installed distribution that provides a module's top-level package, and its version (as this process
    found it: the code it runs was imported then)."""
    top = module_name.split(".")[0]
    names = ["flctl"] if top in OWN_PACKAGES else _distributions().get(top) or []
    for name in names:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None, None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        return f"no module named {exc.name!r}"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
