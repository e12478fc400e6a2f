"""Pruning satisfied samples out of the epoch order (paper §4: many samples end with zero multipliers, "which could
be leveraged to improve computational efficiency by pruning these samples").

With ``--prune-after E --prune-patience P``: from epoch E + 1 on, a training sample whose last P visits each left it
satisfied is left out of the epoch order. Satisfied after a visit (``Method.satisfied``): FL and RFL, its multiplier
is 0 after the dual step; CSERM, its loss was at most ε (its gradient is then 0). Eval epochs still evaluate and
record every sample, and a pruned sample whose eval loss is above ε comes back, its streak started over.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


class Pruner:
    """Per-sample streaks of satisfied visits and the pruned set of one run; checkpointed with it."""

    def __init__(self, n_samples: int, after: int, patience: int, device: torch.device | str = "cpu") -> None:
        self.after, self.patience = after, patience
        self.streak = torch.zeros(n_samples, dtype=torch.int64, device=device)   # satisfied visits in a row
        self.pruned = torch.zeros(n_samples, dtype=torch.bool, device=device)

    def visited(self, ids: Tensor, satisfied: Tensor) -> None:
        streak = self.streak.index_select(0, ids)
        self.streak.index_copy_(0, ids, torch.where(satisfied, streak + 1, torch.zeros_like(streak)))

    def epoch_order(self, order: Tensor, epoch: int) -> Tensor:
        """The seeded order of epoch ``epoch`` (0-based) without the pruned samples. Samples are pruned only at
        epoch boundaries, so a resumed run sees the same orders."""
        if epoch < self.after:
            return order
        self.pruned |= self.streak >= self.patience
        return order[~self.pruned[order]]

    def evaluated(self, losses: np.ndarray, eps: float) -> None:
        """After an eval epoch: pruned samples whose loss is above ε come back."""
        back = torch.as_tensor(np.asarray(losses > eps), device=self.pruned.device) & self.pruned
        self.pruned &= ~back
        self.streak.masked_fill_(back, 0)

    def state_dict(self) -> dict:
        return {"streak": self.streak.clone(), "pruned": self.pruned.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.streak.copy_(state["streak"])
        self.pruned.copy_(state["pruned"])
