"""What each learning method is, without torch: the one description that config validation, `flctl methods`,
the tables and the figures read. The torch class that trains a method (flctl.methods) registers against its
entry here by name.

Adding a method: one ``describe(MethodInfo(...))`` call here (or in your own module, before use) and one
``@register`` subclass of ``flctl.methods.Method`` with the same ``name``. A method in its own package: an entry
point in the group ``flctl.methods`` naming its ``MethodInfo``, whose ``impl`` says where the class is; it is
described when this module loads and its class imported when a run trains it (docs/extending.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from flctl import plugins
from flctl.plugins import Source
from flctl.registry import add

# The RunConfig fields a method may read besides the shared ones (the method knobs); a field a method does not read
# is stored as None, so that e.g. ERM runs that differ only in eps are the same run (same hash) and a sweep does not
# multiply them by that axis. Declared here, not on the fields, because every MethodInfo is checked against it and
# flctl.config imports this module; config marks the fields from it (FieldSpec.method_knob).
METHOD_FIELDS = ("eps", "alpha", "dual_lr")


@dataclass(frozen=True)
class MethodInfo:
    name: str                  # as on the command line and in the database
    label: str                 # in tables and legends
    order: int                 # position in tables and legends (ascending)
    reads: frozenset[str]      # which of METHOD_FIELDS it uses
    rule: str                  # its update rule in words, for `flctl methods`
    cmap: str = "Purples"      # matplotlib colormap: one hue per method, shades for its eps/alpha variants
    linestyle: str = "-"
    impl: str | None = None    # "module:Class" of a plugin's torch class (flctl.methods.get_method imports it)

    def __post_init__(self) -> None:
        if not self.reads <= set(METHOD_FIELDS):
            raise ValueError(f"method {self.name!r} reads unknown field(s) {sorted(self.reads - set(METHOD_FIELDS))}")

    @property
    def has_multipliers(self) -> bool:
        """One Lagrange multiplier per sample, moved by a dual step (FL, RFL)."""
        return "dual_lr" in self.reads


METHOD_INFO: dict[str, MethodInfo] = {}
METHOD_SOURCES: dict[str, Source] = {}     # a plugin method's name -> its package (flctl's own: flctl.methods)


def describe(info: MethodInfo) -> MethodInfo:
    """Add ``info`` to the methods flctl knows (flctl.methods registers each torch class against its entry)."""
    return add(METHOD_INFO, info.name, info, "method")


def method_source(name: str) -> Source:
    """Where method ``name``'s code comes from (what a run records as its provenance)."""
    return METHOD_SOURCES.get(name) or plugins.module_source("flctl.methods")


def canonical(name: str) -> str:
    """A method's name as flctl stores it, whoever reads it (a run's -m, a sweep's axis, a filter of runs, a report's
    --methods): ``name`` where a method is so named, else the one method named so in another case (FL, as the paper
    writes it, is fl); else ``name`` as given, for its reader to refuse or to match a run recorded under it."""
    if name in METHOD_INFO:
        return name
    same = [m for m in METHOD_INFO if m.casefold() == name.casefold()]
    return same[0] if len(same) == 1 else name


def method_info(name: str) -> MethodInfo:
    """The description of ``name``; a method no longer described (a database from elsewhere) gets a plain one."""
    return METHOD_INFO.get(name) or MethodInfo(name, name, len(METHOD_INFO), frozenset(), "")


describe(MethodInfo("erm", "ERM", 0, frozenset(), "mean loss", cmap="Greys", linestyle="-"))
describe(MethodInfo("fl", "FL", 1, frozenset({"eps", "dual_lr"}), "λ ← [λ + η(g−ε)]₊ ; min Σ λ·g",
                    cmap="Blues", linestyle="-"))
# FL and RFL often coincide (small multipliers, or α large): a dashed RFL keeps the FL line under it visible.
describe(MethodInfo("rfl", "RFL", 2, frozenset({"eps", "alpha", "dual_lr"}), "λ ← [λ + η(g−ε−λ/α)]₊ ; min Σ λ·g",
                    cmap="Oranges", linestyle="--"))
describe(MethodInfo("cserm", "CSERM", 3, frozenset({"eps", "alpha"}), "(α/2)·mean([g−ε]₊²)",
                    cmap="Greens", linestyle="-."))


def _load_plugins() -> None:
    """The methods installed packages declare (entry point group ``flctl.methods``), each a problem line when
    it is not a usable MethodInfo, so that flctl's own methods always load."""
    for info, source in plugins.method_infos():
        key = f"method {source.entry_point}"
        if not isinstance(info, MethodInfo) or info.impl is None:
            plugins.report(key, f"plugin method {source.where()} is not a MethodInfo with impl='module:Class'")
            continue
        source = _with_impl(source, info.impl)
        if info.name in METHOD_INFO and info.name not in METHOD_SOURCES:
            plugins.report(key, f"plugin method {info.name!r} from {source.where()} has a built-in method's name; "
                                "ignored: rename it")
        elif info.name in METHOD_SOURCES and METHOD_SOURCES[info.name] != source:
            plugins.report(key, f"method {info.name!r} is defined twice: by {METHOD_SOURCES[info.name].where()} "
                                f"and by {source.where()}; the second is ignored")
        else:
            try:
                describe(info)
            except ValueError as exc:
                plugins.report(key, f"plugin method {source.where()}: {exc}")
                continue
            METHOD_SOURCES[info.name] = source


def _with_impl(source: Source, impl: str) -> Source:
    """``source`` whose hash also covers the module of the method's class (``impl``), found without importing it
    (it imports torch): a changed update rule is other code, as a changed MethodInfo is."""
    import dataclasses
    import importlib.util

    try:
        spec = importlib.util.find_spec(impl.partition(":")[0])
    except (ImportError, ValueError):
        return source          # get_method says why when a run asks for it
    if spec is None or spec.origin is None or spec.origin == source.file:
        return source
    return dataclasses.replace(source, also=(spec.origin,))


_load_plugins()
