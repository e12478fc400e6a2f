"""Sweep planning: axes (``1e-4..1``, ``1e-4..1:9``, ``0,0.51``: flctl.axes), spec files, the grid of resolved runs.

A sweep is the Cartesian product of its axes, resolved through the task defaults into RunConfigs and
deduplicated by run id: a method that ignores an axis (ERM ignores eps and alpha) is not multiplied by it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flctl.axes import AXES, FLOAT_AXES, MAX_AXIS_POINTS, axis_flag, parse_axis
from flctl.config import FIELDS, RunConfig, resolve
from flctl.errors import ConfigError
from flctl.method_info import METHOD_INFO

if TYPE_CHECKING:
    from flctl.tasks import Task

# A grid over MAX_CELLS cells needs an explicit yes: a typo should not plan for minutes or fill a cluster.
MAX_CELLS = 10_000
# ... and no grid over this many is planned at all: about 0.1 ms and 1 KB a cell planned and written (in bulk:
# flctl.db.bulk), so that a launch takes at most ~15 s and a few hundred MB (a grid of 10^6 cells is refused at
# once, not after minutes; benchmarks/bench_reads.py).
MAX_CELLS_ANYWAY = 100_000
PROGRESS_EVERY = 10_000
# The method of a sweep that names none (as `flctl run`'s), unless its axes set a field it ignores (implied_methods).
DEFAULT_METHOD = "fl"
# Keys a spec file may hold besides the axes.
SPEC_KEYS = {"name", "task", "description", "seeds", "options", "launch", "tune", "objective", "data_dir",
             "device", "task_module", "log_to"}

# The specs that come with flctl: the checkout's sweeps/ (flctl is installed editable, `pip install -e`).
SHIPPED_SPECS = Path(__file__).resolve().parents[1] / "sweeps"


@dataclass(frozen=True)
class SweepSpec:
    """What to sweep: a task, fixed values and axes. ``axes`` maps a RunConfig field (or 'p_min') to values."""

    task: str
    axes: Mapping[str, tuple[Any, ...]]
    options: Mapping[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict)
    name: str | None = None
    description: str = ""
    device: str = "cpu"
    data_dir: str | None = None
    launch: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    tune: int | None = None
    objective: str | None = None
    # Axes given as log ranges (LOW..HIGH), kept as continuous intervals for --tune's TPE search.
    ranges: Mapping[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    # Plugin task files or modules the task comes from (flctl.plugins; paths resolved against the spec's folder).
    task_module: tuple[str, ...] = ()
    # What planning chose for the user (e.g. the methods of an α sweep that named none), said in the plan; not
    # part of the spec's JSON.
    notes: tuple[str, ...] = dataclasses.field(default=(), compare=False)

    def to_json(self) -> dict[str, Any]:
        return {"task": self.task, "axes": {k: list(v) for k, v in self.axes.items()},
                "options": {k: list(v) for k, v in self.options.items()}, "name": self.name,
                "description": self.description, "device": self.device, "data_dir": self.data_dir,
                "launch": dict(self.launch), "tune": self.tune, "objective": self.objective,
                "ranges": {k: list(v) for k, v in self.ranges.items()},
                # only when given: the JSON of a spec without one (and its --tune study id) stays as it was
                **({"task_module": list(self.task_module)} if self.task_module else {})}


def spec_from_values(task: str, raw_axes: Mapping[str, Any], seeds: int | None = None,
                     options: Mapping[str, Any] | None = None, **fields: Any) -> SweepSpec:
    """Build a spec from CLI/TOML values; raises ConfigError on malformed axes or a name with control characters."""
    from flctl.tasks import canonical_name
    from flctl.text import first_control, shown

    task = canonical_name(task) if isinstance(task, str) else task      # TWO-MOONS is two-moons

    sweep_name = fields.get("name")
    if isinstance(sweep_name, str) and (bad := first_control(sweep_name)) is not None:
        # The name is stored and printed by every later `flctl sweeps`, for whoever shares the results folder: an ESC
        # sequence would restyle or retitle their terminal, U+202E reverse their line.
        raise ConfigError(f"sweep name {shown(sweep_name, 40)} holds a control character (U+{ord(bad):04X}); "
                          "give a name of printable characters")
    axes: dict[str, tuple[Any, ...]] = {}
    ranges: dict[str, tuple[float, float]] = {}
    for name, value in raw_axes.items():
        if value is None:
            continue
        axes[name] = tuple(parse_axis(name, value))
        if isinstance(value, str) and ".." in value and name in FLOAT_AXES:
            ends = sorted(axes[name][::len(axes[name]) - 1 or 1])
            ranges[name] = (ends[0], ends[-1])
    if seeds is not None:
        if "seed" in axes:
            raise ConfigError("give either --seeds N or --seed LIST, not both")
        if isinstance(seeds, bool) or not isinstance(seeds, int) or not 1 <= seeds <= MAX_AXIS_POINTS:
            raise ConfigError(f"seeds must be a whole number of seeds in 1..{MAX_AXIS_POINTS:,}, got {seeds!r}")
        axes["seed"] = tuple(range(int(seeds)))
    if "eps" in axes and "p_min" in axes:
        raise ConfigError("sweep either eps or p_min, not both")
    notes: tuple[str, ...] = ()
    if "method" not in axes:
        axes["method"] = implied_methods(task, axes)
        if axes["method"] != (DEFAULT_METHOD,):
            given = ", ".join(f"--{axis_flag(k)}" for k in _method_fields(axes) - METHOD_INFO[DEFAULT_METHOD].reads)
            notes = (f"no --method given: {given} is read by {', '.join(axes['method'])}, not by "
                     f"{DEFAULT_METHOD}, so the sweep trains {', '.join(axes['method'])} "
                     "(name the methods with --method to choose others)",)
    opts = {k: tuple(v if isinstance(v, list) else str(v).split(",")) for k, v in (options or {}).items()}
    return SweepSpec(task=task, axes=axes, options=opts, ranges=ranges, notes=notes, **fields)


def _method_fields(axes: Mapping[str, Any]) -> set[str]:
    """The method knobs (flctl.fields.FieldSpec.method_knob) the axes set; p_min sets eps."""
    return {name for name in ("eps" if k == "p_min" else k for k in axes) if name in FIELDS and FIELDS[name].method_knob}


def implied_methods(task: str, axes: Mapping[str, Any]) -> tuple[str, ...]:
    """The methods of a sweep that names none: DEFAULT_METHOD, unless the axes set a method field it ignores
    (--alpha: fl has no α). Then the methods that read all DEFAULT_METHOD reads plus those fields, from each
    method's declared fields (flctl.method_info): an α sweep is RFL, not a collapsed FL run; CSERM, which also
    reads α but has no multipliers, only when named. Failing that, every method the task supports that reads the
    given fields. ConfigError when the task has none."""
    from flctl.tasks import get_task

    given = _method_fields(axes)
    default_reads = METHOD_INFO[DEFAULT_METHOD].reads
    if given <= default_reads:
        return (DEFAULT_METHOD,)
    supported = get_task(task).supported_methods
    for needed in (default_reads | given, given):
        methods = tuple(m for m in supported if needed <= METHOD_INFO[m].reads)
        if methods:
            return methods
    flags = ", ".join(f"--{axis_flag(k)}" for k in sorted(given - default_reads))
    raise ConfigError(f"{flags}: no method of task {task!r} ({', '.join(supported)}) reads it")


def find_spec(path: Path) -> Path:
    """``path`` as given; else, for a relative path that is not there, the shipped spec it names (sweeps/X.toml,
    X.toml or X, in the checkout's sweeps/), so the README's `--spec sweeps/...` works from any folder."""
    path = Path(path)
    # only a name or sweeps/NAME: a typo in a path of the user's own must not load a shipped spec of the same name
    if path.exists() or path.is_absolute() or str(path.parent) not in (".", "sweeps"):
        return path
    for shipped in (SHIPPED_SPECS / path.name, SHIPPED_SPECS / f"{path.name}.toml"):
        if shipped.is_file():
            return shipped
    return path


def load_spec(path: Path) -> SweepSpec:
    """A TOML spec (see ``find_spec``): ``task``, axes as keys (lists or range strings), ``seeds``, ``[options]``,
    ``[launch]``."""
    path = find_spec(path)      # the file read: its folder is where a relative task_module lies
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"no spec file {str(path)!r} here or among the shipped specs in {SHIPPED_SPECS} "
                          "(e.g. sweeps/two-moons.toml)") from None
    except IsADirectoryError:
        raise ConfigError(f"spec {str(path)!r} is a folder; give a .toml file in it") from None
    except OSError as exc:
        raise ConfigError(f"cannot read spec {str(path)!r}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")     # TOML is UTF-8: a latin-1 or binary file is not a spec
    except UnicodeDecodeError as exc:
        raise ConfigError(f"spec {str(path)!r} is not UTF-8 text (byte {raw[exc.start]:#04x} at offset "
                          f"{exc.start}); TOML files are UTF-8") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"spec {str(path)!r} is not valid TOML: {exc}") from None
    except RecursionError:           # arrays or tables nested hundreds deep
        raise ConfigError(f"spec {str(path)!r} nests its values too deeply to be a sweep spec") from None
    unknown = set(data) - SPEC_KEYS - set(AXES)
    if unknown:
        raise ConfigError(f"spec {str(path)!r}: unknown key(s) {', '.join(sorted(unknown))}; "
                          f"valid: {', '.join(sorted(SPEC_KEYS | set(AXES)))}")
    if "task" not in data:
        raise ConfigError(f"spec {str(path)!r} names no task")
    kinds = {"task": str, "name": str, "description": str, "device": str, "data_dir": str, "objective": str,
             "tune": int, "seeds": int, "options": dict, "launch": dict}
    for key, kind in kinds.items():
        if key in data and (not isinstance(data[key], kind) or isinstance(data[key], bool)):
            what = {str: "a string", int: "an integer", dict: "a table ([" + key + "])"}[kind]
            raise ConfigError(f"spec {str(path)!r}: {key} must be {what}, got {data[key]!r}")
    modules = data.get("task_module", [])
    modules = [modules] if isinstance(modules, str) else modules
    if not isinstance(modules, list) or not all(isinstance(m, str) and m.strip() for m in modules):
        raise ConfigError(f"spec {str(path)!r}: task_module must be a file, folder or module name (or a list of "
                          f"them), got {data['task_module']!r}")
    if modules:
        from flctl import plugins

        modules = [plugins.resolve_entry(m, Path(path).resolve().parent) for m in modules]
        plugins.add(modules)       # before the task is looked up below
    axes = {k: data[k] for k in AXES if k in data}
    fields: dict[str, Any] = {k: data[k] for k in ("name", "description", "device", "data_dir", "launch", "tune",
                                                   "objective") if k in data}
    fields["task_module"] = tuple(modules)
    if "log_to" in data:          # the loggers (flctl.loggers) may sit at the top as well as in [launch]
        if "log_to" in data.get("launch", {}) and data["launch"]["log_to"] != data["log_to"]:
            raise ConfigError(f"spec {str(path)!r}: log_to is given twice, at the top and in [launch]")
        fields["launch"] = {**data.get("launch", {}), "log_to": data["log_to"]}
    fields.setdefault("name", Path(path).stem)
    try:
        return spec_from_values(data["task"], axes, seeds=data.get("seeds"), options=data.get("options"), **fields)
    except ConfigError as exc:   # name the file: the values it holds are what is wrong
        raise ConfigError(f"spec {str(path)!r}: {exc}") from None


def resolve_cell(spec: SweepSpec, values: Mapping[str, Any], task: Task | None = None) -> RunConfig:
    """One cell: the spec's first value of each axis, overridden by ``values`` (axis or ``opt.KEY`` names).
    ``task``: the spec's, looked up once by a caller that resolves many cells (plan)."""
    from flctl.tasks import get_task

    task = task or get_task(spec.task)
    cell: dict[str, Any] = {k: v[0] for k, v in spec.axes.items()}
    opts: dict[str, Any] = {k: v[0] for k, v in spec.options.items()}
    for k, v in values.items():
        if k.startswith("opt."):
            opts[k[4:]] = v
        else:
            cell[k] = v
    method = cell.pop("method", DEFAULT_METHOD)
    p_min = cell.pop("p_min", None)
    cell.update(options=opts, device=spec.device, data_dir=spec.data_dir)
    return resolve(task, method, cell, p_min)


def plan(spec: SweepSpec, check_data: bool = True, allow_large: bool = False,
         progress: Callable[[int, int], None] | None = None) -> list[RunConfig]:
    """Every distinct run of the sweep, in axis order. Raises ConfigError for an invalid cell or empty grid, for a
    grid over MAX_CELLS cells unless ``allow_large`` and over MAX_CELLS_ANYWAY cells in any case (before a cell is
    made), and (with ``check_data``) for a missing dataset; a dry run plans without the data, e.g. on a laptop.
    ``progress(done, cells)`` hears every PROGRESS_EVERY cells of a grid over MAX_CELLS."""
    names = list(spec.axes) + [f"opt.{k}" for k in spec.options]
    choices = list(spec.axes.values()) + list(spec.options.values())
    cells = math.prod(len(c) for c in choices)
    if cells > MAX_CELLS_ANYWAY:
        raise ConfigError(f"the grid has {cells:,} cells, over the {MAX_CELLS_ANYWAY:,} one sweep can hold even with "
                          "--yes (planning them would take minutes and gigabytes); split it into several sweeps")
    if cells > MAX_CELLS and not allow_large:
        raise ConfigError(f"the grid has {cells:,} cells (over {MAX_CELLS:,}); pass --yes if you mean it")
    from flctl.tasks import check_task_data, get_task

    task = get_task(spec.task)
    seen: dict[str, RunConfig] = {}
    for done, values in enumerate(itertools.product(*choices), 1):
        cfg = resolve_cell(spec, dict(zip(names, values)), task)
        seen.setdefault(cfg.run_id, cfg)
        if progress is not None and cells > MAX_CELLS and (done % PROGRESS_EVERY == 0 or done == cells):
            progress(done, cells)
    if not seen:
        raise ConfigError("the sweep's grid is empty")
    check_axes_read(spec, list(seen.values()))
    # a missing dataset or model fails the plan, before anything is written; once per distinct option set
    for options in {c.options: c for c in seen.values()}.values():
        check_task_data(task, options.opts, spec.data_dir, look=check_data)
    return list(seen.values())


def seed_note(spec: SweepSpec) -> tuple[str, ...]:
    """The note of a sweep over several seeds of a task whose numbers do not depend on the seed (flctl.tasks.Task's
    seed_free): its cells differ by their seed alone and train to the same numbers. Kept, not collapsed: the seeds
    asked for are the cells planned, as for any task; () when it has no such axis."""
    from flctl.tasks import get_task

    seeds = len(set(spec.axes.get("seed", ())))
    why = get_task(spec.task).seed_free if seeds > 1 else None
    if why is None:
        return ()
    return (f"{spec.task} ignores the seed: its {seeds:,} seeds plan {seeds:,} identical copies of each cell ({why})",)


def check_axes_read(spec: SweepSpec, configs: Sequence[RunConfig]) -> None:
    """A swept axis (several values) that no planned run reads is a mistake, not a grid collapsed to one value:
    `--method erm --alpha 1e-2..1` trains one ERM run. ConfigError naming who would read it."""
    for name, values in spec.axes.items():
        field = "eps" if name == "p_min" else name
        if len(set(values)) < 2 or len({getattr(c, field) for c in configs}) > 1:
            continue
        methods = sorted({c.method for c in configs}, key=lambda m: METHOD_INFO[m].order)
        if FIELDS[field].method_knob:
            readers = [m for m in METHOD_INFO if field in METHOD_INFO[m].reads]
            why = (f"no planned method reads it ({', '.join(methods)}); "
                   f"{', '.join(readers)} do: add one with --method")
        else:
            switch = FIELDS[field].switched_by
            why = ("every planned run ignores it" + (f" (it is read only with {FIELDS[switch].flag} other than "
                                                     f"{FIELDS[switch].default!r})" if switch else ""))
        raise ConfigError(f"--{axis_flag(name)} sweeps {len(set(values))} values, but {why}")


def sweep_id(spec: SweepSpec, configs: list[RunConfig]) -> str:
    """Stable id: the same set of runs (under the same name) is the same sweep."""
    h = hashlib.sha256()
    h.update((spec.name or "").encode())
    for run_id in sorted(c.run_id for c in configs):
        h.update(run_id.encode())
    return h.hexdigest()[:12]


def tune_id(spec: SweepSpec) -> str:
    """A --tune sweep's id: its axes, fixed fields and objective, not its trial count, so `--tune 30` after
    `--tune 20` adds ten trials to the same sweep and study (``t`` + 11 hex digits: never a grid sweep's id)."""
    same = dataclasses.replace(spec, tune=None)
    return "t" + hashlib.sha256(f"{same.name}|{same.task}|{sorted(same.to_json().items())}".encode()).hexdigest()[:11]
