"""Reports: the paper's tables and figures from the run database and the Parquet records (never torch).

The names `flctl report` takes live here (the tables' in flctl.report.table_specs), so that the command line lists
them in its help without importing numpy or pyarrow; the modules that build each one import them from here.
"""

FORMATS = ("rich", "markdown", "latex", "csv")
# --out's extension when --format is not given (any other: the terminal's rich text)
FORMAT_OF_SUFFIX = {".md": "markdown", ".tex": "latex", ".csv": "csv"}
PLOTS = ("cdf", "cvar", "heatmap", "multipliers", "top-multipliers", "polyfit", "dynamics", "reliability")
QUERIES = ("violators", "diff")


def listed(names: tuple[str, ...]) -> str:
    """'a, b or c': how help texts list a choice ('a' for one)."""
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else "".join(names)
