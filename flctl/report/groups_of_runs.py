"""Runs that differ only by seed, and the text of a configuration's values.

The one grouping of runs into configurations (``group_by_config``) and the one formatter of their values
(``distinct_texts``) that tables (flctl.report.tables), figures (flctl.report.plots) and per-sample queries
(flctl.report.samples) share: a table's row, a figure's curve and a query's group are the same runs, ordered the
same way, under the same values.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flctl.config import NOT_IDENTITY
from flctl.devices import SAME_NUMBERS_ENGINES
from flctl.method_info import method_info
from flctl.report.table_specs import KEYS, MAIN, TableSpec

if TYPE_CHECKING:
    from flctl.db import RunRecord

# Fields that never split runs into configurations: the seed is what a group summarizes, method, ε and α are keys
# of their own, a table or figure holds one task, and the rest say where a run executed, not what it computed.
NOT_SPLITTING = frozenset({"task", "seed", "method", "eps", "alpha", *NOT_IDENTITY})
OPTION = "options."   # a task option's name as a field of a configuration: options.degree


def hashable(v: Any) -> Hashable:
    """A config value as a dict key: task options (a dict, maybe holding lists) become sorted tuples."""
    if isinstance(v, dict):
        return tuple((k, hashable(x)) for k, x in sorted(v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(hashable(x) for x in v)
    return v


def value_order(v: Any) -> tuple:
    """Sort key of a config value: numbers by value (1e-3 before 0.01, 25 before 100), None first, then text."""
    if v is None:
        return (0,)
    if isinstance(v, (int, float)):
        return (1, float(v))
    if isinstance(v, tuple):
        return (3, tuple(value_order(x) for x in v))
    return (2, str(v))


@dataclass(frozen=True)
class ConfigKey:
    """What identifies a configuration except the seed: one row of a table, one curve of a figure, one group of a
    per-sample query."""

    method: str
    eps: float | None
    alpha: float | None
    model: Any                               # the task option `model` (a key column of the llm table), or None
    rest: tuple[tuple[str, Any], ...]        # (field, hashable value) of the other fields that vary among the runs

    def sort_key(self, table: TableSpec = MAIN) -> tuple:
        """The configuration's place among ``table``'s rows: by its key columns in their order (the baseline first
        where it says so), then by the other fields that vary."""
        order = method_info(self.method).order
        alpha = math.inf if self.alpha is None or (table.fl_alpha_infinite and self.method == "fl") else self.alpha
        by = {"model": value_order(self.model), "method": order, "eps": -1.0 if self.eps is None else self.eps,
              "alpha": -alpha if table.alpha_descending else alpha}
        first = (order != 0,) if table.baseline_first else ()
        return (*first, *(by[k] for k in table.keys), tuple(value_order(v) for _, v in self.rest))


def _compared(config: dict[str, Any]) -> dict[str, Any]:
    """A stored config as configurations are compared: each task option a field of its own (``options.degree``),
    and an engine that computes the eager step's numbers counted as ``eager`` (its runs share their ids)."""
    flat = {k: v for k, v in config.items() if k != "options"}
    flat.update({f"{OPTION}{k}": v for k, v in (config.get("options") or {}).items()})
    if flat.get("engine") in SAME_NUMBERS_ENGINES:
        flat["engine"] = "eager"
    return flat


def group_by_config(runs: Sequence[RunRecord], ignore: Collection[str] = ()) -> dict[ConfigKey, list[RunRecord]]:
    """The runs by configuration (seeds together), in no order (``ConfigKey.sort_key`` orders them).

    Besides method, ε and α, only fields that take several values among the runs that use them (e.g. a swept lr)
    split groups, except those in ``ignore`` (a heatmap's axes); each task option is a field, ``options.NAME``.
    Values are compared as they are stored, never as they print (lr 0.011 and 0.012 are two configurations)."""
    compared = {r.id: _compared(r.config) for r in runs}
    values_of: dict[str, set[Hashable]] = {}
    for flat in compared.values():
        for name, v in flat.items():
            if name not in NOT_SPLITTING and name not in ignore and v is not None:
                values_of.setdefault(name, set()).add(hashable(v))
    split_by = sorted(name for name, vs in values_of.items() if len(vs) > 1)
    groups: dict[ConfigKey, list[RunRecord]] = {}
    for r in runs:
        flat = compared[r.id]
        key = ConfigKey(r.method, flat.get("eps"), flat.get("alpha"), flat.get(f"{OPTION}model"),
                        tuple((name, hashable(flat.get(name))) for name in split_by))
        groups.setdefault(key, []).append(r)
    return groups


# ---------------------------------------------------------------- the text of a value

def _fixed(v: float, extra: int) -> str:
    """The tables' number style: two decimals, or 1e-03 below 0.01, with ``extra`` more digits."""
    if v == 0 or not math.isfinite(v) or abs(v) >= 0.01:
        return f"{v:.{2 + extra}f}"
    return f"{v:.{extra}e}"


def _scientific(v: float, extra: int) -> str:
    """Compact scientific: 1e-3, 3.2e-3 (one decimal of mantissa, ``extra`` more)."""
    if v == 0 or not math.isfinite(v):
        return f"{v:g}"
    exp = math.floor(math.log10(abs(v)))
    mantissa = round(v / 10**exp, 1 + extra)
    if abs(mantissa) >= 10:   # 9.96e-3 rounds to 10e-3: 1e-2
        mantissa, exp = mantissa / 10, exp + 1
    return f"{mantissa:.{2 + extra}g}e{exp}"


def _compact(floats: Sequence[float]) -> Any:
    """The figures' number style for a set of values: ``%.3g`` when every value reads so without an exponent
    (0.01 to 999), else compact scientific for all, never 0.0316 beside 3.2e-3 on one axis or in one legend."""
    plain = all(1e-2 <= abs(v) < 1e3 for v in floats if math.isfinite(v) and v != 0)
    return lambda v, extra: f"{v:.{3 + extra}g}" if plain else _scientific(v, extra)


def _plain(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, tuple) and all(isinstance(x, tuple) and len(x) == 2 for x in v):   # task options
        return ",".join(f"{a}={b}" for a, b in v)
    return str(v)


def distinct_texts(values: Iterable[Hashable], compact: bool = False) -> dict[Hashable, str]:
    """Each distinct value's text, as short as the values allow while no two distinct values share one.

    Floats of one set share a style, the tables' (0.51, 1e-03) or, ``compact``, the figures' (0.51, 1e-3, 3.2e-3),
    with as many more digits as tell them apart (ε = 0.5108 beside 0.51: 0.5108 and 0.5100); integers in full;
    other values their plain text, with a short hash where two still read the same."""
    distinct = set(values)
    floats = sorted(v for v in distinct if isinstance(v, float))
    style = _compact(floats) if compact else _fixed
    texts: dict[Hashable, str] = {v: repr(v) for v in floats}
    for extra in range(16):
        tried: dict[Hashable, str] = {v: style(v, extra) for v in floats}
        if len(set(tried.values())) == len(tried):
            texts = tried
            break
    texts.update({v: _plain(v) for v in distinct if v not in texts})
    seen: dict[str, list[Hashable]] = {}
    for v, text in texts.items():
        seen.setdefault(text, []).append(v)
    for text, same in seen.items():
        if len(same) > 1:
            for v in same:
                texts[v] = f"{text} #{hashlib.sha1(repr(v).encode()).hexdigest()[:6]}"
    return texts


def number(v: float | None, digits: int = 2) -> str:
    """A table cell's mean or spread: ``digits`` decimals, — when there is none."""
    return "—" if v is None else f"{v:.{digits}f}"


def figure_number(v: float) -> str:
    """One value in a figure (a heatmap cell, a colour-bar tick), in the figures' style: 0.51, 12.3, 3.2e-3."""
    return _compact([v])(v, 0)


# ---------------------------------------------------------------- labels of configurations

@dataclass(frozen=True)
class KeyTexts:
    """A configuration's values as text (``distinct_texts`` over all the configurations shown together)."""

    method: str                          # the method's label: ERM, FL, ...
    eps: str
    alpha: str
    rest: tuple[tuple[str, str], ...]    # (field, text) of ConfigKey.rest


def key_texts(keys: Sequence[ConfigKey], compact: bool = False) -> dict[ConfigKey, KeyTexts]:
    """Each configuration's values written with ``distinct_texts`` per field, so that two configurations never
    read the same."""
    eps = distinct_texts((k.eps for k in keys), compact)
    alpha = distinct_texts((k.alpha for k in keys), compact)
    fields = [name for name, _ in keys[0].rest] if keys else []
    rest = {name: distinct_texts((dict(k.rest)[name] for k in keys), compact) for name in fields}
    return {k: KeyTexts(method_info(k.method).label, eps[k.eps], alpha[k.alpha],
                        tuple((name.removeprefix(OPTION), rest[name][v]) for name, v in k.rest)) for k in keys}


def row_labels(keys: Sequence[ConfigKey], table: TableSpec = MAIN) -> tuple[list[str], dict[ConfigKey, list[str]]]:
    """The key columns of a table and each configuration's texts in them (what per-sample queries name groups by)."""
    texts = key_texts(keys)
    # The other fields that vary, as name=text (a model with a key column of its own is not named twice).
    shown = {f"{OPTION}model"} if "model" in table.keys else set()
    config = {k: ", ".join(f"{name}={text}" for (name, text), (field, _) in zip(texts[k].rest, k.rest)
                           if field not in shown) for k in keys}
    fields = any(config.values())
    out: dict[ConfigKey, list[str]] = {}
    for k in keys:
        t = texts[k]
        text = {"model": str(k.model or "—"), "method": t.method, "eps": t.eps,
                "alpha": "∞" if table.fl_alpha_infinite and k.method == "fl" else t.alpha}
        out[k] = [text[c] for c in table.keys] + ([config[k]] if fields else [])
    return [KEYS[c] for c in table.keys] + (["Config"] if fields else []), out


def curve_labels(keys: Sequence[ConfigKey]) -> dict[ConfigKey, str]:
    """A figure's one-line name of each configuration, "RFL ε=0.1 α=0.01 lr=1e-3": the table's values in the
    figures' compact style, leaving out what the configuration does not read (None)."""
    texts = key_texts(keys, compact=True)
    out: dict[ConfigKey, str] = {}
    for k in keys:
        t = texts[k]
        parts = [t.method]
        parts += [f"ε={t.eps}"] if k.eps is not None else []
        parts += [f"α={t.alpha}"] if k.alpha is not None else []
        parts += [f"{name}={text}" for (name, text), (_, v) in zip(t.rest, k.rest) if v is not None]
        out[k] = " ".join(parts)
    return out
