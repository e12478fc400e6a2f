"""Shell completion of `flctl`'s arguments: task names (flctl's own without importing them, and the plugin tasks of
installed packages and FLCTL_TASKS), trackers, fixed choices (methods, plots, tables, formats), and the ids and sweep
names of the database a command would open, read-only and never with an error. `flctl --install-completion`
installs it in the shell (README, "Shell completion")."""

from __future__ import annotations

import contextlib
import io

import typer


def complete_task(incomplete: str) -> list[str]:
    """Shell completion of task names: the modules of flctl_tasks, without importing them (torch stays out), and
    the plugin tasks (flctl.plugins), whose modules are imported as any command naming one imports them."""
    import pkgutil

    import flctl_tasks

    names = {m.name.replace("_", "-") for m in pkgutil.iter_modules(flctl_tasks.__path__) if not m.name.startswith("_")}
    return sorted(n for n in names | _plugin_task_names() if n.startswith(incomplete))


def _plugin_task_names() -> set[str]:
    """The names of the plugin tasks that load; nothing said of one that does not (the shell would print it in the
    middle of the line being typed: `flctl tasks` names it)."""
    from flctl import plugins

    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            return {task.name for task, _ in plugins.task_modules() if isinstance(getattr(task, "name", None), str)}
    except Exception:   # noqa: BLE001 - a plugin's import may raise anything; a tab key must never see a traceback
        return set()


def complete_logger(incomplete: str) -> list[str]:
    """Shell completion of a tracker: flctl's loggers and the installed ones (flctl.loggers.registry.names)."""
    from flctl.loggers.registry import names

    try:
        return [n for n in names() if n.startswith(incomplete)]
    except Exception:   # noqa: BLE001 - a broken entry point: complete nothing rather than print a traceback
        return []


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
