"""flctl's command line. Each command parses, calls one function, prints; heavy imports stay inside commands
so that `flctl --help` starts fast."""

from __future__ import annotations

import typer

from flctl.cli import info, report, run, runs, sweep

app = typer.Typer(
    name="flctl",
    help="Feasible Learning experiment orchestrator: train ERM, CSERM, FL and RFL, keep every sample's loss "
    "and multiplier, and turn runs into the paper's tables and figures.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",   # not "rich": a help text's "[default: 60]" must print, not be read as markup
)
app.command(rich_help_panel="Train")(run.run)
app.command(rich_help_panel="Train")(sweep.sweep)
app.command(rich_help_panel="Train")(sweep.cancel)
app.command(rich_help_panel="Inspect")(sweep.status)
app.command(rich_help_panel="Inspect")(sweep.sweeps)
app.command(rich_help_panel="Inspect")(runs.runs)
app.command(rich_help_panel="Inspect")(runs.show)
app.command(rich_help_panel="Report")(report.report)
app.command(rich_help_panel="Catalogue")(info.tasks)
app.command(rich_help_panel="Catalogue")(info.methods)


def main() -> None:
    app()
