"""The rules every option of every command meets, checked on the command line's words before click reads them.

click gives an option that takes a value the next word, whatever it is: `flctl run two-moons --results-dir
--dry-run` trained into ./--dry-run/, and `flctl sweep ... --name --dry-run` launched a sweep named "--dry-run".
An empty value (`--name "$UNSET"`) and a number that is not one (`--eps nan`) went through the same door. Here, one
place refuses them for every command, as one `error:` line and exit 2 (flctl.cli's group prints a UsageError so),
before anything is read or written. `--name=--odd` (the value glued on with `=`) still takes a value that starts
with a dash, on purpose. An option of one value given twice with two values (`-m fl -m erm`) was the last one
without a word, as -o KEY=VALUE was: it is refused here too, once click has read the words.

The kind of each option (its Python type) is read from the command function's signature, as typer reads it; the
contract tests (tests/test_contract_cli.py) walk the same signatures."""

from __future__ import annotations

import inspect
import math
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from typer.core import TyperCommand

from flctl.text import path_problem

# The longest value any option takes (a path's longest, PATH_MAX - 1); a longer one is a pasted file or a loop gone
# wrong, and would land whole in a database row or an error line.
LONGEST_VALUE = 4095
# Every integer flctl takes counts something (epochs, workers, samples, seconds) or is a seed: none needs more than
# a signed 32-bit integer, which every database column, numpy seed and C int holds.
LARGEST_INT = 2**31 - 1


def kind_of(annotation: Any) -> Any:
    """The type an option's annotation holds: Annotated and Optional taken off (`Optional[list[str]]` -> list[str])."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and args:
        return kind_of(args[0]) if len(args) == 1 else annotation
    return annotation


def kinds(command: Any) -> dict[str, Any]:
    """Each parameter of a click command made by typer, by its name, with its Python type (kind_of)."""
    callback = getattr(command, "callback", None)
    if callback is None:
        return {}
    params = inspect.signature(callback, eval_str=True).parameters
    return {name: kind_of(p.annotation) for name, p in params.items()}


def takes_value(param: Any) -> bool:
    """An option given as `--opt VALUE` (not a flag, not a counter)."""
    return getattr(param, "param_type_name", "") == "option" and not getattr(param, "is_flag", False) \
        and not getattr(param, "count", False)


def looks_like_option(word: str) -> bool:
    """`--dry-run`, `-m`: a word that is an option, not a value; a negative number (`-0.1`, `-1e-3`, `-.5..1`) or
    text with a space (`--description "-fast variant"`) is a value."""
    return len(word) > 1 and word.startswith("-") and not (word[1].isdigit() or word[1] == ".") and " " not in word


def problem(flag: str, value: str, kind: Any, *, glued: bool) -> str | None:
    """Why ``value`` cannot be the value of ``flag`` (an option of Python type ``kind``), or None."""
    if value == "" or not value.strip():
        return f"{flag} was given an empty value; give one (an unset shell variable?)"
    if not glued and looks_like_option(value):
        glue = f" (or write {flag}={value} for a value that starts with a dash)" if flag.startswith("--") else ""
        return f"{flag} needs a value, and {value} is an option; give the value after {flag}{glue}"
    if len(value) > LONGEST_VALUE:
        return f"{flag}'s value is {len(value):,} characters long; flctl takes at most {LONGEST_VALUE:,}"
    if kind in (int, float):
        try:
            number = kind(value)
        except ValueError:
            return None         # click says it is not an integer, or not a number
        if kind is int and abs(number) > LARGEST_INT:
            return f"{flag} must be at most {LARGEST_INT:,}, got {value}"
        if kind is float and not math.isfinite(number):
            return f"{flag} must be a finite number, got {value!r}"
    if kind is Path:
        return path_problem(flag, value)
    return None


def _values(command: Any, args: list[str]) -> Iterator[tuple[str, str, bool, Any]]:
    """Each value option in ``args`` (a command's own words) as (flag, value, glued with `=`, its click parameter),
    up to ``--``; a value missing at the end is left to click ("requires an argument")."""
    by_flag = {flag: param for param in command.params if takes_value(param)
               for flag in (*param.opts, *param.secondary_opts)}
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--":                            # what follows is arguments, however it looks
            return
        flag, glued, value = word.partition("=")
        if glued and flag.startswith("--") and flag in by_flag:
            yield flag, value, True, by_flag[flag]
        elif word in by_flag:
            if i + 1 < len(args):
                yield word, args[i + 1], False, by_flag[word]
            i += 1
        i += 1


def check_words(command: Any, args: list[str]) -> str | None:
    """The first option in ``args`` (a command's own words) whose value breaks a rule (``problem``), as one line."""
    types = kinds(command)
    for flag, value, glued, param in _values(command, args):
        if (why := problem(flag, value, types.get(param.name), glued=glued)) is not None:
            return why
    return None


def given_twice(command: Any, args: list[str]) -> str | None:
    """The first option of one value given twice in ``args`` with two values, as one line: click keeps the last
    without a word, and `flctl sweep -m fl -m erm` planned a grid of erm alone. The same value twice is one value;
    a repeatable option (-o) checks its own pairs (flctl.cli.common.parse_options)."""
    seen: dict[str, tuple[str, str]] = {}
    for flag, value, _, param in _values(command, args):
        if getattr(param, "multiple", False):
            continue
        first = seen.setdefault(param.name, (flag, value))
        if first[1] != value:
            return f"{first[0]} is given twice, as {first[1]!r} and {value!r}; give it once"
    return None


class Command(TyperCommand):
    """Every flctl command: typer's, with its words checked (check_words) before click parses them, and an option
    given twice with two values (given_twice) refused after."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if (why := check_words(self, args)) is not None:
            raise _usage_error(why, ctx)
        words = list(args)              # click consumes the list it is given
        rest = super().parse_args(ctx, args)
        # after click's own checks, so that a value it refuses (`--epochs abc`) is told as that
        if (why := given_twice(self, words)) is not None:
            raise _usage_error(why, ctx)
        return rest


def _usage_error(message: str, ctx: Any) -> Exception:
    # typer >= 0.29 vendors click (typer._click); older typer uses click itself
    try:
        from typer._click.exceptions import UsageError
    except ImportError:
        from click.exceptions import UsageError  # type: ignore[assignment,no-redef]
    return UsageError(message, ctx=ctx)
