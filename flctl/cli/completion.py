"""Shell completion of `flctl`'s arguments: task names (without importing a task), fixed choices (methods, plots,
tables, formats), and the ids and sweep names of the database a command would open, read-only and never with an
error."""

from __future__ import annotations

import typer


def complete_task(incomplete: str) -> list[str]:
    """Shell completion of task names: the modules of flctl_tasks, without importing them (torch stays out)."""
    import pkgutil

    import flctl_tasks

    names = sorted(m.name.replace("_", "-") for m in pkgutil.iter_modules(flctl_tasks.__path__)
                   if not m.name.startswith("_"))
    return [n for n in names if n.startswith(incomplete)]


def _complete_ids(ctx: typer.Context, incomplete: str, kind: str) -> list[str]:
    """Ids (and sweep names) in the database the command would open, read-only; nothing when there is none or it
    cannot be read: completion never prints an error."""
    from flctl import results

    try:
        store = results.peek(results.find(ctx.params.get("results_dir"), ctx.params.get("db"), results.CLI).url)
        if store is None:
            return []
        try:
            if kind == "run":
                found = [r.id for r in store.list_runs(limit=None)]
            else:
                found = [x for s in store.list_sweeps() for x in (s["id"], s.get("name")) if x]
        finally:
            store.close()
    except Exception:   # noqa: BLE001 - a shell's tab key must never see a traceback
        return []
    return sorted({x for x in found if x.startswith(incomplete)})


def complete_run(ctx: typer.Context, incomplete: str) -> list[str]:
    """Shell completion of run ids."""
    return _complete_ids(ctx, incomplete, "run")


def complete_sweep(ctx: typer.Context, incomplete: str) -> list[str]:
    """Shell completion of sweep ids and names."""
    return _complete_ids(ctx, incomplete, "sweep")
