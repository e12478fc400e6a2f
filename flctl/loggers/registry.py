"""Which loggers there are, and finding the ones a command names: flctl's own (``BUILT_IN``) and those an installed
package adds through the entry-point group ``flctl.loggers`` (read by flctl.registry, as launchers are), each found
with its tool installed or refused with the pip command that installs it (``check``, before anything is written)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from flctl.errors import ConfigError
from flctl.loggers.base import Logger
from flctl.registry import entry_names, load_named

GROUP = "flctl.loggers"
BUILT_IN = {"tensorboard": "flctl.loggers.tensorboard:TensorBoard", "mlflow": "flctl.loggers.mlflow:MLflow",
            "wandb": "flctl.loggers.wandb:WandB"}


@dataclass(frozen=True)
class Chosen:
    """The loggers a command was told to log to, each found once (``check``): their classes, in order, each once.
    ``names`` is what travels (a spec's ``log_to``, a worker's recipe, a run's arguments); a process that is given
    only names finds their classes once for its runs (flctl.loggers.session.Logging)."""

    classes: tuple[type[Logger], ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(cls.name for cls in self.classes)

    def __bool__(self) -> bool:
        return bool(self.classes)


def names() -> list[str]:
    """Every logger's name: flctl's own, then installed ones."""
    return entry_names(GROUP, BUILT_IN)


def get_logger(name: str) -> type[Logger]:
    """The logger class named ``name``, its tool installed; ConfigError naming the choices, or the pip command that
    installs its tool."""
    if not isinstance(name, str):
        raise ConfigError(f"--log-to {name!r}: give a logger's name, one of: {', '.join(names())}")
    cls = load_named(GROUP, BUILT_IN, name, "logger", Logger, "unknown logger")
    if cls.needs is not None and importlib.util.find_spec(cls.needs) is None:
        how = install_extra(cls.extra) if cls.extra else f"pip install {cls.needs}"
        raise ConfigError(f"--log-to {name} needs {cls.needs}, which is not installed here: {how}")
    return cls


def check(chosen: str | Iterable[str]) -> Chosen:
    """The loggers named (one name, or a list of them; each once, in order), each found with its tool installed, and
    FLCTL_TRACKER_TIMEOUT_S read where any is (ConfigError otherwise): before anything is written or trained."""
    from flctl.knobs import tracker_timeout_s

    if isinstance(chosen, str):             # one name (a spec's `log_to = "mlflow"`, api's log_to="mlflow")
        chosen = [chosen]
    if not isinstance(chosen, Iterable) or isinstance(chosen, (bytes, dict)):
        raise ConfigError(f"log_to={chosen!r}: give a logger's name or a list of them, from: {', '.join(names())}")
    found = Chosen(tuple(get_logger(name) for name in dict.fromkeys(chosen)))
    if found:
        tracker_timeout_s()
    return found


def where(chosen: Chosen | Iterable[str], results_root: Path) -> str:
    """Where ``chosen`` loggers (found, or by name) write, as one line's end: "tensorboard (results/tensorboard),
    mlflow (...)"."""
    from flctl.text import redact

    classes = chosen.classes if isinstance(chosen, Chosen) else tuple(get_logger(name) for name in chosen)
    return ", ".join(f"{cls.name} ({redact(cls.where(Path(results_root)))})" for cls in classes)


def install_extra(extra: str) -> str:
    """The pip command that installs flctl's ``extra`` where flctl is: from its checkout where it was installed so
    (`pip install -e .`, the README's way: 'flctl[x]' would look for flctl on the package index), else by name."""
    import json
    from importlib.metadata import PackageNotFoundError, distribution
    from urllib.parse import unquote, urlparse

    try:
        direct = json.loads(distribution("flctl").read_text("direct_url.json") or "{}")
    except (PackageNotFoundError, ValueError):
        direct = {}
    url = urlparse(direct.get("url", ""))
    if url.scheme == "file" and direct.get("dir_info", {}).get("editable"):
        return f"pip install -e '{unquote(url.path)}[{extra}]'"
    return f"pip install 'flctl[{extra}]'"
