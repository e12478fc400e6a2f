"""Shell completion of `flctl`'s arguments: task names (flctl's own without importing them, and the plugin tasks of
installed packages and FLCTL_TASKS), trackers, fixed choices (methods, plots, tables, formats), and the ids and sweep
names of the database a command would open, read-only and never with an error. `flctl --install-completion`
installs it in the shell (README, "Shell completion")."""

from __future__ import annotations

import contextlib
import io
import sys

import typer


def complete_task(incomplete: str) -> list[str]:
    """Shell completion of task names: the modules of flctl_tasks, without importing them (torch stays out), and
    the plugin tasks (flctl.plugins), whose modules are imported as any command naming one imports them."""
    import pkgutil

    import flctl_tasks

    names = {m.name.replace("_", "-") for m in pkgutil.iter_modules(flctl_tasks.__path__) if not m.name.startswith("_")}
    return sorted(n for n in names | _plugin_task_names() if n.startswith(incomplete))


# How long a tab key waits for the plugin tasks' imports: a plugin that imports slowly (or never returns) leaves the
# built-in names offered, never a shell that hangs.
PLUGIN_WAIT_S = 2.0


def _plugin_task_names() -> set[str]:
    """The names of the plugin tasks that load within PLUGIN_WAIT_S; nothing said of one that does not (the shell
    would print it in the middle of the line being typed: `flctl tasks` names it). Imported on a daemon thread with
    the process's stdout and stderr descriptors on /dev/null (a plugin may write to fd 2 directly, or exit)."""
    import os
    import threading

    from flctl import plugins

    found: set[str] = set()

    def load() -> None:
        try:
            with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
                found.update(task.name for task, _ in plugins.task_modules()
                             if isinstance(getattr(task, "name", None), str))
        except BaseException:   # noqa: BLE001 - a plugin's import may raise anything, sys.exit included
            found.clear()

    saved, streams = [os.dup(1), os.dup(2)], (sys.stdout, sys.stderr)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        thread = threading.Thread(target=load, daemon=True, name="plugin tasks")
        thread.start()
        thread.join(PLUGIN_WAIT_S)
        return set(found) if not thread.is_alive() else set()
    finally:
        # the streams back too: a plugin still importing holds its redirect (process-wide), which would swallow the
        # completions the shell waits for
        sys.stdout, sys.stderr = streams
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)


def complete_logger(incomplete: str) -> list[str]:
    """Shell completion of a tracker: flctl's loggers and the installed ones (flctl.loggers.registry.names)."""
    from flctl.loggers.registry import names

    try:
        return [n for n in names() if n.startswith(incomplete)]
    except Exception:   # noqa: BLE001 - a broken entry point: complete nothing rather than print a traceback
        return []


def _complete_ids(ctx: typer.Context, incomplete: str, kind: str) -> list[str]:
    """Ids (and sweep names) in the database the command would open, read-only; nothing when there is none or it
    cannot be read: completion never prints an error, nor a damaged row's warning (in the line being typed)."""
    from flctl import results

    try:
        with contextlib.redirect_stderr(io.StringIO()):
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
