"""Reports: the paper's tables and figures from the run database and the Parquet records (never torch).

The names `flctl report` takes are registered in flctl.report.table_specs (tables) and flctl.report.plot_specs
(figures and per-sample queries), so that the command line lists them in its help without importing numpy or pyarrow;
flctl.report.flow makes a report for the command, the API and the paper's bundle alike.
"""

FORMATS = ("rich", "markdown", "latex", "csv")
# --out's extension when --format is not given (any other: the terminal's rich text)
FORMAT_OF_SUFFIX = {".md": "markdown", ".tex": "latex", ".csv": "csv"}


def listed(names: tuple[str, ...]) -> str:
    """'a, b or c': how help texts list a choice ('a' for one)."""
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else "".join(names)
