"""`flctl runs` and `flctl show RUN`: what the database holds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Optional

import typer

from flctl.cli.common import (
    DbOption,
    ResultsDirOption,
    bad_input_exits_2,
    complete_from,
    console,
    existing_store,
    fail,
    find,
    results_folder,
    safe,
)
from flctl.cli.completion import complete_run, complete_task
from flctl.cli.output import JSON_OPT, print_json
from flctl.errors import ConfigError
from flctl.method_info import METHOD_INFO
from flctl.status import STATUSES, Status, error_line


def runs(
    task: Annotated[Optional[str], typer.Option(help="Only this task.", autocompletion=complete_task)] = None,
    method: Annotated[Optional[str], typer.Option(help="Only this method.",
                                                                autocompletion=complete_from(METHOD_INFO))] = None,
    status: Annotated[Optional[str], typer.Option(help=f"Only runs in this state: {', '.join(STATUSES)}.",
                                                                autocompletion=complete_from(STATUSES))] = None,
    seed: Annotated[Optional[int], typer.Option(help="Only this seed.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many (newest first); 0: all.")] = 50,
    as_json: JSON_OPT = False,
    db: DbOption = None,
    results_dir: ResultsDirOption = None,
) -> None:
    """List recorded runs, newest first."""
    if status is not None and status not in STATUSES:
        fail(f"unknown status {status!r}; choose one of: {', '.join(STATUSES)}")
    if limit < 0:
        fail(f"--limit must be a number of runs >= 0 (0: all), got {limit}")
    from flctl.tasks import canonical_name

    task = None if task is None else canonical_name(task)     # TWO-MOONS is two-moons, as for `flctl run`
    store = existing_store(results_folder(results_dir, db))
    rows = store.list_runs(task=task, method=method, status=status, seed=seed, limit=limit or None)
    if not rows:         # none: a task or method no run has and flctl does not know is a typo, one line
        from flctl.api_args import check_known

        check_known(store, task, method, as_option=True)
    if as_json:
        print_json([r.to_json() for r in rows])
        return
    from flctl.db.reads import run_ids

    if not rows:
        console.print("no run matches" if (task, method, status, seed) != (None,) * 4 else "no runs yet")
        return
    shown, note = runs_table(rows, run_ids(store), console.width)
    console.print(shown)
    if note:
        console.print(f"[dim]{note}[/]")
    total = len(rows) if not limit or len(rows) < limit else \
        store.count_runs(task=task, method=method, status=status, seed=seed)
    console.print(f"{total} run(s)" if total == len(rows) else
                  f"{len(rows)} of {total} runs; --limit N shows more (0: all)")


def show(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="Run id or a unique prefix of it.",
                                                         autocompletion=complete_run)],
    as_json: JSON_OPT = False,
    db: DbOption = None,
    results_dir: ResultsDirOption = None,
) -> None:
    """Show one run: configuration, status, metrics and artifact paths."""
    store = existing_store(results_folder(results_dir, db))
    run = find(store.get_run, run_id, "run")
    if as_json:
        print_json(run.to_json())
        return
    from rich.table import Table

    from flctl.cli.run import print_summary

    cfg = Table("config", "value", show_header=False)
    for k, v in sorted(run.config.items()):
        cfg.add_row(safe(k), safe(v))
    console.print(cfg)
    console.print(safe(f"host {run.host} · git {run.git_sha or '-'} · attempts {run.attempts} · "
                       f"started {run.started_at} · finished {run.finished_at or '-'}"))
    if run.error:        # a traceback: line by line, as Python printed it (safe() would fold it into one line)
        for line in run.error.rstrip().splitlines():
            console.print(f"[red]{safe(line)}[/]", highlight=False, soft_wrap=True)
    libraries = (run.provenance or {}).get("libraries") or {}
    if libraries:
        console.print("libraries: " + " · ".join(f"{safe(k)} {safe(v)}" for k, v in libraries.items()
                                                 if v is not None), highlight=False)
    print_summary(run)
    for kind, path in sorted(run.artifacts.items()):
        if kind != "records":            # print_summary named them
            console.print(safe(f"{kind}: {path}"))


ID_DIGITS = 8      # the id column's least width: `flctl show` takes any unique prefix of at least 4


def unique_prefix(shown: list[str], every: list[str]) -> int:
    """The shortest prefix length (at least ID_DIGITS) at which each of ``shown`` names one run among ``every``."""
    for n in range(ID_DIGITS, max(map(len, shown), default=ID_DIGITS) + 1):
        counts: dict[str, int] = {}
        for run_id in every:
            counts[run_id[:n]] = counts.get(run_id[:n], 0) + 1
        if all(counts.get(run_id[:n], 0) <= 1 for run_id in shown):
            return n
    return max(map(len, shown), default=ID_DIGITS)


# What makes two listed runs look alike (the table's own columns: their header, and the run's value): the `differs`
# column tells such runs apart by the rest of their configuration, and its caption names these.
LOOK_ALIKE: dict[str, Callable[[Any], Any]] = {
    "task": lambda r: r.task, "method": lambda r: r.method, "ε": lambda r: r.config.get("eps"),
    "α": lambda r: r.config.get("alpha"), "seed": lambda r: r.seed}
DIFFERS_NOTE = (f"differs: what tells a run apart from the others listed with its {', '.join(list(LOOK_ALIKE)[:-1])} "
                f"and {list(LOOK_ALIKE)[-1]} (blank: no such other)")


def _differs(rows) -> list[str]:
    """For each run that looks like another listed one (the same LOOK_ALIKE: task, method, ε, α and seed), the config
    fields and task options in which they differ: polyfit at two degrees, a smoke and a full run read apart."""
    from flctl.config import RunConfig

    def flat(r) -> dict:
        c = RunConfig.from_json(r.config).to_dict()
        return {**{k: v for k, v in c.items() if k not in ("options", "device", "data_dir")}, **c["options"]}

    looks = [tuple(value(r) for value in LOOK_ALIKE.values()) for r in rows]
    configs = [flat(r) for r in rows]
    out = []
    for look, mine in zip(looks, configs):
        alike = [c for other, c in zip(looks, configs) if other == look]
        keys = sorted({k for c in alike for k in c if len({repr(d.get(k)) for d in alike}) > 1})
        out.append(" ".join(f"{k}={_num(mine.get(k))}" for k in keys))
    return out


def runs_table(rows, every_id: list[str], width: int):
    """`flctl runs`' table, fitted to ``width`` columns: whole ids where every column fits with them, else each at its
    unique prefix, never shorter (ids are what `flctl show` takes); the other columns, last first, give way instead,
    named in the returned note (lines; the `differs` column's, DIFFERS_NOTE, first)."""
    from rich.table import Table

    cells: dict[str, list[str]] = {
        "id": [r.id for r in rows], "task": [safe(r.task) for r in rows],
        "method": [safe(r.method) for r in rows], "status": [safe(r.status) for r in rows],
        "differs": _differs(rows),
        "ε": [_num(r.config.get("eps")) for r in rows], "α": [_num(r.config.get("alpha")) for r in rows],
        "seed": [safe(r.seed) for r in rows], "epochs": [safe(r.epochs_done) for r in rows],
        "test acc": [_num(r.metrics.get("test.accuracy")) for r in rows],
        "train max": [_num(r.metrics.get("train.max_loss")) for r in rows],
        "train avg": [_num(r.metrics.get("train.avg_loss")) for r in rows],
        "test avg": [_num(r.metrics.get("test.avg_loss")) for r in rows],
        "time": [f"{r.duration_s:.1f}s" if r.duration_s else "" for r in rows],
        "error": [_short(error_line(r.error or "")) if r.status == Status.FAILED else "" for r in rows],
    }
    always = ("id", "task", "method", "status")
    cells = {k: v for k, v in cells.items() if k in always or any(v)}

    def fit() -> tuple[list[str], list[str]]:
        used, kept, left = 1, [], []                 # 1: the table's left border
        for name, values in cells.items():
            need = max([len(name), *map(len, values)]) + 3    # rich's padding and the border
            if used + need <= width or name in always:
                used += need
                kept.append(name)
            else:
                left.append(name)
        return kept, left

    kept, left = fit()
    if left:
        digits = unique_prefix(cells["id"], every_id)
        cells["id"] = [i[:digits] for i in cells["id"]]
        kept, left = fit()
    table = Table(*kept)
    for column in table.columns:
        column.no_wrap = True
        if column.header == "id":
            column.min_width = max(map(len, cells["id"]), default=ID_DIGITS)
    for i in range(len(rows)):
        table.add_row(*(f"[red]{cells[k][i]}[/]" if k == "error" and cells[k][i] else cells[k][i] for k in kept))
    notes = [DIFFERS_NOTE] if "differs" in kept else []     # the column compares some runs only: it says which
    if left:
        notes.append(f"{len(left)} more column(s) do not fit here ({', '.join(left)}): `flctl show ID` or --json has "
                     "them all")
    return table, "\n".join(notes)


def _short(text: str) -> str:
    return safe(text if len(text) <= 60 else text[:59] + "…")


def _num(v) -> str:
    if v is None:
        return ""
    return f"{v:.4g}" if isinstance(v, float) else safe(v)


def migrate(db: DbOption = None, results_dir: ResultsDirOption = None) -> None:
    """Upgrade an existing database to this flctl's schema, changing no run (ids, results, records), or make a new
    one's schema (an operator's new PostgreSQL database, or a SQLite file in a folder that exists, before workers
    start).

    flctl run and flctl sweep upgrade a database on their own; the commands that only read (runs, show, status,
    report) refuse one from an older flctl until something has.
    """
    from flctl import migrations, results
    from flctl.errors import EmptyDatabase, OlderSchema, StoreError

    folder = results_folder(results_dir, db)
    url = folder.url
    try:
        store = results.peek(url)
        if store is None:           # a file not made yet: an operator's first step, in a folder that must be there
            _make_database(url)
            return
        store.close()
        console.print(f"the database is up to date (schema revision {migrations.head()})")
        return
    except OlderSchema:
        done = "upgraded the database to"
    except EmptyDatabase:
        done = "made the empty database's tables at"
    except (ConfigError, StoreError) as exc:      # not an flctl database, newer, unreachable: nothing to upgrade
        fail(str(exc))
    existing_store(folder, readonly=False).close()    # a writable open makes or upgrades it, under the schema lock
    console.print(f"{done} schema revision {migrations.head()}")


def _make_database(url: str) -> None:
    """`flctl migrate` of a SQLite file not made yet: made with this flctl's schema where its folder exists (one
    line, exit 2, and no folder made where it does not: a mistyped path must not become a tree of folders)."""
    from flctl import migrations
    from flctl.db import Store
    from flctl.db.urls import database_file

    file = database_file(url)
    if file is None or not file.parent.is_dir():
        fail(f"no folder {str(file.parent if file else url)!r} for the run database {str(file or url)!r}; make the "
             "folder first, or give --db a file in a folder that exists")
    bad_input_exits_2(Store.open, url).close()
    console.print(f"made a new run database at {safe(str(file))} (schema revision {migrations.head()})")


def run_or_sweep(store, ref: str) -> tuple[Any, dict | None]:
    """The run (id or unique prefix) or sweep (id, prefix or name) ``ref`` names: (run, None) or (None, sweep); a
    one-line exit 2 where it names neither, both, or several (flctl.db.reads.run_or_sweep)."""
    from flctl.db.reads import run_or_sweep as named

    return bad_input_exits_2(named, store, ref)
