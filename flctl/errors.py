"""The errors flctl raises on purpose, in one light module: any layer raises them without importing another
layer (config, store, migrations), and the CLI turns each into one `error:` line with exit code 2."""

from __future__ import annotations


class ConfigError(ValueError):
    """Bad user input (a run configuration, a sweep, a spec, a report request); the message is one line and names
    the fix."""


class StoreError(RuntimeError):
    """The database cannot be used (unreachable, corrupt, other schema); the message is one line."""


class OlderSchema(StoreError):
    """A command that only reads met a database from an older flctl (`flctl migrate` upgrades it)."""


class NewerSchema(RuntimeError):
    """The database was written by a newer flctl (its revision is not among ours)."""


class ClaimLost(RuntimeError):
    """This process no longer holds a run's claim: it was presumed lost (no heartbeat for longer than the stale
    bound) and another worker took the run over. It must stop without touching the run's files or row."""
