"""A run field's facts (``FieldSpec``: its help, flags and panel, whether it is a sweep axis and part of the run's
identity, ...) and the checks of a value of it: its type, its ``Bounds``, its choices. flctl.config declares each
field of RunConfig with them (``_field``) and lists them as ``FIELDS``."""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Bounds:
    """The numbers a field takes (checked by flctl.config.validate): at least ``lo`` (above it with ``lo_open``), at
    most ``hi`` (below it with ``hi_open``), and finite. ``says`` is the rule as users read it after "must be", where
    the wording made from the ends is not the one they know."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    says: str = ""

    def holds(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
            return False
        return self.hi is None or (value < self.hi if self.hi_open else value <= self.hi)

    def words(self, value: Any, kind: type) -> str:
        """The rule ``value`` breaks, as the message says it after "must be"."""
        if self.says:
            return self.says
        if kind is float:    # one rule whichever end is passed: a float must also be finite
            if self.lo is not None and self.hi is not None:
                return f"in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}"
            if self.lo is not None:
                return f"a finite number {'>' if self.lo_open else '>='} {self.lo:g}"
            return f"a finite number {'<' if self.hi_open else '<='} {self.hi:g}"
        if self.hi is not None and (self.lo is None or value > self.lo):      # an integer names the end it passed
            return f"{'below' if self.hi_open else 'at most'} {self.hi:,}"
        return f"{'above' if self.lo_open else 'at least'} {self.lo}"


@dataclass(frozen=True)
class FieldSpec:
    """A RunConfig field with its facts, declared once by ``_field`` in RunConfig (flctl.config)."""

    name: str
    kind: type                # float, int or str: how a value or a sweep axis of it is parsed
    default: Any
    help: str
    panel: str                # key of flctl.config.PANELS
    axis: bool                # a sweep may vary it
    identity: bool            # part of the run's id
    flags: tuple[str, ...]    # its command-line option names
    choices: Collection[str]  # the values a text field takes (checked by validate, offered by shell completion)
    bounds: Bounds | None     # the numbers it takes (checked by validate)
    # Added after the first release: left out of the identity while at its default, so that older ids stay valid.
    later: bool
    # Cells that differ in it may still train together (flctl.train.train_together): each cell has its own model,
    # optimizer and multipliers. Cells must agree on every other field.
    per_cell: bool
    # Read only while that field is off its default (kp while dual_optimizer is not gd). While it is at its default,
    # resolve checks this field's value, then sets it back to its own default, so that runs differing only in it are
    # one run (like a method knob its method ignores).
    switched_by: str | None
    # A method knob (one of flctl.method_info.METHOD_FIELDS, which every MethodInfo.reads is checked against): read
    # only by the methods whose reads name it, None in the others' runs.
    method_knob: bool

    @property
    def flag(self) -> str:
        return self.flags[0]

    def type_problem(self, value: Any) -> str | None:
        """What is wrong with the type of ``value`` (None: nothing); None values are not checked."""
        if value is None:
            return None
        ok = (isinstance(value, int) and not isinstance(value, bool)) if self.kind is int else \
            (isinstance(value, (int, float)) and not isinstance(value, bool)) if self.kind is float else \
            isinstance(value, str)
        if ok:
            return None
        return (f"{self.flag} must be {'an integer' if self.kind is int else 'a number' if self.kind is float else 'text'}"
                f", got {value!r}")

    def bound_problem(self, value: Any) -> str | None:
        """What is wrong with the size of a number of the right type (None: nothing, or not a number)."""
        if self.bounds is None or value is None or self.bounds.holds(value):
            return None
        return f"{self.flag} must be {self.bounds.words(value, self.kind)}, got {value}"

    def choice_problem(self, value: Any) -> str | None:
        if not self.choices or value in self.choices:
            return None
        return f"unknown {self.name.replace('_', ' ')} {value!r}; choose one of: {', '.join(self.choices)}"

    def problem(self, value: Any) -> str | None:
        """The first thing wrong with ``value`` for this field (type, then bounds, then choices), or None."""
        return self.type_problem(value) or self.bound_problem(value) or self.choice_problem(value)
