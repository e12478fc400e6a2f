"""Run configuration: a fully resolved, frozen description of one training run and its identity hash.

Kept free of torch so the CLI, the database layer and the reports can use it without the heavy imports.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

from flctl.devices import CAPTURED_ENGINES, ENGINES, SAME_NUMBERS_ENGINES, device_problem, resolve_device
from flctl.errors import ConfigError
from flctl.fields import Bounds, FieldSpec
from flctl.method_info import METHOD_FIELDS, METHOD_INFO
from flctl.method_info import canonical as canonical_method

if TYPE_CHECKING:
    from flctl.tasks import Task

OPTIMIZERS = ("sgd", "adamw")
SCHEDULERS = ("constant", "cosine")
# auto: the forward pass runs under bf16 autocast on CUDA (fp32 elsewhere); fp32: never autocast.
PRECISIONS = ("auto", "fp32")
# How FL and RFL move their multipliers: gd, projected gradient ascent (the paper); nupi, a PI controller per
# sample (Sohrabi et al. 2024), see flctl.methods.NuPI. Its gains are read only by nupi.
DUAL_OPTIMIZERS = ("gd", "nupi")
# Where a field's command-line option is listed in `flctl run --help`.
PANELS = {"method": "Method", "optim": "Optimization (defaults: the task's paper values)", "where": "Where",
          "launch": "Launch"}
# Upper bounds that catch typos (--epochs 1e6 meant as 1e2) and values the database cannot hold (a seed is an
# SQL integer); far above anything the paper runs.
MAX_EPOCHS = 1_000_000
MAX_SEED = 2**31 - 1
MAX_BATCH = 10**8


def _field(default: Any, help: str, panel: str, *, axis: bool = True, identity: bool = True,
           flags: tuple[str, ...] = (), choices: Collection[str] = (), bounds: Bounds | None = None,
           later: bool = False, per_cell: bool = False, switched_by: str | None = None) -> Any:
    """A RunConfig field with what the command line, sweeps, studies, validation and training need to know about
    it (``FIELDS``; the meaning of each keyword is documented on flctl.fields.FieldSpec)."""
    return field(default=default, metadata={"help": help, "panel": panel, "axis": axis, "identity": identity,
                                            "flags": flags, "choices": choices, "bounds": bounds, "later": later,
                                            "per_cell": per_cell, "switched_by": switched_by})


@dataclass(frozen=True)
class RunConfig:
    """One run. Every field but ``task`` and ``options`` carries its facts (see ``FieldSpec``): the options of
    `flctl run` and `flctl sweep`, their checks, the sweep axes, the plan's columns, the Optuna parameters and the
    run's identity are derived from them."""

    task: str
    method: str = _field(None, "Method, see `flctl methods` [run: fl].", "method", flags=("--method", "-m"),
                         choices=METHOD_INFO, per_cell=True)   # the registry itself: a method added later is a choice
    seed: int = _field(0, "Seed of initialization and batch order.", "optim", per_cell=True,
                       bounds=Bounds(0, MAX_SEED, says=f"in 0..{MAX_SEED}"))
    epochs: int = _field(1, "Epochs.", "optim", bounds=Bounds(1, MAX_EPOCHS))
    batch_size: int = _field(128, "Samples per optimizer step.", "optim", bounds=Bounds(1, MAX_BATCH))
    optimizer: str = _field("adamw", f"Primal optimizer: {' or '.join(OPTIMIZERS)}.", "optim",
                            choices=OPTIMIZERS)
    lr: float = _field(1e-3, "Primal learning rate.", "optim", per_cell=True, bounds=Bounds(0))
    momentum: float = _field(0.0, "SGD momentum.", "optim", per_cell=True, bounds=Bounds(0))
    weight_decay: float = _field(0.0, "Weight decay.", "optim", per_cell=True, bounds=Bounds(0))
    scheduler: str = _field("constant", f"Learning-rate schedule: {' or '.join(SCHEDULERS)}.", "optim",
                            choices=SCHEDULERS)
    # > 0: the schedule moves every optimizer step: linear warmup from 0 over this many steps, then constant
    # or cosine to 0 at the last step (transformers' get_cosine_schedule_with_warmup). 0: cosine per epoch.
    warmup_steps: int = _field(0, "Linear warmup over N steps, then the schedule per step.", "optim", later=True,
                               bounds=Bounds(0, says=">= 0"))
    # > 0: accumulate gradients over micro-batches of this many samples (same update, less memory).
    micro_batch: int = _field(0, "Accumulate gradients over micro-batches of N samples (0 = whole batch).", "optim",
                              later=True, bounds=Bounds(0, says=">= 0 (0 = the whole batch at once)"))
    # "auto": bf16 autocast for the forward pass on CUDA (losses, multipliers, optimizer state stay float32);
    # "fp32": no autocast. On the CPU both compute the same thing in float32.
    precision: str = _field("auto", "auto (bf16 autocast forward on CUDA) or fp32.", "where",
                            choices=PRECISIONS, later=True)
    engine: str = _field("auto", "Step engine: auto, eager, captured, compiled, compiled-captured or "
                         "captured-streams (README, Engines).", "where", choices=ENGINES, later=True)
    eval_every: int = _field(1, "Write per-sample records every k epochs.", "optim", bounds=Bounds(1))
    # The method knobs (flctl.method_info.METHOD_FIELDS): None where the run's method does not read them.
    eps: float | None = _field(None, "Constraint level ε on each sample's loss.", "method", per_cell=True,
                               bounds=Bounds(0))
    alpha: float | None = _field(None, "RFL/CSERM relaxation cost α > 0.", "method", per_cell=True,
                                 bounds=Bounds(0, lo_open=True))
    dual_lr: float | None = _field(None, "Multiplier step size η_λ.", "method", per_cell=True, bounds=Bounds(0))
    dual_optimizer: str = _field("gd", "Multiplier update of FL/RFL: gd (the paper) or nupi (PI control).",
                                 "method", choices=DUAL_OPTIMIZERS, later=True, per_cell=True)
    # K_P = 0, K_I = 1, ν = 0 is gradient ascent (flctl.methods.NuPI), so gd runs hold these.
    kp: float = _field(0.0, "nupi: proportional gain K_P >= 0.", "method", later=True, per_cell=True,
                       switched_by="dual_optimizer", bounds=Bounds(0))
    ki: float = _field(1.0, "nupi: integral gain K_I >= 0 (1 with K_P = 0: gd).", "method", later=True,
                       per_cell=True, switched_by="dual_optimizer", bounds=Bounds(0))
    nu: float = _field(0.0, "nupi: EMA coefficient ν in [0, 1) of the error in the P term.", "method", later=True,
                       per_cell=True, switched_by="dual_optimizer", bounds=Bounds(0, 1, hi_open=True))
    # > 0: from this epoch on, samples satisfied at their last prune_patience visits leave the epoch order
    # (flctl.pruning); eval epochs still record every sample.
    prune_after: int = _field(0, "Prune satisfied samples after E epochs (0: never).", "optim", later=True,
                              bounds=Bounds(0, MAX_EPOCHS, says=f"a number of epochs in 0..{MAX_EPOCHS:,} (0: never)"))
    prune_patience: int = _field(5, "Pruning: satisfied at this many visits in a row.", "optim", later=True,
                                 switched_by="prune_after", bounds=Bounds(1))
    # > 0: each split keeps this many samples, spread evenly over it (flctl.data.Dataset.subset): a quick stand-in
    # of the task (the paper programme's smoke scale, flctl.paper.programme). Sample ids are positions among those kept.
    subset: int = _field(0, "Keep N samples of each split, spread evenly over it (0: all).", "optim", later=True,
                         bounds=Bounds(0, MAX_BATCH, says=f"a number of samples in 0..{MAX_BATCH:,} (0: all)"))
    options: tuple[tuple[str, Any], ...] = ()   # task-specific options, sorted (key, value) pairs
    # Where a run executes, not what it computes: not part of its identity, not an axis.
    device: str = _field("cpu", "cpu, cuda, cuda:N or auto.", "where", axis=False, identity=False)
    data_dir: str | None = _field(None, "Existing copy of the dataset (a folder, or a file for orca-dpo).", "where",
                                  axis=False, identity=False, flags=("--data-dir", "--data"))

    @property
    def opts(self) -> dict[str, Any]:
        return dict(self.options)

    def identity(self) -> dict[str, Any]:
        """The fields that define what the run computes, as plain JSON-able values: what ``config_hash`` hashes.
        A ``later`` field at its default is left out, so ids recorded before it existed stay valid."""
        return dict(self._identity)

    @functools.cached_property   # config_hash and together_key both read it: a sweep's cell makes it once
    def _identity(self) -> dict[str, Any]:
        d = self.to_dict()
        for name, f in FIELDS.items():
            if not f.identity or (f.later and d[name] == f.default):
                d.pop(name)
        if d.get("engine") in SAME_NUMBERS_ENGINES:   # how a step runs, not what it computes
            d.pop("engine")
        elif d.get("engine") == "compiled-captured":   # compiled's kernels, replayed: compiled's numbers
            d["engine"] = "compiled"
        return d

    def to_dict(self) -> dict[str, Any]:
        """Every field, ``options`` as a dict: what the run database stores (``from_json`` reads it back)."""
        # Not dataclasses.asdict: its deep copy of values that are all scalars was half of planning a sweep's cell
        # (the id hashes this dict, and the database stores it).
        d = {name: getattr(self, name) for name in _NAMES}
        d["options"] = dict(self.options)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | Mapping[str, Any]) -> RunConfig:
        """The config of a stored one (``to_dict``, or its JSON text)."""
        d = dict(json.loads(text) if isinstance(text, str) else text)
        d["options"] = tuple(sorted(d.get("options", {}).items()))
        return cls(**d)

    @functools.cached_property   # the loop asks for run_id every epoch; a frozen config hashes once
    def config_hash(self) -> str:
        canonical = json.dumps(self._identity, sort_keys=True, separators=(",", ":"), allow_nan=False)
        return hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def run_id(self) -> str:
        """Short, stable id: the same config is the same run (16 hex digits of the hash)."""
        return self.config_hash[:16]

    @property
    def title(self) -> str:
        """The run as a person tells it from its siblings: "two-moons · fl · ε=0.1 · seed 0" (the progress line of
        `flctl run`, a tracker's run name; the run id stays its key)."""
        return f"{self.task} · {self.method}" + (f" · ε={self.eps:.4g}" if self.eps is not None else "") + (
            f" · α={self.alpha:g}" if self.alpha is not None else "") + f" · seed {self.seed}"

    def together_key(self) -> str:
        """Cells with equal keys may train together in one process (flctl.grouped.policy.can_train_together)."""
        shared = {k: v for k, v in self._identity.items() if k not in FIELDS or not FIELDS[k].per_cell}
        # A pruned epoch order is the run's own (its batches are not the others' in length): it trains alone.
        alone = self.run_id if self.prune_after > 0 else None
        return json.dumps([shared, self.device, self.data_dir, alone, self.engine], sort_keys=True, default=str)

    @property
    def together_id(self) -> str:
        """``together_key`` as 16 hex digits: stored with the run (Run.together), so a worker's claim finds the cells
        that train with its first one in SQL, through an index, instead of parsing every cell's config."""
        return hashlib.sha256(self.together_key().encode()).hexdigest()[:16]


def _spec(f: dataclasses.Field) -> FieldSpec:
    kind = {"float": float, "int": int, "str": str}[str(f.type).split("|")[0].strip()]
    m = f.metadata
    return FieldSpec(f.name, kind, f.default, m["help"], m["panel"], m["axis"], m["identity"],
                     m["flags"] or ("--" + f.name.replace("_", "-"),), m["choices"], m["bounds"], m["later"],
                     m["per_cell"], m["switched_by"], f.name in METHOD_FIELDS)


_NAMES = tuple(f.name for f in dataclasses.fields(RunConfig))     # RunConfig.to_dict's keys
_NAME_SET = frozenset(_NAMES)
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
    method = canonical_method(method)
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
    if task.device_options and overrides.get("device") == "auto":   # its options depend on the device: settle it
        overrides["device"] = resolve_device("auto")
    defaults = task.options_for(overrides.get("device", FIELDS["device"].default))
    opts = {**defaults, **{k: _coerce_like(task_options[k], v, k) for k, v in user_opts.items()}}
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

    unknown_fields = set(overrides) - _NAME_SET
    if unknown_fields:
        raise ConfigError(f"unknown run field(s): {', '.join(sorted(unknown_fields))}")

    values: dict[str, Any] = {**task.defaults_for(method), **overrides}
    used = METHOD_INFO[method].reads
    for name, f in FIELDS.items():
        # Read only by some methods, or only while a switch is on: dropped (None, or back to the default) where not
        # read, so that runs differing only in them are one run; a value given for it still has to make sense:
        # `-m erm --eps -5` is a mistake, not a no-op.
        switched_off = f.switched_by is not None and \
            values.get(f.switched_by, FIELDS[f.switched_by].default) == FIELDS[f.switched_by].default
        if (f.method_knob and name not in used) or switched_off:
            checked = overrides if f.method_knob else values
            if name in checked and (problem := f.problem(checked[name])) is not None:
                raise ConfigError(problem)
            values[name] = None if f.method_knob else f.default
    cfg = RunConfig(task=task_name, method=method, options=tuple(sorted(opts.items())), **values)
    validate(cfg)
    return cfg


# Field values that passed every check of their field (flctl.fields.FieldSpec: type, bounds, choices, which read the
# value alone), as (field, type, value): a sweep's cells repeat a few values of each field, and these checks were
# half of planning a cell. Its type is in the key: 1, 1.0 and True are equal and hash alike, and only some fields
# take each. Emptied past _GOOD_MOST entries.
_GOOD: set[tuple[str, type, Any]] = set()
_GOOD_MOST = 100_000


def _known_good(name: str, value: Any) -> bool:
    try:
        return (name, type(value), value) in _GOOD
    except TypeError:
        return False


def validate(cfg: RunConfig) -> None:
    def bad(msg: str) -> NoReturn:
        raise ConfigError(msg)

    if (problem := device_problem(cfg.device)) is not None:   # a spec's `device = "tpu"`, before any worker starts
        bad(problem)

    # Types first, from each field's declared kind: an integer field holds an integer, not 2.5, "3" or True; then
    # each number against its bounds, then each text against its choices. A value that passed them all before is
    # not checked again (_GOOD): those checks read the value alone.
    values = [(f, getattr(cfg, f.name)) for f in FIELDS.values()]
    try:
        new = [(f, v) for f, v in values if (f.name, type(v), v) not in _GOOD]
    except TypeError:        # an unhashable value (a list where a number belongs): its checks say what is wrong
        new = [(f, v) for f, v in values if not _known_good(f.name, v)]
    for f, v in new:
        if (problem := f.type_problem(v)) is not None:
            bad(problem)
    used = METHOD_INFO[cfg.method].reads if cfg.method in METHOD_INFO else frozenset()   # else: a choice problem
    if "eps" in used and cfg.eps is None:
        bad(f"method {cfg.method!r} needs a constraint level: pass {FIELDS['eps'].flag} (or --p-min)")
    fresh, bounded = {f.name for f, _ in new}, []
    for f, v in values:
        if f.method_knob and f.name not in used:    # not read: resolve stored it as None
            continue
        if v is None and f.method_knob and f.bounds is not None:   # read but not given
            bad(f"{f.flag} must be {f.bounds.words(v, f.kind)}, got {v}")
        if f.name in fresh:
            if (problem := f.bound_problem(v)) is not None:
                bad(problem)
            bounded.append((f, v))
    for f, v in new:
        if (problem := f.choice_problem(v)) is not None:
            bad(problem)
    if len(_GOOD) > _GOOD_MOST:
        _GOOD.clear()
    _GOOD.update((f.name, type(v), v) for f, v in bounded)
    engine, device, prune_after = FIELDS["engine"].flag, FIELDS["device"].flag, FIELDS["prune_after"].flag
    if cfg.engine in CAPTURED_ENGINES and not cfg.device.startswith("cuda"):
        bad(f"{engine} {cfg.engine} replays CUDA graphs; it needs {device} cuda (the run's device is {cfg.device!r})")
    if cfg.engine == "captured-streams" and cfg.warmup_steps > 0:
        bad(f"{engine} captured-streams steps each cell on a stream of its own through an epoch; a warm-up moves the "
            f"learning rate every step (use {engine} captured)")
    if cfg.engine in CAPTURED_ENGINES and cfg.prune_after > 0:
        bad(f"{engine} {cfg.engine} needs the same batches every epoch; pruning changes them (use {engine} eager)")
    if cfg.prune_after > 0 and "eps" not in used:
        bad(f"{prune_after} prunes samples satisfied at ε; {cfg.method} has no ε (use fl, rfl or cserm)")
    if cfg.dual_optimizer != FIELDS["dual_optimizer"].default and not METHOD_INFO[cfg.method].has_multipliers:
        bad(f"{FIELDS['dual_optimizer'].flag} {cfg.dual_optimizer} moves multipliers; {cfg.method} has none "
            "(use fl or rfl)")


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
