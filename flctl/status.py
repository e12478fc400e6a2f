"""A run's states, in the order tables list them. Kept apart from flctl.store so the CLI can name them in its help
without importing SQLAlchemy.

- queued: waiting for a worker (never started, or re-queued after its worker was lost)
- running: held by a live worker (or a lost one, until it is found stale)
- interrupted: stopped partway (a signal, `flctl cancel`, a preemption) with a checkpoint; the next claim resumes it
- completed, failed, diverged: finished
"""

STATUSES = ("queued", "running", "interrupted", "completed", "failed", "diverged")
TO_DO = ("queued", "interrupted")      # any claim takes both
