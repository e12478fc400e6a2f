"""The methods of grouped cells: the cells of one method class that ``groups`` (flctl.methods.Method.groups) take
their dual step and objective as one (``group_methods``); a class that does not say whether it groups steps its
cells one by one, and is told so once (``say_cell_by_cell``)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from torch import Tensor

from flctl.grouped.rows import side_by_side
from flctl.step import public_tensors
from flctl.text import say_once

if TYPE_CHECKING:
    from flctl.methods import Method


def declared(cls: type) -> bool | None:
    """What ``cls`` itself says of grouping: its own ``groups`` (never an inherited one: a subclass that rewrites the
    rule is not taken to group), or ``stacks``, the name flctl read before, which older plugin methods still declare;
    None where it says nothing."""
    own = vars(cls)
    return own.get("groups", own.get("stacks"))


def group_key(method: Method) -> tuple[bool, str, str]:
    """Methods with equal keys are grouped: one class that ``groups``, with tensors of the same names, shapes and
    types (e.g. all with nuPI or all without) and equal plain values (a setting kept as a Python number is the same
    for every cell of a block). Methods that are not grouped sort first, each stepping alone."""
    cls = type(method)
    if not declared(cls):
        return (False, "", "")
    layout = [(n, tuple(t.shape), str(t.dtype), str(t.device)) for n, t in public_tensors(method)]
    plain = sorted((n, repr(v)) for n, v in vars(method).items()
                   if not n.startswith("_") and not isinstance(v, Tensor) and not hasattr(v, "__dict__"))
    return (True, f"{cls.__module__}.{cls.__qualname__}", repr((layout, plain)))


def say_cell_by_cell(cls: type) -> None:
    """Tell, once per class and process, that grouped cells of ``cls`` (a class that does not say whether it groups)
    take their dual steps and objectives cell by cell: right, but one launch per cell where a grouped class takes
    one for all. A class that declares ``groups = False`` (flctl's CSERM) has decided, and is not told."""
    if declared(cls) is not None:
        return
    say_once(f"flctl: warning: method class {cls.__module__}.{cls.__qualname__} does not declare whether it groups, "
             "so grouped cells of it take their dual steps cell by cell; if its dual_step_, primal_loss and satisfied "
             "work on the last dimension (losses and ids [..., B], primal_loss [K] for [K, B]), set `groups = True` "
             "on the class, else `groups = False` (docs/extending.md)")


def group_methods(methods: Sequence[Method]) -> Method:
    """One method standing for ``methods`` (K of one class that ``groups``, ``group_key`` equal): each tensor of
    theirs (``flctl.step.public_tensors``) side by side, [K, ...], and each method's own a view of its row, so that
    the one's dual_step_ and primal_loss on losses and ids [K, B] move every cell's multipliers as its own would, and
    each cell still checkpoints its own. Its scratch starts empty."""
    def grouped(objs: Sequence[Any]) -> Any:
        one = copy.copy(objs[0])
        for name, value in vars(objs[0]).items():
            if name.startswith("_"):
                if isinstance(value, Tensor):
                    setattr(one, name, None)
            elif isinstance(value, Tensor):
                setattr(one, name, side_by_side(objs, name))
            elif hasattr(value, "__dict__") and not isinstance(value, type):
                setattr(one, name, grouped([getattr(o, name) for o in objs]))
        return one
    return cast("Method", grouped(methods))
