"""Owners' tensors made the rows of one tensor (``side_by_side``): how a group's epoch losses, batches and method
state become one tensor [K, ...] while each cell keeps reading and changing its own row."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor


def side_by_side(owners: Sequence[Any], name: str, dim: int = 0) -> Tensor:
    """The owners' tensors ``name`` (attributes, or dict entries) stacked along ``dim``, each owner's replaced by a
    view of its row. 0-dim tensors become [K, 1], to broadcast over a batch [K, B]; each owner keeps a 0-dim view."""
    def get(o: Any) -> Tensor:
        return o[name] if isinstance(o, dict) else getattr(o, name)
    first = get(owners[0])
    group = torch.stack([get(o) for o in owners], dim)
    if first.dim() == 0:
        group = group.unsqueeze(1)
    for k, o in enumerate(owners):
        row = group.select(dim, k).view(first.shape)
        if isinstance(o, dict):
            o[name] = row
        else:
            setattr(o, name, row)
    return group
