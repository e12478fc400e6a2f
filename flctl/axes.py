"""A sweep's axes as the command line and spec files give them: ``1e-4..1`` (one log-spaced point per decade),
``1e-4..1:9`` (nine), ``0,0.51`` (a list), parsed to the values of the RunConfig field they vary (flctl.sweep
multiplies them into a grid)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from flctl.config import AXIS_FIELDS, FIELDS
from flctl.errors import ConfigError

# The RunConfig fields a sweep may vary (flctl.config.FIELDS), plus p_min, which sets eps.
AXES = (*AXIS_FIELDS, "p_min")
FLOAT_AXES = tuple(a for a in AXES if a == "p_min" or FIELDS[a].kind is float)
INT_AXES = tuple(a for a in AXES if a != "p_min" and FIELDS[a].kind is int)
# A log range gives at most this many points: a typo (1e-4..1:100000) should not plan for minutes or fill a cluster.
MAX_AXIS_POINTS = 10_000


def parse_float_axis(name: str, text: str) -> list[float]:
    """``a..b`` one log-spaced point per decade, ``a..b:n`` n log-spaced points, ``x,y,z`` a list."""
    text = str(text).strip()
    if ".." in text:
        lo_text, _, rest = text.partition("..")
        hi_text, colon, n_text = rest.partition(":")
        try:
            lo, hi = float(lo_text), float(hi_text)
        except ValueError:
            raise ConfigError(f"--{axis_flag(name)} {text!r}: a range is LOW..HIGH[:N] with numbers, "
                              "e.g. 1e-4..1 or 1e-4..1:9") from None
        if not (lo > 0 and hi > 0 and math.isfinite(lo) and math.isfinite(hi)):
            raise ConfigError(f"--{axis_flag(name)} {text!r}: a log range needs positive finite ends")
        decades = abs(math.log10(hi / lo))
        if colon:
            try:
                n = int(n_text)
            except ValueError:
                raise ConfigError(f"--{axis_flag(name)} {text!r}: the point count after ':' must be an integer") from None
            if n > MAX_AXIS_POINTS:
                raise ConfigError(f"--{axis_flag(name)} {text!r}: at most {MAX_AXIS_POINTS:,} points")
            if n < 1 or (n == 1 and lo != hi):
                raise ConfigError(f"--{axis_flag(name)} {text!r}: needs at least 2 points between different ends")
        else:
            n = max(1, round(decades) + 1) if lo != hi else 1
        if n == 1:
            return [lo]
        step = math.log10(hi / lo) / (n - 1)
        return [_round_sig(lo * 10 ** (k * step)) for k in range(n)]
    return _parse_list(name, text, float, "numbers like 0,0.51 or a range 1e-4..1")


def _parse_list(name: str, text: str, convert: Callable[[str], Any], expected: str) -> list[Any]:
    """A comma-separated list of values of one type. An empty item (`0.1,,0.2`, `0.1,`) is an error: it is a value
    left out by mistake more often than not, and the grid would quietly lose it."""
    items = [v.strip() for v in str(text).split(",")]
    if not any(items):
        raise ConfigError(f"--{axis_flag(name)} is empty")
    if not all(items):
        raise ConfigError(f"--{axis_flag(name)} {text!r}: an empty item between commas; expected {expected}")
    try:
        return [convert(v) for v in items]
    except ValueError:
        raise ConfigError(f"--{axis_flag(name)} {text!r}: expected {expected}") from None


def parse_axis(name: str, value: Any) -> list[Any]:
    """One axis from CLI text or a spec value (a TOML list, number or string)."""
    if name not in AXES:
        raise ConfigError(f"unknown axis {name!r}; axes: {', '.join(AXES)}, seeds, options")
    if isinstance(value, list):
        if not value:
            raise ConfigError(f"axis {name!r} is an empty list")
        return [v for item in value for v in parse_axis(name, item)]
    text = str(value)
    if name in FLOAT_AXES:
        return parse_float_axis(name, text)
    if name in INT_AXES:
        return _parse_list(name, text, int, "integers like 0,1,2")
    return _parse_list(name, text, str, "names like erm,fl")  # the str fields


def axis_flag(name: str) -> str:
    """The command-line option of axis ``name`` without its leading dashes (``p_min``: p-min)."""
    return name.replace("_", "-")


def _round_sig(x: float, digits: int = 12) -> float:
    """Round away float noise of 10**k so 1e-4..1 gives exactly 0.0001, 0.001, ... (stable run hashes)."""
    return float(f"{x:.{digits}g}")
