"""What each learning method is, without torch: the one description that config validation, `flctl methods`,
the tables and the figures read. The torch class that trains a method (flctl.methods) registers against its
entry here by name.

Adding a method: one ``describe(MethodInfo(...))`` call here (or in your own module, before use) and one
``@register`` subclass of ``flctl.methods.Method`` with the same ``name``.
"""

from __future__ import annotations

from dataclasses import dataclass

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

    def __post_init__(self) -> None:
        if not self.reads <= set(METHOD_FIELDS):
            raise ValueError(f"method {self.name!r} reads unknown field(s) {sorted(self.reads - set(METHOD_FIELDS))}")

    @property
    def has_multipliers(self) -> bool:
        """One Lagrange multiplier per sample, moved by a dual step (FL, RFL)."""
        return "dual_lr" in self.reads


METHOD_INFO: dict[str, MethodInfo] = {}


def describe(info: MethodInfo) -> MethodInfo:
    if info.name in METHOD_INFO and METHOD_INFO[info.name] != info:
        raise ValueError(f"method {info.name!r} is already described differently")
    METHOD_INFO[info.name] = info
    return info


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
