"""`flctl paper`: the plan, the launch of what is missing, and the bundle with the paper's numbers beside ours.

One database is built once for the module, as a user would build it: the smoke-scale two-moons and polyfit cells
trained by `flctl paper` itself, two CIFAR-10 cells on format-true batches (the rest of Table 1 not run), one cell
recorded as diverged, and the paper-scale polyfit runs (another scale in the same database).
"""

from __future__ import annotations

import csv
import html
import io
import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flctl.cli import app
from flctl.db import RunQueue, Store
from flctl.paper.programme import ITEMS, PUBLISHED, published, scaled
from flctl.sweep import load_spec, plan
from tests.data_writers import write_cifar10
from tests.helpers import files_under

# Slow (pyproject.toml's markers; `pytest -m "not slow"` is the fast loop): `flctl paper` planning, launching and
# bundling the smoke programme: 28 s of the suite's 904 s of test time (2 cores, xdist -n 2).
pytestmark = pytest.mark.slow

runner = CliRunner()
SPECS = Path(__file__).resolve().parents[1] / "sweeps"
ONLY = "table:1,table:11,figure:1,figure:3"


def flctl(*args: str) -> str:
    res = runner.invoke(app, list(args), env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    return res.output


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict:
    base = tmp_path_factory.mktemp("paper")
    root, data = base / "results", write_cifar10(base / "data")
    env = ["--results-dir", str(root)]
    first = flctl("paper", "--scale", "smoke", "--only", ONLY, "--executor", "debug", *env)
    # Two CIFAR-10 cells of Table 1 at the smoke scale, trained as a user would; one more recorded as diverged.
    cells = {c.method + str(c.eps): c for c in plan(scaled(load_spec(SPECS / "cifar10-main.toml"), "smoke"),
                                                        check_data=False)}
    for c in (cells["ermNone"], cells["fl0.5108256237659907"]):
        flctl("run", "cifar10", "-m", c.method, *(["--eps", repr(c.eps)] if c.eps is not None else []), "--epochs", "2",
              "--subset", "256", "-o", "width=8", "--data-dir", str(data), *env)
    diverged = cells["cserm0.5108256237659907"]
    store = Store.open(f"sqlite:///{root / 'flctl.db'}")
    store.add_runs([diverged])
    token = RunQueue(store).claim_run(diverged.run_id)
    assert token is not None
    RunQueue(store).finish_run(diverged.run_id, token, status="diverged", epochs_done=1, duration_s=1.0,
                     diverged_at={"epoch": 1, "step": 1}, lambda_capped=0, artifacts={},
                     metrics={"train.avg_loss": float("inf")})
    store.close()
    flctl("paper", "--only", "figure:1", "--executor", "debug", *env)      # the paper scale's polyfit runs
    # The bundle of what is finished (Table 1 partial), planning and launching nothing.
    second = flctl("paper", "--scale", "smoke", "--only", ONLY, "--report-only", *env)
    bundle = root / "paper-smoke"
    return {"root": root, "data": data, "first": first, "second": second, "bundle": bundle, "diverged": diverged,
            "json": json.loads((bundle / "paper.json").read_text())}


def item(world: dict, ref: str) -> dict:
    return next(i for i in world["json"]["items"] if i["ref"] == ref)


def test_the_plan_names_every_table_and_figure_and_a_dry_run_writes_nothing(world: dict) -> None:
    before = {p: p.read_bytes() for p in files_under(world["root"])}
    out = flctl("paper", "--dry-run", "--results-dir", str(world["root"]))
    for i in ITEMS:
        assert f"│ {i.ref} " in out
    assert {p: p.read_bytes() for p in files_under(world["root"])} == before
    assert "nothing was written" in out
    # the finished polyfit runs are counted as done; the others have no history to estimate from
    assert re.search(r"│ figure:1 +│ polyfit", out) and "│ 6     │ 6    │ 0" in out
    fresh = flctl("paper", "--dry-run", "--scale", "smoke", "--results-dir", str(world["root"] / "none"))
    # no run of its own: priced from the committed CPU benchmark where it has the task, the rest named unknown
    assert "cell(s) unknown: no run or benchmark on cpu of" in fresh and "about 0 s" not in fresh


def test_re_running_launches_nothing(world: dict, tmp_path: Path) -> None:
    assert "sweep" in world["first"] and "nothing to launch" not in world["first"]
    assert "sweep " not in world["second"]          # --report-only: no plan, no launch
    store = Store.open(f"sqlite:///{world['root'] / 'flctl.db'}", readonly=True)
    n = store.count_runs()
    store.close()
    out = flctl("paper", "--scale", "smoke", "--only", "figure:1,figure:3", "--executor", "debug", "--results-dir",
                str(world["root"]), "--out", str(tmp_path / "bundle"))
    assert "nothing to launch" in out
    store = Store.open(f"sqlite:///{world['root'] / 'flctl.db'}", readonly=True)
    assert store.count_runs() == n
    store.close()
    # --only chose what trains, not what the bundle shows: every item is on the page, and figure 5 is drawn from
    # Table 1's CIFAR-10 runs, finished outside this selection
    page = (tmp_path / "bundle" / "index.html").read_text()
    assert all(html.escape(i.title) in page for i in ITEMS)
    assert {p.name for p in (tmp_path / "bundle" / "figures").glob("figure-5-*.png")} == {
        f"figure-5-{kind}-{split}.png" for kind in ("cdf", "cvar") for split in ("train", "test")}


def test_the_smoke_scale_trains_each_sweep_in_one_worker(tmp_path: Path) -> None:
    # local executor, no --workers: this process alone, no worker interpreter started for the tiny cells
    out = flctl("paper", "--scale", "smoke", "--only", "figure:1", "--executor", "local", "--results-dir",
                str(tmp_path / "results"))
    assert "1 worker, in this process" in out and "through local" not in out, out


def test_every_item_is_in_the_bundle_drawn_or_marked_not_run(world: dict) -> None:
    bundle = world["bundle"]
    page = (bundle / "index.html").read_text()
    for ref in ONLY.split(","):        # --report-only --only: the bundle of these alone
        assert html.escape(next(i.title for i in ITEMS if i.ref == ref)) in page
    assert {p.name for p in (bundle / "figures").iterdir()} == {
        "figure-1-polyfit.png", "figure-1-polyfit.pdf", "figure-3-multipliers.png", "figure-3-multipliers.pdf"}
    assert (bundle / "tables" / "table-1.tex").read_text().count(r"\toprule") == 1
    t1 = item(world, "table:1")
    status = {r["label"]: r["status"] for r in t1["rows"]}
    assert status == {"ERM": "done", "FL ε=0.51 α=∞": "done", "RFL ε=0.51 α=1": "not run", "CSERM ε=0.51": "diverged",
                      "FL ε=0 α=∞": "not run", "RFL ε=0 α=1": "not run", "CSERM ε=0": "not run"}
    assert "not run: 1 cell(s) to do" in page
    assert "1 diverged" in " ".join(t1["notes"])
    assert item(world, "table:11")["rows"][0]["status"] == "not run"
    assert "no data here: could not load argilla" in world["first"]     # the plan before launching says why
    assert "http" not in page.replace("https://huggingface.co", "")     # no link to load anything from
    # the other scale's runs are counted on the page, never averaged in
    assert "6 finished run(s) of this figure at another scale" in page
    assert item(world, "figure:1")["runs"] and len(item(world, "figure:1")["runs"]) == 6


def test_bundle_numbers_are_flctl_reports_and_the_papers_are_the_transcribed_file(world: dict) -> None:
    report = flctl("report", "--table", "main", "--task", "cifar10", "--format", "csv", "--columns",
                   "train.avg_loss,train.accuracy,test.avg_loss,test.accuracy", "--results-dir", str(world["root"]))
    rows = {(r["Method"], r["ε"]): r for r in csv.DictReader(io.StringIO(report[report.index("Method"):]))}
    ours = {r["keys"]["method"]: r for r in item(world, "table:1")["rows"] if r["ours"]}
    for (method, _), r in rows.items():
        if r["train.avg_loss"]:
            assert ours[method.lower()]["ours"]["train.avg_loss"]["mean"] == float(r["train.avg_loss"])
            assert ours[method.lower()]["ours"]["test.accuracy"]["mean"] == float(r["test.accuracy"])
    tables = published()
    for ref in ("table:1", "table:11"):
        rows_json = [r for r in item(world, ref)["rows"] if r["paper"] is not None]
        assert len(rows_json) == len(tables[int(ref.split(":")[1])])
        for r, p in zip(rows_json, tables[int(ref.split(":")[1])]):
            assert r["paper"] == {c: {"value": v[0], "std": v[1]} for c, v in p.values.items()}


@pytest.mark.notorch
def test_published_file_holds_every_number_of_the_papers_tables() -> None:
    tables = published()
    shape = {1: (7, 4), 2: (7, 4), 5: (7, 6), 6: (6, 6), 7: (6, 6), 8: (7, 4), 9: (7, 4), 10: (7, 4), 11: (4, 4)}
    assert {t: (len(rows), len(rows[0].values)) for t, rows in tables.items()} == shape
    assert all(len(r.values) == shape[t][1] for t, rows in tables.items() for r in rows)
    assert sum(1 for _ in PUBLISHED.open()) - 1 == sum(r * c for r, c in shape.values())
    erm = tables[5][0]
    assert (erm.method, erm.eps, erm.values["test.max_loss"]) == ("erm", None, (12.83, 0.443, "12.830"))
    best = next(r for r in tables[2] if r.alpha == 1e-3)
    assert best.values["train.avg_loss"][0] == 0.01 and best.values["test.max_loss"][0] == 11.42
    zephyr = tables[11][3]
    assert (zephyr.model, zephyr.method, zephyr.values["train.max_loss"][0]) == (
        "stabilityai/stablelm-zephyr-3b", "rfl", 1.368)


@pytest.mark.notorch
def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    for args, message in ((["--only", "table:3"], "not a table or figure"), (["--scale", "huge"], "unknown scale"),
                          (["--dry-run", "--report-only"], "not both"),
                          (["--specs", str(tmp_path / "none")], "specs are missing")):
        res = runner.invoke(app, ["paper", *args, "--results-dir", str(tmp_path / "r")])
        assert res.exit_code == 2 and message in res.output and "Traceback" not in res.output
    assert not (tmp_path / "r").exists()


def test_the_bundle_never_replaces_what_is_not_a_bundle(world: dict, tmp_path: Path) -> None:
    """--out must be new, empty or an earlier bundle: the bundle replaces its folder whole, so the results folder, a
    folder holding it, a folder of other files, a file and a path under a file are each refused with one line, before
    anything is written, and every file stays as it was."""
    root = world["root"]
    (tmp_path / "thesis").mkdir()
    (tmp_path / "thesis" / "thesis.tex").write_text("chapter 1")
    (tmp_path / "note.txt").write_text("note")
    def snapshot() -> dict:
        return {p: p.read_bytes() for p in files_under(tmp_path) + files_under(root)}

    before = snapshot()
    for out, message in ((root, "is the results folder"), (root.parent, "a folder holding the results folder"),
                         (tmp_path / "thesis", "not a paper bundle"), (tmp_path / "note.txt", "is a file"),
                         (tmp_path / "note.txt" / "b", "which is a file")):
        res = runner.invoke(app, ["paper", "--scale", "smoke", "--only", "figure:1", "--report-only", "--out", str(out),
                                  "--results-dir", str(root)], env={"COLUMNS": "250"})
        assert res.exit_code == 2 and message in res.output and "Traceback" not in res.output, res.output
        assert snapshot() == before
    earlier = shutil.copytree(world["bundle"], tmp_path / "bundle")
    (earlier / "notes.md").write_text("what I saw")          # someone's file, put in a bundle's folder
    again = flctl("paper", "--scale", "smoke", "--only", "figure:1", "--report-only", "--out", str(earlier),
                  "--results-dir", str(root))               # an earlier bundle is replaced, as the default's is
    assert "wrote" in again and json.loads((earlier / "paper.json").read_text())["items"][0]["ref"] == "figure:1"
    assert (earlier / "notes.md").read_text() == "what I saw"                # what no bundle writes is kept
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".bundle.")]   # and no scratch folder is left


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run installs it)")
def test_the_page_opens_from_disk_in_a_real_browser(world: dict, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    from tests.test_bundle_small_things import wide_bundle

    index = world["bundle"] / "index.html"
    # Tables 5-7 (six columns, each ours beside the paper's, with spreads): about 1,800 px wide
    wide = wide_bundle(tmp_path / "wide")
    sideways = ("({page: document.documentElement.scrollWidth, view: window.innerWidth, "
                "boxes: [...document.querySelectorAll('.wide')].map(b => [b.scrollWidth, b.clientWidth])})")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1300, "height": 1800})
        errors: list[str] = []
        requests: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("request", lambda r: requests.append(r.url))
        page.goto(index.as_uri())
        widths = page.evaluate("[...document.images].map(i => i.complete ? i.naturalWidth : 0)")
        page.screenshot(path=str(tmp_path / "bundle.png"), full_page=True)
        narrow = page.evaluate(sideways)
        # at a laptop's width, a wide table scrolls inside its own box and the page never scrolls sideways
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(wide.as_uri())
        scrolled = page.evaluate(sideways)
        browser.close()
    assert len(widths) == 2 and all(w > 0 for w in widths)
    assert errors == []
    assert requests == [index.as_uri()]
    assert (tmp_path / "bundle.png").stat().st_size > 10_000
    assert narrow["page"] <= narrow["view"], narrow
    assert any(width > box for width, box in scrolled["boxes"]), scrolled       # a table wider than the page
    assert scrolled["page"] <= scrolled["view"], scrolled


@pytest.mark.notorch
def test_a_stand_in_table_sits_beside_the_published_one_unjudged(tmp_path: Path) -> None:
    """At the paper's scale, Table 1 on Fashion-MNIST shows the paper's CIFAR-10 numbers beside ours and marks none
    of its cells, however far ours lie; CIFAR-10's own Table 1 marks the same numbers."""
    from flctl.paper.bundle import write_bundle
    from flctl.paper.plan import plan_programme

    root = tmp_path / "results"
    root.mkdir()
    store = Store.open(f"sqlite:///{root / 'flctl.db'}")
    items = [i for i in ITEMS if i.ref in ("table:1", "table:1-fashion-mnist")]
    first = plan_programme(SPECS, items, scale="paper", device=None, data_dir=None, runs=[], check_data=False)
    erm = [c for p in first.items for c in p.cells.values() if c.method == "erm" and c.seed == 0]
    assert sorted(c.task for c in erm) == ["cifar10", "fashion-mnist"]
    store.add_runs(erm)
    metrics = {"train.avg_loss": 0.9, "train.accuracy": 0.5, "test.avg_loss": 0.9, "test.accuracy": 0.5}
    for c in erm:
        token = RunQueue(store).claim_run(c.run_id)
        assert token is not None
        RunQueue(store).finish_run(c.run_id, token, status="completed", epochs_done=c.epochs, duration_s=1.0,
                                   diverged_at=None, lambda_capped=0, artifacts={}, metrics=metrics)
    programme = plan_programme(SPECS, items, scale="paper", device=None, data_dir=None, runs=store.list_runs(),
                               check_data=False)
    store.close()
    index = write_bundle(programme, root / "records", root / "paper", {})
    by_ref = {i["ref"]: i for i in json.loads((root / "paper" / "paper.json").read_text())["items"]}
    rows = {ref: next(r for r in by_ref[ref]["rows"] if r["label"] == "ERM") for ref in by_ref}
    for row in rows.values():   # both show the paper's CIFAR-10 ERM row beside ours
        assert row["paper"]["test.accuracy"]["value"] == 0.93 and row["ours"]["test.accuracy"]["mean"] == 0.5
    assert rows["table:1"]["outside"] and rows["table:1-fashion-mnist"]["outside"] == []
    page = index.read_text()
    assert "paper, Table 1</th>" in page and "Table 1 on Fashion-MNIST" in page


def test_a_cpu_dry_run_says_which_unknown_cells_a_gpu_benchmark_prices(tmp_path: Path, no_cuda: None) -> None:
    """On a machine without CUDA, the paper's GPU cells (CIFAR-10's) have no CPU figure: unknown, with one line
    saying that `--device cuda` prices them from the committed GPU benchmark; cells priced here, or with no GPU
    figure either (UTKFace's), get no such line."""
    env = ["--results-dir", str(tmp_path / "results")]
    out = flctl("paper", "--dry-run", "--only", "table:1,table:2,figure:1", *env).splitlines()
    hint = [line for line in out if "committed GPU benchmark" in line]
    assert len(hint) == 1 and re.fullmatch(
        r"the 35 cell\(s\) of cifar10 have a committed GPU benchmark \(benchmarks/results/task-costs-[\d-]+-cuda\.json\)"
        r": `flctl paper --dry-run --device cuda` \(with the same --only and --scale\) prices them on a GPU", hint[0])
    assert "70 cell(s) unknown: no run or benchmark on cpu of cifar10, utkface" in "\n".join(out)
    assert "committed GPU benchmark" not in flctl("paper", "--dry-run", "--only", "table:2,figure:1", *env)
    assert "committed GPU benchmark" not in flctl("paper", "--dry-run", "--only", "table:1", "--device", "cuda", *env)
    assert files_under(tmp_path) == []
