"""What a sweep's worker claims next (claim_together): the sweep's next cell and up to ``batch_runs - 1`` more that train
together with it (flctl.grouped.policy), each on the device its worker's slot gives it, with their fencing tokens.
A cell whose task this worker cannot load is failed at once, in one line (TaskUnavailable)."""

from __future__ import annotations

import socket
from dataclasses import replace

from flctl.config import RunConfig
from flctl.db import Claim, RunQueue
from flctl.errors import ConfigError
from flctl.launch.backends import Slot
from flctl.launch.recipe import WorkerRecipe

# The cells a worker claimed at once, to train together, each with its claim's fencing token (apart from
# flctl.db.claims.Claim, one cell's claim as the queue hands it, and flctl.claimed.ClaimedRuns, this process's
# claimed runs while they train).
ClaimedTogether = list[tuple[RunConfig, str]]


class TaskUnavailable(Exception):
    """A worker claimed a cell whose task it cannot load (a plugin missing on its node); the cell is failed."""

    def __init__(self, run_id: str, why: str) -> None:
        super().__init__(why)
        self.run_id = run_id


def claim_together(queue: RunQueue, recipe: WorkerRecipe, slot: Slot | None, held: dict[str, str], *,
                   job_id: str | None, git_sha: str | None) -> ClaimedTogether:
    """The next cell of ``recipe``'s sweep, and up to ``batch_runs - 1`` more that can train together with it; [] when
    none is left. ``held`` (run id -> token) gets each claim as it is made, so that a signal between two claims
    finds them all; it is emptied again when the first cell's task cannot be loaded here (TaskUnavailable)."""
    from flctl.grouped.policy import can_train_together
    from flctl.tasks import get_task

    def here(cfg: RunConfig) -> RunConfig:     # on the device its slot gives it (Slot.device)
        return cfg if slot is None else replace(cfg, device=slot.device(cfg.device))

    def claim(most: int = 1, together: str | None = None) -> list[Claim]:
        got = queue.claim_next(recipe.sweep_id, max_attempts=recipe.max_attempts, stale_after=recipe.stale_after,
                               job_id=job_id, git_sha=git_sha, most=most, together=together, held=held)
        return [c._replace(cfg=here(c.cfg)) for c in got]

    got = claim()
    if not got:
        return []
    first = got[0]
    try:
        get_task(first.cfg.task)
    except ConfigError as exc:      # a plugin this node cannot import: one line in the run, no traceback
        why = f"task {first.cfg.task!r} cannot be loaded by the worker on {socket.gethostname()}: {exc}"
        queue.fail_run(first.cfg.run_id, first.token, why, 0.0)
        held.clear()
        raise TaskUnavailable(first.cfg.run_id, why) from None
    # a cell handed back to train alone (its cells together failed, no one cell to blame) is trained alone; the others come
    # with their run's together key (RunConfig.together_id, in SQL), which holds the rule of can_train_together but
    # whether the task trains a model at all
    alone = first.alone or recipe.batch_runs < 2 or not can_train_together([first.cfg, first.cfg])
    more = [] if alone else claim(recipe.batch_runs - 1, together=first.cfg.run_id)
    return [(c.cfg, c.token) for c in (first, *more)]
