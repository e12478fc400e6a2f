"""`flctl runs` and `flctl show RUN`: what the database holds."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from flctl.cli.common import (
    DbOption,
    ResultsDirOption,
    complete_from,
    complete_run,
    complete_task,
    console,
    existing_db_url,
    existing_store,
    fail,
    find,
    results_root,
    safe,
)
from flctl.cli.info import JSON_OPT
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
    store = existing_store(db, results_root(results_dir))
    rows = store.list_runs(task=task, method=method, status=status, seed=seed, limit=limit or None)
    if as_json:
        print(json.dumps([r.to_json() for r in rows], indent=2, default=str))
        return
    from rich.table import Table

    table = Table("id", "task", "method", "ε", "α", "seed", "status", "epochs", "train avg", "train max",
                  "test avg", "test acc", "time", "error")
    for r in rows:
        m, c = r.metrics, r.config
        error = error_line(r.error or "") if r.status == Status.FAILED else ""
        table.add_row(safe(r.id), safe(r.task), safe(r.method), _num(c.get("eps")), _num(c.get("alpha")),
                      safe(r.seed), safe(r.status), safe(r.epochs_done), _num(m.get("train.avg_loss")),
                      _num(m.get("train.max_loss")), _num(m.get("test.avg_loss")), _num(m.get("test.accuracy")),
                      f"{r.duration_s:.1f}s" if r.duration_s else "",
                      f"[red]{safe(error if len(error) <= 60 else error[:59] + '…')}[/]" if error else "")
    console.print(table)
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
    store = existing_store(db, results_root(results_dir))
    run = find(store.get_run, run_id, "run")
    if as_json:
        print(json.dumps(run.to_json(), indent=2, default=str))
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


def _num(v) -> str:
    if v is None:
        return ""
    return f"{v:.4g}" if isinstance(v, float) else safe(v)


def migrate(db: DbOption = None, results_dir: ResultsDirOption = None) -> None:
    """Upgrade an existing database to this flctl's schema, changing no run (ids, results, records).

    flctl run and flctl sweep upgrade a database on their own; the commands that only read (runs, show, status,
    report) refuse one from an older flctl until something has.
    """
    from flctl import migrations
    from flctl.db import Store
    from flctl.errors import OlderSchema, StoreError

    url = existing_db_url(db, results_root(results_dir))
    try:
        Store.open(url, readonly=True).close()
        console.print(f"the database is up to date (schema revision {migrations.head()})")
        return
    except OlderSchema:
        pass
    except StoreError as exc:      # not an flctl database, newer, unreachable: nothing to upgrade
        fail(str(exc))
    try:
        Store.open(url).close()    # a writable open upgrades it, under the schema lock
    except StoreError as exc:
        fail(str(exc))
    console.print(f"upgraded the database to schema revision {migrations.head()}")
