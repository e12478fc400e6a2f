"""Making one report, for `flctl report`, flctl.api.report and the paper's bundle alike: the request checked before
any database is read (``Request.check``), the runs and sweep chosen (``choose_runs``), the table built, the figure
drawn or the per-sample query computed, its file written (``make_report``). What is printed of it is the caller's:
the command prints ``Made``, the API returns it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flctl.errors import ConfigError
from flctl.report import FORMAT_OF_SUFFIX, FORMATS, listed
from flctl.report.plot_specs import PLOT_SPECS, QUERY_SPECS, plot_spec, query_spec
from flctl.report.table_specs import TABLE_SPECS, by_tables, table_spec

if TYPE_CHECKING:
    from flctl.layout import Layout

# Bounds of the numeric options: (least, most or None)
BOUNDS = {"digits": (0, 12), "top": (1, None), "min_seeds": (1, None), "k": (1, None)}
FLAGS = {"digits": "--digits", "top": "--top", "min_seeds": "--min-seeds", "k": "-k"}
# The sweeps that hold some runs: each held run's id -> the latest such sweep's (id, name); a run of its own is not in
# it. Handed down by the caller that opened the store (flctl.db.reads.latest_sweeps over it): a report reads the
# database only through what it is given.
SweepsOf = Callable[[list[str]], dict[str, tuple[str, str | None]]]


@dataclass(frozen=True)
class Request:
    """One report: exactly one of ``table``, ``plot`` and ``samples``, the runs it is of (``sweep``, ``task``; none:
    every finished run), and its options. ``out``: the file to write (a plot's: a path stem); None: a table is
    printed, a figure or query goes under RESULTS/reports/ named for what it shows."""

    table: str | None = None
    plot: str | None = None
    samples: str | None = None
    by: str | None = None
    sweep: str | None = None
    task: str | None = None
    columns: tuple[str, ...] | None = None
    split: str | None = None
    k: int = 16
    min_seeds: int = 1
    eps: float | None = None
    methods: str | None = None
    top: int = 20
    digits: int = 2
    fmt: str | None = None
    out: Path | None = None

    def check(self) -> Request:
        """The request checked, before any database is read (ConfigError); its format chosen (--out's extension,
        else rich) and its columns stripped."""
        if sum(x is not None for x in (self.table, self.plot, self.samples)) != 1:
            raise ConfigError("give exactly one of --table, --plot or --samples")
        spec = table_spec(self.table) if self.table is not None else None     # an unknown name lists the tables
        if self.plot is not None:
            plot_spec(self.plot)
        if self.samples is not None:
            query_spec(self.samples)
        if (spec is not None and spec.by) != (self.by is not None):
            raise ConfigError(f"--table {self.table} needs --by ATTRIBUTE (e.g. race)" if self.by is None
                              else f"--by applies to --table {listed(by_tables())}")
        if self.split not in (None, "train", "test"):
            raise ConfigError(f"--split must be train or test, got {self.split!r}")
        for name, (lo, hi) in BOUNDS.items():
            value = getattr(self, name)
            if value < lo or (hi is not None and value > hi):
                raise ConfigError(f"{FLAGS[name]} must be {f'in {lo}..{hi}' if hi is not None else f'at least {lo}'}, "
                                  f"got {value}")
        columns = None if self.columns is None else tuple(c.strip() for c in self.columns if c.strip())
        if columns is not None and not columns:
            raise ConfigError("--columns is empty; give e.g. train.avg_loss,test.max_loss")
        if columns:
            from flctl.report.tables import check_column

            for c in columns:
                check_column(c)
        out = None if self.out is None else Path(self.out)
        if out is not None and self.plot is not None and out.is_dir():
            raise ConfigError(f"--out {str(out)!r} is a directory; a plot's --out is a path stem (e.g. "
                              f"{str(out / self.plot)!r} writes {self.plot}.png and {self.plot}.pdf in it)")
        if out is not None:
            from flctl.fs import check_writable

            check_writable(out if self.plot is None else out.with_suffix(".png"))   # a plot's --out is a stem
        fmt = self.fmt or (FORMAT_OF_SUFFIX.get(out.suffix.lower(), "rich") if out is not None else "rich")
        if self.table is not None and fmt not in FORMATS:
            raise ConfigError(f"unknown format {fmt!r}; choose one of: {', '.join(FORMATS)}")
        from flctl.tasks import canonical_name

        task = None if self.task is None else canonical_name(self.task)   # as `flctl run` reads it
        return dataclasses.replace(self, task=task, columns=columns, fmt=fmt, out=out)


@dataclass
class Made:
    """What a report made: ``of`` (what it is of: "sweep S" or its runs' tasks), ``table`` (a table, titled, and
    ``text`` rendered in its format) or ``frame`` (a query's pyarrow Table), ``files`` written, ``notes`` (warnings
    about what it shows) and ``said`` (what was chosen for it, for a person)."""

    of: str
    runs: list[Any]
    table: Any = None
    text: str | None = None
    frame: Any = None
    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    said: list[str] = field(default_factory=list)
    mixed: str | None = None        # runs of several sweeps (or of their own) shown together: how to choose one


def choose_runs(store: Any, request: Request, said: list[str]) -> tuple[list[Any], str | None, str | None]:
    """The finished runs ``request`` is of, with the sweep and task it chose: a table of one task's runs (the LLM
    table: orca-dpo's) where neither --task nor --sweep is given; a figure of one grid (the heatmap) the latest
    sweep of --task that varies its field, told in ``said``."""
    from flctl.report.data import select_runs

    sweep, task = request.sweep, request.task
    spec = TABLE_SPECS[request.table] if request.table is not None else None
    if spec is not None and spec.task is not None and sweep is None and task is None:
        task = spec.task
    field_ = PLOT_SPECS[request.plot].latest_sweep_varying if request.plot is not None else None
    if field_ is not None and sweep is None:
        sweep = _latest_sweep_varying(store, task, field_, request.plot or "", said)
    return select_runs(store, sweep=sweep, task=task), sweep, task


def _latest_sweep_varying(store: Any, task: str | None, field_: str, plot: str, said: list[str]) -> str:
    for row in store.list_sweeps():   # newest first
        if task is not None and row["task"] != task:
            continue
        found = store.get_sweep(row["id"])
        if found is not None and len(found["spec"].get("axes", {}).get(field_, [])) > 1:
            said.append(f"{plot} of sweep {row['id']} ({row['name'] or row['task']}), the latest that varies "
                        f"{field_}")
            return row["id"]
    raise ConfigError(f"the {plot} draws one {field_} x dual-lr sweep and none of the database's sweeps"
                      + (f" of {task}" if task else "") + f" varies {field_}; run one (`flctl sweep TASK --lr "
                      "1e-4..1e-2 --dual-lr 1e-3..1e-1`) or pass --sweep")


def mixed(store: Any, runs: list[Any], sweeps_of: SweepsOf) -> str | None:
    """The one rule of every table and figure of no --sweep: all the runs asked for, whatever made them; where they
    come from several sweeps, or sweeps and runs of their own (other scales, other grids), a line that says so and
    how to choose one (None where they are of one)."""
    held = sweeps_of([r.id for r in runs])
    sweeps = {sid: name for sid, name in held.values()}
    alone = sum(r.id not in held for r in runs)
    if len(sweeps) + (alone > 0) < 2:
        return None
    latest = next(w["id"] for w in store.list_sweeps() if w["id"] in sweeps)     # newest first
    return (f"these {len(runs)} runs come from {len(sweeps)} sweep(s)" + (f" and {alone} run(s) of their own" if alone
            else "") + f", shown together; `--sweep ID` shows one (the latest: {latest}"
            + (f", {sweeps[latest]}" if sweeps[latest] else "") + "; `flctl sweeps` lists them)")


def of(runs: list[Any], sweep: str | None) -> str:
    """What a report is of, for its title and a figure's file name: the sweep asked for, else its runs' tasks."""
    return f"sweep {sweep}" if sweep is not None else "-".join(sorted({r.task for r in runs})) or "no runs"


def make_report(store: Any, layout: Layout, request: Request, sweeps_of: SweepsOf) -> Made:
    """Make ``request`` (checked: Request.check) of ``store``'s runs, with the records of the results folder
    ``layout`` lays out (flctl.results.Results.layout, as the command found it): a table
    (written to --out if given), a figure (PNG and PDF) or a query (Parquet); ``sweeps_of`` tells which sweeps hold
    runs, over the same store. ConfigError for what cannot be made."""
    request = request.check()
    said: list[str] = []
    runs, sweep, _ = choose_runs(store, request, said)
    made = Made(of(runs, sweep), runs, said=said, mixed=None if sweep is not None else mixed(store, runs, sweeps_of))
    if request.table is not None:
        _table(made, request, layout.records)
    elif request.plot is not None:
        from flctl.report.plots import plot as draw

        # named for what it shows: a plot of another task or sweep is another file, not this one overwritten
        stem = request.out or layout.plot(request.plot, sweep if sweep is not None else made.of)
        made.files = draw(request.plot, runs, layout.records, stem, split=request.split, k=request.k)
    else:
        _query(made, request, layout.records, request.out or layout.samples(request.samples or ""))
    return made


def build_table(table: str, runs: list[Any], records_root: Path, columns: list[str] | None = None,
                by: str | None = None) -> Any:
    """The table named ``table`` of ``runs`` (a flctl.report.tables.Table), its tail columns (cvar@q, quantile@q)
    computed from the records: a report's and the paper bundle's tables alike."""
    from flctl.report import tables

    spec = table_spec(table)
    if spec.by:
        from flctl.report.groups import groups_table

        return groups_table(runs, records_root, by or "", columns, spec)
    return tables.build(spec, runs, columns, tables.record_values(runs, records_root, columns or []))


def _table(made: Made, request: Request, records_root: Path) -> None:
    from flctl.fs import write_text_atomic
    from flctl.report.render import render

    built = build_table(request.table or "", made.runs, records_root,
                        list(request.columns) if request.columns else None, request.by)
    made.table = dataclasses.replace(built, title=f"{built.title} ({made.of})")
    made.text = render(made.table, request.fmt or "rich", request.digits)
    made.notes = list(built.notes)
    if request.out is not None:
        write_text_atomic(request.out, made.text)
        made.files = [request.out]


def _query(made: Made, request: Request, records_root: Path, out: Path) -> None:
    import pyarrow.parquet as pq

    from flctl.fs import atomic_path
    from flctl.report import samples

    options = {"split": request.split, "min_seeds": request.min_seeds, "eps": request.eps,
               "methods": request.methods, "top": request.top}
    made.frame = QUERY_SPECS[request.samples or ""].run(made.runs, records_root, options)
    if request.samples == "violators" and request.min_seeds > (most := samples.most_seeds(made.runs)):
        made.notes.append(f"--min-seeds {request.min_seeds}: no configuration has that many seeds (at most "
                          f"{most}), so no sample qualifies")
    with atomic_path(out) as tmp:
        pq.write_table(made.frame, tmp)
    made.files = [out]

