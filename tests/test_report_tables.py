"""Report statistics and tables against hand-computed values; golden markdown and LaTeX."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from flctl.cli import app
from flctl.config import RunConfig
from flctl.db import RunRecord
from flctl.errors import ConfigError
from flctl.metrics import cvar, ece, split_summary
from flctl.report.tables import aggregate, build, render

runner = CliRunner()


def run(method: str, seed: int, eps=None, alpha=None, status="completed", task="two-moons", **metrics) -> RunRecord:
    run_id = f"{method}{eps}{alpha}{seed}"
    return RunRecord(id=run_id, config_hash=run_id, task=task, method=method, seed=seed,
                     config=RunConfig(task, method, seed, eps=eps, alpha=alpha, lr=0.1).to_dict(),   # as stored
                     status=status, epochs_done=1, attempts=1, host=None, pid=None, job_id=None, git_sha=None,
                     device=None, created_at="", started_at=None, finished_at=None, heartbeat_at=None,
                     duration_s=None, metrics={f"{k.replace('__', '.')}": v for k, v in metrics.items()},
                     diverged_at=None, lambda_capped=None, error=None, trained_with=None, provenance=None, claim_token=None,
                     together=None,
                     artifacts={})


RUNS = [
    run("erm", 0, train__avg_loss=0.10, train__max_loss=1.0, test__avg_loss=0.30, test__max_loss=2.0),
    run("erm", 1, train__avg_loss=0.20, train__max_loss=1.2, test__avg_loss=0.50, test__max_loss=2.4),
    run("fl", 0, eps=0.5, train__avg_loss=0.30, train__max_loss=0.6, test__avg_loss=0.40, test__max_loss=1.5),
    run("fl", 1, eps=0.5, train__avg_loss=0.34, train__max_loss=0.8, test__avg_loss=0.44, test__max_loss=1.3),
    run("rfl", 0, eps=0.5, alpha=1.0, train__avg_loss=0.25, train__max_loss=0.9, test__avg_loss=0.41,
        test__max_loss=1.9),
    run("rfl", 1, eps=0.5, alpha=1.0, status="diverged"),
]


@pytest.mark.notorch
def test_mean_and_sample_std() -> None:
    mean, std = aggregate([0.1, 0.2])
    assert mean == pytest.approx(0.15) and std == pytest.approx(np.sqrt(0.005))   # ddof = 1
    assert aggregate([0.3]) == (0.3, 0.0)
    assert aggregate([]) == (None, None)


@pytest.mark.notorch
def test_cvar_and_violation_rate_by_hand() -> None:
    losses = np.array([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 1.0])
    # 0.9-quantile (linear) = 0.82: samples at or above it: 1.0 -> CVaR 1.0; at q=0.5: 0.45 -> mean(.5..1.0)
    assert cvar(losses, 0.9) == pytest.approx(1.0)
    assert cvar(losses, 0.5) == pytest.approx(np.mean([0.5, 0.6, 0.7, 0.8, 1.0]))
    s = split_summary(losses, eps=0.45, multipliers=np.array([0.0, 0.0, 1.0, 2.0]),
                      correct=np.array([1, 0, 1, 1]))
    assert s["violation_rate"] == 0.5 and s["zero_multiplier_share"] == 0.5 and s["accuracy"] == 0.75
    assert s["avg_loss"] == pytest.approx(0.46) and s["max_loss"] == 1.0


@pytest.mark.notorch
def test_ece_by_hand() -> None:
    # 15 bins (k/15, (k+1)/15]: 0.95 -> last bin (2 samples, accuracy 1/2): 2 * |0.5 - 0.95| = 0.9;
    # 0.6 = 9/15 is the top edge of (8/15, 9/15] (3 samples, accuracy 2/3): 3 * |2/3 - 0.6| = 0.2;
    # 2/15 -> (1/15, 2/15] (wrong): |0 - 2/15|. ECE = (0.9 + 0.2 + 2/15) / 6
    conf = np.array([0.95, 0.95, 0.6, 0.6, 0.6, 2 / 15])
    ok = np.array([1, 0, 1, 1, 0, 0])
    assert ece(conf, ok) == pytest.approx((0.9 + 0.2 + 2 / 15) / 6)
    assert ece(np.array([0.7, 0.7]), np.array([1, 0]), bins=1) == pytest.approx(0.2)   # one bin: |0.5 - 0.7|
    assert split_summary(np.zeros(6), correct=ok, confidence=conf)["ece"] == ece(conf, ok)
    assert "ece" not in split_summary(np.zeros(6), correct=ok)


GOLDEN_MARKDOWN = """\
**Final performance**

| Method | ε | α | train.avg_loss | train.max_loss | test.avg_loss | test.max_loss |
|---|---|---|---:|---:|---:|---:|
| ERM | — | — | **0.150** ± 0.071 | 1.100 ± 0.141 | **0.400** ± 0.141 | 2.200 ± 0.283 |
| FL | 0.50 | — | 0.320 ± 0.028 | **0.700** ± 0.141 | 0.420 ± 0.028 | **1.400** ± 0.141 |
| RFL | 0.50 | 1.00 | 0.250† | 0.900† | 0.410† | 1.900† |

† RFL · 0.50 · 1.00: 1 of 2 seeds (1 diverged)
"""

GOLDEN_LATEX = r"""\begin{table}[t]
\centering
\caption{Final performance}
\begin{tabular}{lllcc}
\toprule
Method & $\epsilon$ & $\alpha$ & train.avg\_loss & test.max\_loss \\
\midrule
ERM & -- & -- & \textbf{0.15} {\color{gray}\scriptsize $\pm$ 0.07} & 2.20 {\color{gray}\scriptsize $\pm$ 0.28} \\
FL & 0.50 & -- & 0.32 {\color{gray}\scriptsize $\pm$ 0.03} & \textbf{1.40} {\color{gray}\scriptsize $\pm$ 0.14} \\
RFL & 0.50 & 1.00 & 0.25$^\dagger$ & 1.90$^\dagger$ \\
\bottomrule
\end{tabular}
\\[2pt]{\footnotesize $^\dagger$ RFL · 0.50 · 1.00: 1 of 2 seeds (1 diverged)}
\end{table}
"""


@pytest.mark.notorch
def test_golden_markdown() -> None:
    assert render(build("main", RUNS), "markdown", digits=3) == GOLDEN_MARKDOWN


@pytest.mark.notorch
def test_golden_latex() -> None:
    assert render(build("main", RUNS, ["train.avg_loss", "test.max_loss"]), "latex") == GOLDEN_LATEX
    table = build("main", RUNS, ["train.avg_loss"])
    table.notes = ["† 4 of 9 rows have fewer than 2 seeds; see `flctl runs` & #3"]
    assert render(table, "latex").splitlines()[-2] == (r"\\[2pt]{\footnotesize $^\dagger$ 4 of 9 rows have fewer than 2 "
                                                       r"seeds; see \texttt{flctl runs} \& \#3}")


@pytest.mark.notorch
def test_csv_keeps_full_precision_and_seed_counts() -> None:
    lines = render(build("main", RUNS, ["train.avg_loss"]), "csv").splitlines()
    assert lines[0] == "Method,ε,α,train.avg_loss,train.avg_loss.std,train.avg_loss.n"
    assert lines[1].startswith("ERM,—,—,0.15") and lines[1].endswith(",2")
    assert lines[3].endswith(",1")


@pytest.mark.notorch
def test_ablation_orders_erm_fl_as_alpha_infinity_then_rfl() -> None:
    table = build("ablation", RUNS, ["train.avg_loss"])
    assert [row[:3] for row, _ in table.rows] == [["—", "ERM", "—"], ["0.50", "FL", "∞"], ["0.50", "RFL", "1.00"]]


@pytest.mark.notorch
def test_every_tied_best_value_is_bold_and_tasks_are_not_mixed() -> None:
    runs = [run("erm", 0, train__avg_loss=0.101, train__max_loss=1.0, test__avg_loss=0.3, test__max_loss=2.0),
            run("fl", 0, eps=0.1, train__avg_loss=0.104, train__max_loss=1.0, test__avg_loss=0.4, test__max_loss=2.5)]
    text = render(build("main", runs), "markdown")
    assert text.count("**0.10**") == 2 and text.count("**1.00**") == 2    # equal as shown: both are best
    assert text.count("**0.30**") == 1 and "**0.40**" not in text
    with pytest.raises(ConfigError, match=r"of 2 tasks \(digits, two-moons\); pick one with --task or --sweep"):
        build("main", runs + [run("erm", 1, task="digits", train__avg_loss=0.2)])


@pytest.mark.notorch
def test_gd_and_nupi_runs_of_one_method_are_separate_rows() -> None:
    import dataclasses

    gd = run("fl", 0, eps=0.5, train__avg_loss=0.3)
    nupi = dataclasses.replace(run("fl", 0, eps=0.5, train__avg_loss=0.2), id="n",
                               config={**gd.config, "dual_optimizer": "nupi", "kp": 1.0})
    table = build("main", [gd, nupi], ["train.avg_loss"])
    assert [(row[-1], cells[0].mean) for row, cells in table.rows] == [("dual_optimizer=gd, kp=0.00", 0.3),
                                                                       ("dual_optimizer=nupi, kp=1.00", 0.2)]


@pytest.mark.notorch
def test_captured_and_eager_runs_are_one_configuration_and_only_varying_options_are_named() -> None:
    import dataclasses

    from flctl.report.groups_of_runs import curve_labels, group_by_config

    def variant(seed: int, run_id: str, **fields) -> RunRecord:
        base = run("fl", seed, eps=0.5, train__avg_loss=0.1 * (seed + 1))
        return dataclasses.replace(base, id=run_id, config={**base.config, **fields})

    # captured replays the eager step's kernels (one run id for both): one row of two seeds, no engine column
    eager, captured = variant(0, "e", engine="eager"), variant(1, "c", engine="captured")
    ((_, cells),) = build("main", [eager, captured], ["train.avg_loss"]).rows
    assert cells[0].n == 2 and cells[0].mean == pytest.approx(0.15)
    compiled = variant(2, "t", engine="compiled")       # another step: its own configuration
    assert len(group_by_config([eager, captured, compiled])) == 2

    # task options split configurations one by one, and a label names only those that vary
    low, high = (variant(0, f"d{d}", options={"degree": d, "noise": 0.1}) for d in (3, 10))
    labels = sorted(curve_labels(list(group_by_config([low, high]))).values())
    assert labels == ["FL ε=0.5 degree=10", "FL ε=0.5 degree=3"]
    assert [row[-1] for row, _ in build("main", [low, high], ["train.avg_loss"]).rows] == ["degree=3", "degree=10"]


@pytest.mark.notorch
def test_unknown_table_format_and_column() -> None:
    with pytest.raises(ConfigError, match="choose one of: main, ablation, llm, runs"):
        build("figure", RUNS)
    with pytest.raises(ConfigError, match="rich, markdown, latex, csv"):
        render(build("main", RUNS), "html")
    with pytest.raises(ConfigError, match="unknown column 'train.mean'"):
        build("main", RUNS, ["train.mean"])


# ---- through the CLI, on real runs ----

@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One small real sweep (3 methods x 2 seeds), made once for the module."""
    root = tmp_path_factory.mktemp("prepared") / "results"
    res = runner.invoke(app, ["sweep", "two-moons", "-m", "erm,fl,rfl", "--eps", "0.3", "--alpha", "0.5",
                              "--seeds", "2", "--epochs", "4", "--executor", "debug", "--name", "small",
                              "--results-dir", str(root)])
    assert res.exit_code == 0, res.output
    return root


@pytest.fixture
def finished(prepared: Path, results: Path) -> Path:
    """A private copy of the prepared results as this test's results directory."""
    import shutil

    shutil.copytree(prepared, results)
    # The database stores artifact paths of the prepared copy; reports only read records under --results-dir.
    return results


def test_report_tables_from_the_database_and_records(finished: Path, tmp_path: Path) -> None:
    out = tmp_path / "main.tex"           # no --format: the extension says LaTeX
    res = runner.invoke(app, ["report", "--table", "main", "--sweep", "small", "--out", str(out),
                              "--columns", "train.avg_loss,test.cvar@0.95,train.quantile@0.5,train.violation_rate"])
    assert res.exit_code == 0, res.output
    tex = out.read_text()
    assert r"\toprule" in tex and "test.cvar@0.95" in tex and tex.count(r"\\") >= 4
    # The computed tail column equals CVaR of the final records, averaged over seeds.
    from flctl.db import Store
    from flctl.report.data import final_records

    store = Store.open(f"sqlite:///{finished / 'flctl.db'}")
    fl = [r for r in store.list_runs(method="fl")]
    recs = final_records(finished / "records", [r.id for r in fl], ["run_id", "loss"], split="test")
    per_run = [cvar(recs.filter(recs["run_id"].to_numpy(zero_copy_only=False) == r.id)["loss"].to_numpy(), 0.95)
               for r in fl]
    csv_out = runner.invoke(app, ["report", "--table", "main", "--format", "csv", "--columns", "test.cvar@0.95"])
    row = [line for line in csv_out.stdout.splitlines() if line.startswith("FL,")][0].split(",")
    assert float(row[3]) == pytest.approx(np.mean(per_run)) and row[-1] == "2"


def test_report_samples_queries(finished: Path, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    out = tmp_path / "v.parquet"
    res = runner.invoke(app, ["report", "--samples", "violators", "--min-seeds", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    table = pq.read_table(out)
    assert table.num_rows > 0 and min(table["seeds_violating"].to_pylist()) >= 2
    assert max(table["max_loss"].to_pylist()) > 0.3                 # eps of the runs is 0.3
    res = runner.invoke(app, ["report", "--samples", "diff", "--methods", "erm,fl", "--top", "5",
                              "--out", str(tmp_path / "d.parquet")])
    assert res.exit_code == 0, res.output
    d = pq.read_table(tmp_path / "d.parquet")
    diffs = np.abs(d["difference"].to_numpy())
    assert len(d) == 5 and (np.diff(diffs) <= 0).all()


@pytest.mark.parametrize("args,needle", [
    (["--table", "main", "--out", "{tmp}"], "is a directory"),
    (["--table", "main", "--out", "{tmp}/a-file/table.md"], "which is a file"),
    (["--plot", "cdf", "--out", "/proc/flctl/fig"], "cannot write in '/proc'"),
    (["--plot", "cdf", "--out", "{tmp}"], "a plot's --out is a path stem"),      # not {tmp}.png beside it
])
def test_output_paths_are_checked_before_any_work(finished: Path, tmp_path: Path, args, needle) -> None:
    (tmp_path / "a-file").write_text("")
    before = sorted(tmp_path.rglob("*"))
    res = runner.invoke(app, ["report", *(a.format(tmp=tmp_path) for a in args)])
    assert res.exit_code == 2 and needle in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.output
    assert sorted(tmp_path.rglob("*")) == before


def test_missing_records_and_a_sweep_without_completed_cells(finished: Path) -> None:
    import shutil

    from flctl.db import Store
    from tests.helpers import config

    store = Store.open(f"sqlite:///{finished / 'flctl.db'}")
    store.create_sweep("pending0000", "pending", "two-moons", {}, [config("two-moons", "fl", seed=9)])
    res = runner.invoke(app, ["report", "--table", "main", "--sweep", "pending"])
    assert res.exit_code == 2 and "has no completed cells yet" in res.stderr
    shutil.rmtree(finished / "records")
    res = runner.invoke(app, ["report", "--table", "main", "--columns", "test.cvar@0.9"])
    assert res.exit_code == 2 and "has no per-sample records" in res.stderr


def test_corrupt_records_file(finished: Path) -> None:
    victim = sorted((finished / "records").rglob("epoch=*.parquet"))[-1]
    victim.write_bytes(b"not parquet")
    res = runner.invoke(app, ["report", "--table", "main", "--columns", "test.cvar@0.9"])
    assert res.exit_code == 2 and f"{victim} is not a Parquet file" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


@pytest.mark.notorch
def test_cvar_curve_of_the_figures_matches_the_summary_cvar() -> None:
    from flctl.report.plots import _cvar_curve

    rng = np.random.default_rng(0)
    losses = rng.exponential(1.0, 1001)
    qs = np.array([0.0, 0.25, 0.5, 0.9, 0.99])
    np.testing.assert_allclose(_cvar_curve(losses, qs), [cvar(losses, q) for q in qs])
    hand = np.array([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 1.0])
    assert _cvar_curve(hand, np.array([0.0]))[0] == pytest.approx(hand.mean())      # CVaR(0) = mean
    assert _cvar_curve(hand, np.array([0.9]))[0] == pytest.approx(1.0)


@pytest.mark.notorch
def test_a_wide_runs_table_keeps_what_matters_in_the_terminal_and_says_what_it_left_out() -> None:
    """Every field varies across tasks and runs record ~20 metrics: squeezed into 200 columns each would read "ta…".
    The terminal keeps run, task, method, the losses and accuracy, then ε, α, lr; the note names the rest."""
    from flctl.metrics import SPLITS, SUMMARY_METRICS
    from flctl.report.tables import Cell, Table

    keys = ["run", "task", "method", "epochs", "batch_size", "optimizer", "momentum", "weight_decay", "scheduler",
            "eval_every", "eps", "alpha", "lr", "dual_lr", "seed", "options.hidden", "versions.torch"]
    columns = [f"{s}.{m}" for s in SPLITS for m in SUMMARY_METRICS]
    table = Table("Runs", keys, columns, per_run=True)
    table.rows = [([f"{i:016x}", "two-moons" if i else "fashion-mnist", "fl", *(f"value-{i}-{j}" for j in range(14))],
                   [Cell(0.123 + i, None, 1) for _ in columns]) for i in range(2)]
    lines = render(table, "rich").splitlines()
    header = next(line for line in lines if "run" in line and "task" in line)
    assert not any("…" in line for line in lines[:-2]) and max(map(len, lines)) <= 200
    shown = [h.strip() for h in header.strip("┃").split("┃")]
    assert shown[:3] == ["run", "task", "method"]
    assert {"eps", "alpha", "train.avg_loss", "train.max_loss", "train.accuracy", "test.accuracy"} <= set(shown)
    left = len(keys) + len(columns) - len(shown)
    assert left > 0 and any(f"{left} more column(s) do not fit here" in line for line in lines)
    assert render(table, "markdown").splitlines()[2].count("|") == len(keys) + len(columns) + 1   # all of them


# ---- the registry of tables (flctl.report.table_specs) ----

@pytest.mark.notorch
def test_no_module_but_the_registry_tests_a_table_name() -> None:
    """A table's layout is its TableSpec: a comparison with a table's name elsewhere (`name == "llm"`, `table in
    ("main", ...)`, a `match` on it) or a lookup keyed by table names (`{"ablation": ..., "llm": ...}`) would be
    a second place deciding it, which a table added to the registry would not reach."""
    import ast

    from flctl.report.table_specs import TABLE_SPECS

    root = Path(__file__).resolve().parents[1] / "flctl"
    registry = root / "report" / "table_specs.py"

    def names(node: ast.AST) -> set[str]:
        items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return {x.value for x in items if isinstance(x, ast.Constant) and x.value in TABLE_SPECS}

    found = []
    for path in sorted(root.rglob("*.py")):
        if path == registry:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):     # name == "llm", "llm" != name, name in ("main", "llm")
                sides = [node.left, *node.comparators]
                hit = set().union(*((names(b) if isinstance(b, (ast.Tuple, ast.List, ast.Set)) else set())
                                    if isinstance(op, (ast.In, ast.NotIn)) else names(a) | names(b)
                                    for a, op, b in zip(sides, node.ops, sides[1:])))
            elif isinstance(node, ast.match_case):
                hit = {x.value.value for x in ast.walk(node.pattern) if isinstance(x, ast.MatchValue)
                       and isinstance(x.value, ast.Constant) and x.value.value in TABLE_SPECS}
            elif isinstance(node, ast.Dict):
                hit = set().union(*(names(k) for k in node.keys if k is not None))
                hit = hit if len(hit) > 1 else set()
            else:
                continue
            if hit:
                line = (node.pattern if isinstance(node, ast.match_case) else node).lineno
                found.append(f"{path.relative_to(root.parent)}:{line} {sorted(hit)}")
    assert not found, f"table names tested outside flctl/report/table_specs.py: {found}"


@pytest.fixture
def toy_table():
    """A table registered by the test, in another layout than any of flctl's own (ε first, no α, one metric), and
    removed after it."""
    from flctl.report.table_specs import TABLE_SPECS, TableSpec, register

    spec = register(TableSpec("toy", "Toy table", keys=("eps", "method"), metrics=("max_loss",)))
    try:
        yield spec
    finally:
        del TABLE_SPECS[spec.name]


@pytest.mark.notorch
def test_a_registered_table_builds_and_renders_in_every_format(toy_table) -> None:
    from flctl.report import FORMATS
    from flctl.report.table_specs import TableSpec, register

    table = build("toy", RUNS)
    assert (table.title, table.keys, table.columns) == ("Toy table", ["ε", "Method"], ["train.max_loss", "test.max_loss"])
    assert [row for row, _ in table.rows] == [["—", "ERM"], ["0.50", "FL"], ["0.50", "RFL"]]
    for fmt in FORMATS:
        assert "Toy table" in render(table, fmt) or fmt == "csv"
    with pytest.raises(ValueError, match="already registered differently"):
        register(TableSpec("toy", "Another title"))
    with pytest.raises(ValueError, match="keys must be distinct ones of model, method, eps, alpha"):
        TableSpec("bad", "Bad", keys=("lr",))  # type: ignore[arg-type]


def test_a_registered_table_is_a_choice_of_report_and_renders(finished: Path, toy_table) -> None:
    import typing

    from flctl.cli.report import report

    complete = typing.get_type_hints(report, include_extras=True)["table"].__metadata__[0].autocompletion
    assert complete("to") == ["toy"] and "toy" in complete("")
    res = runner.invoke(app, ["report", "--table", "toy", "--sweep", "small", "--format", "markdown"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0] == "**Toy table (sweep small)**"      # titled with what it is of
    assert lines[2] == "| ε | Method | train.max_loss | test.max_loss |"
    assert [line.split(" | ")[1] for line in lines[4:7]] == ["ERM", "FL", "RFL"]
    res = runner.invoke(app, ["report", "--table", "nope", "--sweep", "small"])
    assert res.exit_code == 2 and "choose one of: main, ablation, llm, runs, groups, toy" in res.stderr


@pytest.mark.notorch
def test_only_versions_that_move_numbers_are_noted_beside_a_row() -> None:
    """`pip install -e '.[dev]'` can move pyarrow (MLflow pins it below 26): seeds recorded before and after write
    the same numbers, and their row is not flagged; seeds trained under two numpy versions are."""
    import dataclasses

    from flctl.report.tables import mixed_code_notes

    def under(r: RunRecord, **libraries: str) -> RunRecord:
        return dataclasses.replace(r, provenance={"libraries": {"torch": "2.14.1", "numpy": "2.3.0", **libraries}})

    erm = [r for r in RUNS if r.method == "erm"]
    assert mixed_code_notes([under(erm[0], pyarrow="25.0.1"), under(erm[1], pyarrow="26.0.0")]) == []
    [note] = mixed_code_notes([under(erm[0], numpy="2.2.6"), under(erm[1])])
    assert "trained under 2 versions of numpy (2.2.6, 2.3.0)" in note, note
