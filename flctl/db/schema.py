"""The run database's tables (SQLAlchemy 2) and ``RunRecord``, the frozen view of a run that readers get.

One row per run, keyed by the run id (a prefix of the canonical config hash), with the resolved config, status,
timings, host, git revision, summary metrics and artifact paths. A change here needs a revision under
flctl/migrations/versions/.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, Float, ForeignKey, Index, Integer, String, Text, false, inspect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from flctl.config import RunConfig
from flctl.errors import DamagedRow
from flctl.status import Status

# 2: managed by Alembic revisions (flctl.migrations); 1: the schema before them, which the baseline revision is.
# A flctl that expects 1 refuses a database at 2 with its own message, instead of missing newer columns.
SCHEMA_VERSION = 2


class Base(DeclarativeBase):
    pass


class Meta(Base):
    __tablename__ = "flctl_meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(256))


class Run(Base):
    __tablename__ = "runs"
    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    config_hash: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    task: Mapped[str] = mapped_column(String(64), index=True)
    method: Mapped[str] = mapped_column(String(16), index=True)
    seed: Mapped[int] = mapped_column(Integer)
    config: Mapped[dict] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), index=True, default=Status.QUEUED.value)
    epochs_done: Mapped[int] = mapped_column(Integer, default=0)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    host: Mapped[str | None] = mapped_column(String(255))
    pid: Mapped[int | None] = mapped_column(Integer)
    job_id: Mapped[str | None] = mapped_column(String(64))   # submitit/Slurm job running it, if any
    git_sha: Mapped[str | None] = mapped_column(String(64))
    device: Mapped[str | None] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    duration_s: Mapped[float | None] = mapped_column(Float)
    metrics: Mapped[dict | None] = mapped_column(JSON)
    diverged_at: Mapped[dict | None] = mapped_column(JSON)
    lambda_capped: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    # {"engine": eager | captured | compiled | grouped, "cells_together": K, "device": the device's name}
    trained_with: Mapped[dict | None] = mapped_column(JSON)
    # Where the code that trained it came from (flctl.plugins.Source.provenance): {"task": {...}, "method": {...}}
    provenance: Mapped[dict | None] = mapped_column(JSON)
    # The fencing token of the current claim: new at every claim, so a worker that lost its claim (stale, taken
    # over) finds another token here and writes nothing (flctl.runner checks it before every write that matters).
    claim_token: Mapped[str | None] = mapped_column(String(32))
    # RunConfig.together_id: cells of equal keys may train together in one process. A worker's claim filters on it
    # in SQL (flctl.db.claims); None for a row written before revision 0008 whose config could not be read.
    together: Mapped[str | None] = mapped_column(String(16))
    artifacts: Mapped[list[Artifact]] = relationship(back_populates="run", cascade="all, delete-orphan",
                                                       lazy="selectin")

    # What a claim reads (flctl.db.claims): the cells of a status, of one together key, in id order, so that taking
    # the next n costs the same on a table of a thousand rows or of a million. What a sweep's ledger counts
    # (flctl.db.counts): its cells by status and method, read from the index alone, not from rows of ~1 KB each.
    __table_args__ = (Index("ix_runs_claim", "status", "together", "id"),
                      Index("ix_runs_ledger", "status", "method", "id"))

    def record(self) -> RunRecord:
        d = {c.key: getattr(self, c.key) for c in inspect(Run).column_attrs}
        for k in ("created_at", "started_at", "finished_at", "heartbeat_at"):
            d[k] = d[k].isoformat() if d[k] else None
        d["metrics"] = d["metrics"] or {}
        # JSON of another shape (PostgreSQL's JSON column admits any JSON) would fail later, deep in a command
        for k, kind in (("config", dict), ("metrics", dict), ("diverged_at", (dict, type(None))),
                        ("trained_with", (dict, type(None))), ("provenance", (dict, type(None)))):
            if not isinstance(d[k], kind):
                raise DamagedRow(self.id, k, f"{type(d[k]).__name__} JSON, not an object")
        d["artifacts"] = {a.kind: a.path for a in self.artifacts}
        return RunRecord(**d)


@dataclass(frozen=True)
class RunRecord:
    """One run as the database holds it: what reports and commands read. Its fields are the ``runs`` table's
    columns (times as ISO strings) plus ``artifacts``; ``cfg`` is its configuration as a RunConfig."""

    id: str
    config_hash: str
    task: str
    method: str
    seed: int
    config: dict[str, Any]            # the RunConfig as stored (JSON): every field (RunConfig.to_dict)
    status: str
    epochs_done: int
    attempts: int
    host: str | None
    pid: int | None
    job_id: str | None
    git_sha: str | None
    device: str | None
    created_at: str
    started_at: str | None
    finished_at: str | None
    heartbeat_at: str | None
    duration_s: float | None
    metrics: dict[str, float]          # summary metrics, "train.avg_loss", ...; {} until the run ends
    diverged_at: dict | None
    lambda_capped: int | None
    error: str | None
    trained_with: dict[str, Any] | None   # engine, cells_together, device (flctl.cell.RunResult)
    provenance: dict[str, Any] | None     # task and method code: origin, module, file, sha256, distribution, version
    claim_token: str | None            # the current claim's fencing token (Run.claim_token)
    together: str | None               # the key of the cells it may train together with (RunConfig.together_id)
    artifacts: dict[str, str]          # kind (records, model, extras) -> path

    @property
    def cfg(self) -> RunConfig:
        return RunConfig.from_json(self.config)

    def to_json(self) -> dict[str, Any]:
        """A plain dict for --json output."""
        return dataclasses.asdict(self)


class Artifact(Base):
    __tablename__ = "artifacts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(32))      # records | model | extras | ...
    path: Mapped[str] = mapped_column(Text)
    run: Mapped[Run] = relationship(back_populates="artifacts")


class Sweep(Base):
    __tablename__ = "sweeps"
    id: Mapped[str] = mapped_column(String(12), primary_key=True)
    name: Mapped[str | None] = mapped_column(String(128), index=True)
    task: Mapped[str] = mapped_column(String(64))
    spec: Mapped[dict] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    submissions: Mapped[int] = mapped_column(Integer, default=0)


class SweepCell(Base):
    """Membership of a run in a sweep; a run may belong to several sweeps (dedup by config hash)."""

    __tablename__ = "sweep_cells"
    sweep_id: Mapped[str] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True, index=True)
    # The Optuna mirror is done with the cell (flctl.study): its trial is in the sweep's study, written in the same
    # transaction as this, or its sweep is a --tune search's, whose study its tuner keeps. A mirror reads the
    # finished cells not mirrored through the index, not the whole sweep.
    mirrored: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false(), nullable=False)

    __table_args__ = (Index("ix_sweep_cells_mirror", "mirrored", "sweep_id", "run_id"),)


def now() -> datetime:
    return datetime.now(UTC)
