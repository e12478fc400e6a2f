"""flctl: Feasible Learning experiment orchestrator."""

__version__ = "0.1.0"
