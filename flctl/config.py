"""Run configuration: a fully resolved, frozen description of one training run and its identity hash.

Kept free of torch so the CLI, the database layer and the reports can use it without the heavy imports.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

from flctl.errors import ConfigError
from flctl.method_info import METHOD_FIELDS, METHOD_INFO

if TYPE_CHECKING:
    from flctl.tasks import Task

OPTIMIZERS = ("sgd", "adamw")
SCHEDULERS = ("constant", "cosine")
# auto: the forward pass runs under bf16 autocast on CUDA (fp32 elsewhere); fp32: never autocast.
PRECISIONS = ("auto", "fp32")
# How FL and RFL move their multipliers: gd, projected gradient ascent (the paper); nupi, a PI controller per
# sample (Sohrabi et al. 2024), see flctl.methods.NuPI. Its gains are read only by nupi.
DUAL_OPTIMIZERS = ("gd", "nupi")
NUPI_GAINS = {"kp": 0.0, "ki": 1.0, "nu": 0.0}
PRUNE_PATIENCE = 5
# How a cell's step runs (flctl.train): eager; captured, replayed as CUDA graphs (the eager step's kernels, so the
# same numbers: not part of the identity); compiled, through torch.compile (other kernels, other rounding: part of it).
ENGINES = ("eager", "captured", "compiled")
SAME_NUMBERS_ENGINES = ("eager", "captured")
# Fields read only while another is switched on (switch: (off value, {field: default})). With the switch off they
# are still checked, then reset, so runs that differ only in them are one run (like METHOD_FIELDS a method ignores).
SWITCHED_FIELDS: dict[str, tuple[Any, dict[str, Any]]] = {
    "dual_optimizer": ("gd", NUPI_GAINS), "prune_after": (0, {"prune_patience": PRUNE_PATIENCE})}
# Fields added after the first release, left out of the identity while at their default so that the ids of
# runs recorded before they existed do not change.
LATER_FIELDS = {"warmup_steps": 0, "micro_batch": 0, "precision": "auto", "dual_optimizer": "gd", **NUPI_GAINS,
                "prune_after": 0, "prune_patience": PRUNE_PATIENCE, "engine": "eager"}


def with_later_defaults(config: Mapping[str, Any]) -> dict[str, Any]:
    """A stored run config (``RunConfig.identity``) with the LATER_FIELDS left out at their default put back: the
    values the run used. Reports group with it, or a gd run (no dual_optimizer key) would join the nupi runs."""
    return {**LATER_FIELDS, **config}


# Fields a cell may vary and still train together with others (flctl.train.train_together): each cell has its own
# model, optimizer and multipliers. Everything else (task, options, epochs, batch size, schedule, ...) must agree.
PER_CELL_FIELDS = frozenset({"seed", "lr", "dual_lr", "eps", "alpha", "method", "weight_decay", "momentum",
                             "dual_optimizer", *NUPI_GAINS})
# Where a field's command-line option is listed in `flctl run --help`.
PANELS = {"method": "Method", "optim": "Optimization (defaults: the task's paper values)", "where": "Where"}


def _field(default: Any, help: str, panel: str, *, axis: bool = True, identity: bool = True,
           flags: tuple[str, ...] = (), choices: Collection[str] = ()) -> Any:
    """A RunConfig field with what the command line, sweeps and studies need to know about it (``FIELDS``)."""
    return field(default=default, metadata={"help": help, "panel": panel, "axis": axis, "identity": identity,
                                            "flags": flags, "choices": choices})


@dataclass(frozen=True)
class RunConfig:
    """One run. Every field but ``task`` and ``options`` carries its help text and role (see ``FIELDS``): the
    options of `flctl run` and `flctl sweep`, the sweep axes, the plan's columns and the Optuna parameters are
    derived from them."""

    task: str
    method: str = _field(None, "Method, see `flctl methods` [run: fl].", "method", flags=("--method", "-m"),
                         choices=METHOD_INFO)     # the registry itself: a method added later is a choice
    seed: int = _field(0, "Seed of initialization and batch order.", "optim")
    epochs: int = _field(1, "Epochs.", "optim")
    batch_size: int = _field(128, "Samples per optimizer step.", "optim")
    optimizer: str = _field("adamw", f"Primal optimizer: {' or '.join(OPTIMIZERS)}.", "optim",
                            choices=OPTIMIZERS)
    lr: float = _field(1e-3, "Primal learning rate.", "optim")
    momentum: float = _field(0.0, "SGD momentum.", "optim")
    weight_decay: float = _field(0.0, "Weight decay.", "optim")
    scheduler: str = _field("constant", f"Learning-rate schedule: {' or '.join(SCHEDULERS)}.", "optim",
                            choices=SCHEDULERS)
    # > 0: the schedule moves every optimizer step: linear warmup from 0 over this many steps, then constant
    # or cosine to 0 at the last step (transformers' get_cosine_schedule_with_warmup). 0: cosine per epoch.
    warmup_steps: int = _field(0, "Linear warmup over N steps, then the schedule per step.", "optim")
    # > 0: accumulate gradients over micro-batches of this many samples (same update, less memory).
    micro_batch: int = _field(0, "Accumulate gradients over micro-batches of N samples (0 = whole batch).", "optim")
    # "auto": bf16 autocast for the forward pass on CUDA (losses, multipliers, optimizer state stay float32);
    # "fp32": no autocast. On the CPU both compute the same thing in float32.
    precision: str = _field("auto", "auto (bf16 autocast forward on CUDA) or fp32.", "where",
                            choices=PRECISIONS)
    engine: str = _field("eager", "Step engine: eager, captured (CUDA graphs, CUDA only) or compiled (torch.compile).",
                         "where", choices=ENGINES)
    eval_every: int = _field(1, "Write per-sample records every k epochs.", "optim")
    eps: float | tuple[float, ...] | None = _field(None, "Constraint level ε on each sample's loss.", "method")
    alpha: float | None = _field(None, "RFL/CSERM relaxation cost α > 0.", "method")
    dual_lr: float | None = _field(None, "Multiplier step size η_λ.", "method")
    dual_optimizer: str = _field("gd", "Multiplier update of FL/RFL: gd (the paper) or nupi (PI control).",
                                 "method", choices=DUAL_OPTIMIZERS)
    kp: float = _field(NUPI_GAINS["kp"], "nupi: proportional gain K_P >= 0.", "method")
    ki: float = _field(NUPI_GAINS["ki"], "nupi: integral gain K_I >= 0 (1 with K_P = 0: gd).", "method")
    nu: float = _field(NUPI_GAINS["nu"], "nupi: EMA coefficient ν in [0, 1) of the error in the P term.", "method")
    # > 0: from this epoch on, samples satisfied at their last prune_patience visits leave the epoch order
    # (flctl.pruning); eval epochs still record every sample.
    prune_after: int = _field(0, "Prune satisfied samples after E epochs (0: never).", "optim")
    prune_patience: int = _field(PRUNE_PATIENCE, "Pruning: satisfied at this many visits in a row.", "optim")
    options: tuple[tuple[str, Any], ...] = ()   # task-specific options, sorted (key, value) pairs
    # Where a run executes, not what it computes: not part of its identity, not an axis.
    device: str = _field("cpu", "cpu, cuda, cuda:N or auto.", "where", axis=False, identity=False)
    data_dir: str | None = _field(None, "Existing copy of the dataset (a folder, or a file for orca-dpo).", "where",
                                  axis=False, identity=False, flags=("--data-dir", "--data"))

    @property
    def opts(self) -> dict[str, Any]:
        return dict(self.options)

    def identity(self) -> dict[str, Any]:
        """The fields that define what the run computes, as plain JSON-able values."""
        d = dataclasses.asdict(self)
        for k in NOT_IDENTITY:
            d.pop(k)
        for k, default in LATER_FIELDS.items():
            if d[k] == default:
                d.pop(k)
        if d.get("engine") in SAME_NUMBERS_ENGINES:   # how a step runs, not what it computes
            d.pop("engine")
        d["options"] = dict(self.options)
        if isinstance(self.eps, tuple):
            d["eps"] = list(self.eps)
        return d

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d["options"] = dict(self.options)
        if isinstance(self.eps, tuple):
            d["eps"] = list(self.eps)
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | Mapping[str, Any]) -> RunConfig:
        d = dict(json.loads(text) if isinstance(text, str) else text)
        d["options"] = tuple(sorted(d.get("options", {}).items()))
        if isinstance(d.get("eps"), list):
            d["eps"] = tuple(d["eps"])
        return cls(**d)

    @functools.cached_property   # the loop asks for run_id every epoch; a frozen config hashes once
    def config_hash(self) -> str:
        canonical = json.dumps(self.identity(), sort_keys=True, separators=(",", ":"), allow_nan=False)
        return hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def run_id(self) -> str:
        """Short, stable id: the same config is the same run (16 hex digits of the hash)."""
        return self.config_hash[:16]

    def together_key(self) -> str:
        """Cells with equal keys may train together as one stacked model (when their task is ``batched``)."""
        shared = {k: v for k, v in self.identity().items() if k not in PER_CELL_FIELDS}
        # A pruned epoch order is the run's own (its batches are not the others' in length): it trains alone.
        alone = self.run_id if self.prune_after > 0 else None
        return json.dumps([shared, self.device, self.data_dir, alone, self.engine], sort_keys=True, default=str)



@dataclass(frozen=True)
class FieldSpec:
    """A RunConfig field as the command line, sweeps and studies see it."""

    name: str
    kind: type                # float, int or str: how a value or a sweep axis of it is parsed
    help: str
    panel: str                # key of PANELS
    axis: bool                # a sweep may vary it
    identity: bool            # part of the run's id
    flags: tuple[str, ...]    # its command-line option names
    choices: Collection[str]  # the values a text field takes (checked by validate, offered by shell completion)

    @property
    def flag(self) -> str:
        return self.flags[0]


def _spec(f: dataclasses.Field) -> FieldSpec:
    kind = {"float": float, "int": int, "str": str}[str(f.type).split("|")[0].strip()]
    m = f.metadata
    return FieldSpec(f.name, kind, m["help"], m["panel"], m["axis"], m["identity"],
                     m["flags"] or ("--" + f.name.replace("_", "-"),), m["choices"])


# Every field but task and options (the command's argument and its -o KEY=VALUE pairs), in declaration order.
FIELDS: dict[str, FieldSpec] = {f.name: _spec(f) for f in dataclasses.fields(RunConfig) if f.metadata}
AXIS_FIELDS = tuple(name for name, f in FIELDS.items() if f.axis)
NOT_IDENTITY = frozenset(name for name, f in FIELDS.items() if not f.identity)

def resolve(task: Task, method: str, overrides: Mapping[str, Any] | None = None,
            p_min: float | None = None) -> RunConfig:
    """Fill a config from the task's paper defaults (for this method) and the user's overrides, then validate it.

    ``overrides`` holds RunConfig fields (None means "not given"); an ``options`` entry holds task options, checked
    against the task's declared options, their types and ``option_ranges``.
    Raises ConfigError with a one-line message for any bad value.
    """
    task_name, task_options, option_ranges = task.name, task.options, task.option_ranges
    supported_methods = task.supported_methods
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    if method not in METHOD_INFO:
        raise ConfigError(f"unknown method {method!r}; choose one of: {', '.join(METHOD_INFO)}")
    if method not in supported_methods:
        raise ConfigError(f"task {task_name!r} supports methods {', '.join(supported_methods)}, not {method!r}")

    if p_min is not None:
        if "eps" in overrides:
            raise ConfigError("give either --eps or --p-min, not both")
        if task.kind != "classification":
            raise ConfigError(f"--p-min applies to classification tasks; {task_name!r} is {task.kind}: use --eps")
        if not (0.0 < p_min <= 1.0) or math.isnan(p_min):
            raise ConfigError(f"--p-min must be in (0, 1], got {p_min}")
        overrides["eps"] = math.log(1.0 / p_min)

    user_opts = dict(overrides.pop("options", {}) or {})
    unknown = set(user_opts) - set(task_options)
    if unknown:
        valid = ", ".join(sorted(task_options)) or "none"
        raise ConfigError(f"unknown option(s) {', '.join(sorted(unknown))} for task {task_name!r}; valid: {valid}")
    opts = {**task_options, **{k: _coerce_like(task_options[k], v, k) for k, v in user_opts.items()}}
    for k, v in opts.items():   # a task option keeps its default's type (a float option takes an integer too)
        kind = type(task_options[k])
        number = isinstance(v, (int, float)) and not isinstance(v, bool)
        if not (number if kind is float else isinstance(v, kind) and (kind is bool or not isinstance(v, bool))):
            raise ConfigError(f"-o {k}={v!r}: task {task_name!r} takes {kind.__name__} values for {k}")
        lo, hi = option_ranges.get(k, (None, None))
        if isinstance(v, (int, float)) and not isinstance(v, bool) and (
                not math.isfinite(v) or (lo is not None and v < lo) or (hi is not None and v > hi)):
            bounds = f"at least {lo}" if hi is None else f"at most {hi}" if lo is None else f"in [{lo}, {hi}]"
            raise ConfigError(f"-o {k}={v}: task {task_name!r} needs {k} {bounds}")

    unknown_fields = set(overrides) - {f.name for f in dataclasses.fields(RunConfig)}
    if unknown_fields:
        raise ConfigError(f"unknown run field(s): {', '.join(sorted(unknown_fields))}")

    values: dict[str, Any] = {**task.defaults_for(method), **overrides}
    used = METHOD_INFO[method].reads
    # A value given for a field this method ignores is dropped below, but still has to make sense: `-m erm
    # --eps -5` is a mistake, not a no-op.
    ignored = {k: overrides[k] for k in METHOD_FIELDS if k not in used and k in overrides}
    if ignored:
        knobs: dict[str, Any] = {"eps": 0.0, "alpha": 1.0, "dual_lr": 0.0}
        knobs.update({k: tuple(v) if isinstance(v, list) else v for k, v in ignored.items()})
        validate(RunConfig(task=task_name, method="rfl", **knobs))   # rfl reads all three
    for k in METHOD_FIELDS:
        if k not in used:
            values[k] = None
    for switch, (off, dependent) in SWITCHED_FIELDS.items():
        if values.get(switch, off) == off:     # read only when switched on: checked, then back to their defaults
            validate(RunConfig(task=task_name, method="erm", **{k: values[k] for k in dependent if k in values}))
            values.update(dependent)
    if isinstance(values.get("eps"), (list, tuple)):
        values["eps"] = tuple(float(e) for e in values["eps"])
    cfg = RunConfig(task=task_name, method=method, options=tuple(sorted(opts.items())), **values)
    validate(cfg)
    return cfg


# Upper bounds that catch typos (--epochs 1e6 meant as 1e2) and values the database cannot hold (a seed is an
# SQL integer); far above anything the paper runs.
MAX_EPOCHS = 1_000_000
MAX_SEED = 2**31 - 1
MAX_BATCH = 10**8


# Where a run may train: torch's CPU, its CUDA devices, or "auto" (resolved to one of them before a run is recorded,
# flctl.cli.common.check_device). Others (mps, tpu, xla) are not supported by the training engine.
DEVICE = re.compile(r"cpu|auto|cuda(:[0-9]+)?")


def device_problem(device: object) -> str | None:
    """What is wrong with a device name (None: nothing), checked without torch."""
    if isinstance(device, str) and DEVICE.fullmatch(device):
        return None
    return f"unknown device {device!r}; choose cpu, cuda, cuda:N or auto"


def validate(cfg: RunConfig) -> None:
    def bad(msg: str) -> NoReturn:
        raise ConfigError(msg)

    if (problem := device_problem(cfg.device)) is not None:   # a spec's `device = "tpu"`, before any worker starts
        bad(problem)

    # Types first, from each field's declared kind: an integer field holds an integer, not 2.5, "3" or True.
    for f in FIELDS.values():
        v = getattr(cfg, f.name)
        if v is None or (f.name == "eps" and isinstance(v, tuple)):
            continue
        ok = (isinstance(v, int) and not isinstance(v, bool)) if f.kind is int else \
            (isinstance(v, (int, float)) and not isinstance(v, bool)) if f.kind is float else isinstance(v, str)
        if not ok:
            bad(f"{f.flag} must be {'an integer' if f.kind is int else 'a number' if f.kind is float else 'text'}, "
                f"got {v!r}")
    if not 0 <= cfg.seed <= MAX_SEED:
        bad(f"--seed must be in 0..{MAX_SEED}, got {cfg.seed}")
    if cfg.epochs > MAX_EPOCHS:
        bad(f"--epochs must be at most {MAX_EPOCHS:,}, got {cfg.epochs}")
    if cfg.batch_size > MAX_BATCH:
        bad(f"--batch-size must be at most {MAX_BATCH:,}, got {cfg.batch_size}")
    if cfg.epochs < 1:
        bad(f"--epochs must be at least 1, got {cfg.epochs}")
    if cfg.batch_size < 1:
        bad(f"--batch-size must be at least 1, got {cfg.batch_size}")
    if cfg.warmup_steps < 0:
        bad(f"--warmup-steps must be >= 0, got {cfg.warmup_steps}")
    if cfg.micro_batch < 0:
        bad(f"--micro-batch must be >= 0 (0 = the whole batch at once), got {cfg.micro_batch}")
    if cfg.eval_every < 1:
        bad(f"--eval-every must be at least 1, got {cfg.eval_every}")
    for name in ("lr", "weight_decay", "momentum"):
        v = getattr(cfg, name)
        if not math.isfinite(v) or v < 0:
            bad(f"--{name.replace('_', '-')} must be a finite number >= 0, got {v}")
    for f in FIELDS.values():
        if f.choices and getattr(cfg, f.name) not in f.choices:
            bad(f"unknown {f.name.replace('_', ' ')} {getattr(cfg, f.name)!r}; choose one of: {', '.join(f.choices)}")
    if cfg.engine == "captured" and not cfg.device.startswith("cuda"):
        bad(f"--engine captured replays CUDA graphs; it needs --device cuda, not {cfg.device!r}")
    if cfg.engine == "captured" and cfg.prune_after > 0:
        bad("--engine captured needs the same batches every epoch; pruning changes them (use --engine eager)")
    used = METHOD_INFO[cfg.method].reads
    if "eps" in used:
        if cfg.eps is None:
            bad(f"method {cfg.method!r} needs a constraint level: pass --eps (or --p-min)")
        eps = cfg.eps if isinstance(cfg.eps, tuple) else (cfg.eps,)
        if any(not math.isfinite(e) or e < 0 for e in eps):
            bad(f"--eps must be a finite number >= 0, got {cfg.eps}")
    if "alpha" in used and (cfg.alpha is None or not math.isfinite(cfg.alpha) or cfg.alpha <= 0):
        bad(f"--alpha must be a finite number > 0, got {cfg.alpha}")
    if "dual_lr" in used and (cfg.dual_lr is None or not math.isfinite(cfg.dual_lr) or cfg.dual_lr < 0):
        bad(f"--dual-lr must be a finite number >= 0, got {cfg.dual_lr}")
    for name in ("kp", "ki"):
        if not math.isfinite(getattr(cfg, name)) or getattr(cfg, name) < 0:
            bad(f"--{name} must be a finite number >= 0, got {getattr(cfg, name)}")
    if not 0 <= cfg.nu < 1:
        bad(f"--nu must be in [0, 1), got {cfg.nu}")
    if not 0 <= cfg.prune_after <= MAX_EPOCHS:
        bad(f"--prune-after must be a number of epochs in 0..{MAX_EPOCHS:,} (0: never), got {cfg.prune_after}")
    if cfg.prune_patience < 1:
        bad(f"--prune-patience must be at least 1, got {cfg.prune_patience}")
    if cfg.prune_after > 0 and "eps" not in used:
        bad(f"--prune-after prunes samples satisfied at ε; {cfg.method} has no ε (use fl, rfl or cserm)")
    if cfg.dual_optimizer != "gd" and not METHOD_INFO[cfg.method].has_multipliers:
        bad(f"--dual-optimizer {cfg.dual_optimizer} moves multipliers; {cfg.method} has none (use fl or rfl)")


def _coerce_like(default: Any, value: Any, key: str) -> Any:
    """Parse a task option given as text (``-o degree=20``) to the type of its default."""
    if not isinstance(value, str) or isinstance(default, str):
        return value
    try:
        if isinstance(default, bool):
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError
            return value.lower() in ("true", "1")
        return type(default)(value)
    except ValueError:
        raise ConfigError(f"option {key}={value!r} is not a valid {type(default).__name__}") from None
