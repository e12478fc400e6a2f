"""Issue 45, part 6: the small things a new user sees in costs, the paper bundle and start-up.

Costs read as a person reads them (one function prints every cost); the bundle's provenance is a list on the page,
its LaTeX tables hold ours and the paper's values under the table's own title in the page's row order, its wide
tables scroll in their own box (tests/test_paper.py opens one in a real browser), and its numbers come flat in
paper.csv; a torch/torchvision pair that does not belong together is one `error:` line at start-up. The bundles are
written from fake finished runs in a tiny results folder (no training), as test_paper's stand-in test does.
"""

from __future__ import annotations

import csv
import html
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flctl.cli import app
from flctl.db import RunQueue, Store
from flctl.paper.programme import ITEMS, published, scaled
from flctl.sweep import load_spec, plan
from flctl.versions import NEWEST_PAIR

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "sweeps"
WIDE = ("table:5", "table:6", "table:7")


def _finish(store: Store, configs, metrics, duration_s: float = 1.0) -> None:
    store.add_runs(configs)
    queue = RunQueue(store)
    for i, c in enumerate(configs):
        token = queue.claim_run(c.run_id, device=c.device)
        assert token is not None
        queue.finish_run(c.run_id, token, status="completed", epochs_done=c.epochs, duration_s=duration_s,
                         diverged_at=None, lambda_capped=0, artifacts={}, metrics=metrics(c, i))


def wide_bundle(root: Path, refs: tuple[str, ...] = WIDE, seeds: tuple[int, ...] = (0, 1),
                provenance: dict | None = None) -> Path:
    """A paper-scale bundle of ``refs`` from fake finished runs of Tables 5-7's cells of ``seeds`` (their other
    seeds not run, nor CSERM at ε = 0: a row not run with a cost to show), in the results folder ``root``; returns
    its index.html. Tables 5-7 are the paper's widest: six columns, each ours and the paper's, with a spread."""
    from flctl.paper.bundle import write_bundle
    from flctl.paper.plan import plan_programme

    root.mkdir(parents=True, exist_ok=True)
    items = [i for i in ITEMS if i.ref in refs]
    first = plan_programme(SPECS, items, scale="paper", device=None, data_dir=None, runs=[], check_data=False)
    cells = {c.run_id: c for p in first.items if p.item.ref in WIDE for c in p.cells.values()
             if c.seed in seeds and not (c.method == "cserm" and c.eps == 0.0)}
    store = Store.open(f"sqlite:///{root / 'flctl.db'}")

    def metrics(c, i: int) -> dict[str, float]:
        return {f"{s}.{m}": 0.1 + 0.001 * i + (0.9 if m == "accuracy" else 12.0 if m == "max_loss" else 0.2)
                for s in ("train", "test") for m in ("avg_loss", "max_loss", "accuracy")}

    _finish(store, list(cells.values()), metrics)
    programme = plan_programme(SPECS, items, scale="paper", device=None, data_dir=None, runs=store.list_runs(),
                               check_data=False)
    store.close()
    return write_bundle(programme, root / "records", root / "paper", provenance or {})


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    provenance = {"flctl": "0.1.0", "commit": "abc123", "torch": "2.14.1", "command": "flctl paper --report-only",
                  "made": "2026-11-26T08:00:00+00:00", "database": "sqlite:///results/flctl.db"}
    return wide_bundle(tmp_path_factory.mktemp("bundle") / "results", (*WIDE, "table:11"),
                       provenance=provenance).parent


# ---------------------------------------------------------------- costs

@pytest.mark.notorch
def test_costs_read_as_a_person_reads_them() -> None:
    from flctl.cost import format_cost

    assert format_cost(6.22e-05, "cpu") == "0.2 s"          # was "6.22e-05 cpu-hours"
    assert format_cost(0.004 / 3600, "cpu") == "0.004 s"
    assert format_cost(12.4 / 3600, "cpu") == "12 s"
    assert format_cost(3.7 / 60, "cpu") == "3.7 min"
    assert format_cost(42 / 60, "cuda") == "42 min"
    assert format_cost(1.4, "cpu") == "1.4 cpu-hours"
    assert format_cost(1250.2, "cuda") == "1,250 cuda-hours"
    assert format_cost(59.9 / 3600, "cpu") == "1.0 min" and format_cost(59.9 / 60, "cpu") == "1.0 cpu-hours"
    assert format_cost(0.0, "cpu") == "0 s" and format_cost(None, "cpu") == "unknown"


def test_every_printed_cost_is_written_by_that_function(tmp_path: Path) -> None:
    """`flctl sweep --dry-run`, `flctl paper --dry-run` and the bundle's rows not run all print a cost of a fraction
    of a second as seconds, never as 6.22e-05 cpu-hours."""
    root = tmp_path / "results"
    root.mkdir()
    spec = scaled(load_spec(SPECS / "two-moons.toml"), "smoke")
    done = plan(spec, check_data=False)[:1]
    store = Store.open(f"sqlite:///{root / 'flctl.db'}")
    _finish(store, done, lambda c, i: {"train.avg_loss": 0.1}, duration_s=0.1)
    store.close()
    # one finished two-epoch run of 0.1 s: 0.05 s per epoch
    res = runner.invoke(app, ["sweep", "two-moons", "-m", "fl", "--epochs", "4", "--lr", "1e-3,1e-2", "--dry-run",
                              "--results-dir", str(root)], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    out = res.output.replace("\n", " ")
    assert re.search(r"cost: about \d+(\.\d+)? s \(expected within \d+(\.\d+)? s to \d+(\.\d+)? s\): ", out), out
    assert "(8 epochs x 0.05 s) / 2 cells at once (median of 1 finished two-moons runs" in out, out
    res = runner.invoke(app, ["paper", "--dry-run", "--scale", "smoke", "--only", "figure:3", "--results-dir",
                              str(root)], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    out = res.output
    assert "cost on cpu" in out and re.search(r"cell\(s\) to do, about \d+(\.\d+)? s\b", out), out
    assert "-hours" not in out and not re.search(r"\de-\d", out), out


@pytest.mark.notorch
def test_a_row_not_run_says_its_cost_as_a_person_reads_it(bundle: Path) -> None:
    page = (bundle / "index.html").read_text()
    costs = re.findall(r"not run: \d+ cell\(s\) to do, ([^<]*)<", page)
    # CSERM at ε = 0 (Table 5), from the cifar10 runs' seconds; Table 11's rows have no orca-dpo run to go by
    assert any(re.fullmatch(r"≈ \d+(\.\d+)? (s|min)", c) for c in costs), costs
    assert all(re.fullmatch(r"≈ \d+(\.\d+)? (s|min)|≈ [\d.,]+ cpu-hours|no finished run on \w+ to estimate the cost "
                            r"from", c) for c in costs), costs


# ---------------------------------------------------------------- the bundle

def _section(page: str, anchor: str) -> str:
    start = page.index(f"<h2 id={anchor}>") if f"<h2 id={anchor}>" in page else page.index(f"<h2 id='{anchor}'>")
    end = page.find("<h2", start + 4)
    return page[start:] if end < 0 else page[start:end]


@pytest.mark.notorch
def test_the_provenance_is_a_list_a_person_reads(bundle: Path) -> None:
    part = _section((bundle / "index.html").read_text(), "provenance")
    assert "<dl class=meta>" in part and "<table" not in part
    for label, value in (("flctl version", "0.1.0"), ("flctl commit", "abc123"), ("command", "flctl paper --report-only"),
                         ("scale", "paper")):
        assert f"<dt>{label}</dt><dd>{html.escape(value)}</dd>" in part, part
    # the counts by device and by how the runs trained: one item each, not a JSON object
    assert "<dt>finished runs by device</dt><dd><ul><li>" in part, part
    assert "&quot;" not in part and "{" not in part, part
    # paper.json keeps it for machines
    assert json.loads((bundle / "paper.json").read_text())["provenance"]["devices"]


@pytest.mark.notorch
def test_each_latex_table_is_the_page_ours_beside_the_papers_under_its_own_title(bundle: Path) -> None:
    items = {i["ref"]: i for i in json.loads((bundle / "paper.json").read_text())["items"]}
    tables = published()
    for ref in (*WIDE, "table:11"):
        item = next(i for i in ITEMS if i.ref == ref)
        tex = (bundle / "tables" / f"{item.name}.tex").read_text()
        caption = re.search(r"\\caption\{(.*)\}", tex)
        assert caption is not None and caption.group(1).startswith(f"Table {item.number}: "), tex
        assert item.caption.split(" (")[0].rstrip(".") in caption.group(1), tex     # the paper's own caption
        assert tex.count(r"\toprule") == 1 and tex.count("ours & paper") == len(item.columns)
        # the rows in the page's order: its first column, line by line
        body = tex[tex.index(r"\midrule"):tex.index(r"\bottomrule")].splitlines()[1:]
        labels = [line.split(" & ")[0] for line in body]
        page_labels = [r["label"].replace("ε", r"$\epsilon$").replace("α", r"$\alpha$").replace("∞", r"$\infty$")
                       for r in items[ref]["rows"]]
        assert labels == page_labels, (labels, page_labels)
        # each published row: the paper's value as printed, with its spread where it gives one
        for line, p in zip(body, tables[item.number]):
            for c in item.columns:
                value, std, printed = p.values[c]
                assert printed in line, (line, printed)
                if std is not None:
                    assert rf"$\pm$ {std:.{len(printed.split('.')[-1])}f}" in line, line
    # ours beside them where a run finished (Tables 5-7), "--" where none did (Table 11)
    t5 = (bundle / "tables" / "table-5.tex").read_text()
    erm = next(r for r in items["table:5"]["rows"] if r["label"] == "ERM")
    ours = f"{erm['ours']['test.max_loss']['mean']:.3f}"
    assert re.search(rf"^ERM & 2/5 & .*{re.escape(ours)} {{\\color{{gray}}\\scriptsize \$\\pm\$ ", t5, re.M), t5
    t11 = (bundle / "tables" / "table-11.tex").read_text()
    assert all(" & not run & -- & " in line for line in t11.splitlines() if line.startswith(("ERM", "RFL", "Llama",
                                                                                            "stablelm")))


@pytest.mark.notorch
def test_a_wide_table_scrolls_in_its_own_box(bundle: Path) -> None:
    page = (bundle / "index.html").read_text()
    css = page[page.index("<style>"):page.index("</style>")]
    assert re.search(r"\.wide\{[^}]*overflow-x:auto", css)
    part = _section(page, "table-5")
    assert part.count("<div class=wide><table>") == 1 and part.count("</table></div>") == 1


@pytest.mark.notorch
def test_paper_csv_is_flat_and_read_in_one_call(bundle: Path) -> None:
    path = bundle / "paper.csv"
    items = [i for i in json.loads((bundle / "paper.json").read_text())["items"] if i["kind"] == "table"]
    try:
        import pandas as pd
    except ImportError:        # the notorch venvs: the csv module reads the same lines
        pd = None
    if pd is not None:
        frame = pd.read_csv(path)
        rows = frame.to_dict("records")
        assert frame["value"].dtype.kind == "f" and frame["outside"].dtype.kind == "b"
    else:
        rows = list(csv.DictReader(io.StringIO(path.read_text())))
    assert len(rows) == sum(len(i["rows"]) * len(i["columns"]) * 2 for i in items)

    def num(v) -> float | None:
        return None if v in ("", None) or v != v else float(v)

    by = {(r["table"], int(r["position"]), r["column"], r["source"]): r for r in rows}
    for it in items:
        for position, row in enumerate(it["rows"], 1):
            for c in it["columns"]:
                ours, paper = by[(it["ref"], position, c, "ours")], by[(it["ref"], position, c, "paper")]
                assert ours["row"] == paper["row"] == row["label"] and ours["status"] == row["status"]
                assert num(ours["value"]) == pytest.approx(((row["ours"] or {}).get(c) or {}).get("mean"), rel=1e-12)
                assert num(paper["value"]) == ((row["paper"] or {}).get(c) or {}).get("value")
                assert num(paper["std"]) == ((row["paper"] or {}).get(c) or {}).get("std")
                assert int(paper["paper_table"]) == it["paper_table"]
    erm5 = by[("table:5", 1, "test.max_loss", "paper")]
    assert (erm5["method"], num(erm5["value"]), num(erm5["std"])) == ("erm", 12.83, 0.443)


# ---------------------------------------------------------------- start-up: torch and torchvision

def _installed(monkeypatch: pytest.MonkeyPatch, **versions: str | None) -> None:
    import flctl.versions

    names = {"torch": versions.get("torch"), "torchvision": versions.get("torchvision")}
    monkeypatch.setattr(flctl.versions, "_built", lambda name: names[name] if name in names else "1.0")
    # the metadata as PyTorch's index writes it, label included (a PyPI wheel's has none: "2.14.1")
    monkeypatch.setattr(flctl.versions, "_version", lambda name: names[name] if name in names else "1.0")


@pytest.mark.notorch
@pytest.mark.parametrize(("torch", "vision", "fix"), [
    ("2.14.1", "0.28.0", "pip install 'torchvision===0.29.1'"),
    ("2.13.0+cpu", "0.29.1+cpu", "pip install 'torchvision===0.28.0+cpu' --index-url https://download.pytorch.org/whl/cpu"),
    ("2.4.0+cu121", "0.20.0",
     "pip install 'torchvision===0.19.0+cu121' --index-url https://download.pytorch.org/whl/cu121"),
    # the same numbers, another build: a CUDA torchvision from PyPI beside a CPU torch (a new user's install)
    ("2.13.0+cpu", "0.28.0+cu128",
     "pip install 'torchvision===0.28.0+cpu' --index-url https://download.pytorch.org/whl/cpu"),
    ("2.14.1+cu126", "0.29.1+cu130",
     "pip install 'torchvision===0.29.1+cu126' --index-url https://download.pytorch.org/whl/cu126"),
])
def test_a_torchvision_built_for_another_torch_is_named_with_its_fix(monkeypatch: pytest.MonkeyPatch, torch: str,
                                                                      vision: str, fix: str) -> None:
    from flctl.versions import torch_pair_problem

    _installed(monkeypatch, torch=torch, torchvision=vision)
    problem = torch_pair_problem()
    assert problem is not None and f"torchvision {vision}" in problem and f"torch {torch}" in problem
    assert problem.split("; where")[0].endswith(fix), problem
    # a CPU build's fix names PyTorch's CPU index, and the default index's newest pair for where that is out of reach
    # (spelt exactly: `==2.13.*` would take the +cpu wheel again)
    fallback = f"pip install 'torch==={NEWEST_PAIR[0]}' 'torchvision==={NEWEST_PAIR[1]}'"
    assert problem.endswith(fallback) == ("+cpu" in torch), problem


@pytest.mark.notorch
@pytest.mark.parametrize(("torch", "vision"), [("2.14.1", "0.29.1"), ("2.14.1+cpu", "0.29.0+cpu"),
                                               ("2.4.0", "0.19.1"), (None, "0.29.1"), ("2.14.1", None),
                                               (None, None), ("3.0.0", "0.29.1"), ("2.14.0a0+git1234", "0.29.0a0")])
def test_a_pair_that_belongs_together_or_is_not_installed_passes(monkeypatch: pytest.MonkeyPatch, torch, vision) -> None:
    from flctl.versions import torch_pair_problem

    _installed(monkeypatch, torch=torch, torchvision=vision)
    assert torch_pair_problem() is None


def _site(folder: Path, wheels: dict[str, tuple[str, str]]) -> Path:
    """A site-packages folder holding each distribution as pip installs it: its dist-info (METADATA's version, as a
    PyPI wheel's reads, without the build label) and its package's version.py (``__version__`` with the label)."""
    for name, (metadata, built) in wheels.items():
        info = folder / f"{name}-{metadata}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {metadata}\n")
        (info / "RECORD").write_text("")
        (folder / name).mkdir()
        (folder / name / "version.py").write_text(f"__version__ = '{built}'\ngit_version = 'abc'\n")
    return folder


@pytest.mark.notorch
def test_a_cpu_torch_beside_a_pypi_cuda_torchvision_of_the_same_numbers_is_caught(tmp_path: Path) -> None:
    """A new user's pair: torch 2.13.0+cpu from PyTorch's index, torchvision 0.28.0 from PyPI (a CUDA build whose
    metadata has no label). The versions belong together; the builds do not. Run in a fresh interpreter whose
    sys.path starts with a site folder in pip's layout, so the real metadata readers find these two."""
    site = _site(tmp_path / "site", {"torch": ("2.13.0+cpu", "2.13.0+cpu"), "torchvision": ("0.28.0", "0.28.0+cu128")})
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from flctl.versions import torch_pair_problem; "
            "print(torch_pair_problem())")
    out = subprocess.run([sys.executable, "-c", code, str(site)], capture_output=True, text=True, cwd=ROOT,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        "torchvision 0.28.0+cu128 is built for a CUDA 12.8 torch, not for the installed torch 2.13.0+cpu; install the "
        "torchvision built for it: pip install 'torchvision===0.28.0+cpu' "
        "--index-url https://download.pytorch.org/whl/cpu; where that index is out of reach (pip finds no such "
        "torchvision), the default index's pair (CUDA builds, about 6 GB, which run on a CPU too): "
        f"pip install 'torch==={NEWEST_PAIR[0]}' 'torchvision==={NEWEST_PAIR[1]}'"), out.stdout
    # the suite's start-up stops on the same line, before collecting anything
    suite = subprocess.run([sys.executable, "-m", "pytest", "-o", "addopts=", "-p", "no:cacheprovider", "-q",
                            "tests/test_config.py"], capture_output=True, text=True, cwd=ROOT, timeout=120,
                           env={**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])})
    assert suite.returncode == 2, suite.stdout + suite.stderr
    assert "error: torchvision 0.28.0+cu128 is built for a CUDA 12.8 torch" in suite.stdout + suite.stderr
    assert "passed" not in suite.stdout


@pytest.mark.notorch
def test_start_up_says_one_line_and_exits_2_before_any_command(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from flctl.cli import main

    _installed(monkeypatch, torch="2.14.1", torchvision="0.28.0")
    monkeypatch.setattr(sys, "argv", ["flctl", "tasks"])
    with pytest.raises(SystemExit) as stopped:
        main()
    assert stopped.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: torchvision 0.28.0 is built for torch 2.13, not for the installed torch 2.14.1; ")
    assert err.rstrip().endswith("pip install 'torchvision===0.29.1'") and "Traceback" not in err


@pytest.mark.notorch
def test_a_command_that_never_imports_torch_stays_torch_free(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The check reads metadata: `flctl tasks` with the installed pair runs as before and imports no torch (the
    notorch marker fails this test if anything imported it)."""
    from flctl.cli import main

    monkeypatch.setattr(sys, "argv", ["flctl", "tasks"])
    with pytest.raises(SystemExit) as stopped:
        main()
    assert stopped.value.code == 0
    assert "two-moons" in capsys.readouterr().out
