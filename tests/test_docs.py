"""The docs say what the code does: each list a doc gives (record columns and their types, later fields, layers,
summary metrics) is read out of the doc and compared with the code that defines it, both ways, so a column,
field, module or metric added on one side only fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pytest

import flctl
from flctl import records
from flctl.metrics import SPLITS, SUMMARY_METRICS

pytestmark = pytest.mark.notorch

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
README = ROOT / "README.md"
REFERENCE = ROOT / "docs" / "reference.md"   # what the README moved out: runs, files, clusters, layout
RESULTS_README = ROOT / "results" / "README.md"


def section(path: Path, heading: str) -> str:
    """The text under a Markdown heading (exactly ``heading``, any level), up to the next heading of that level or
    above; fails when the doc has no such heading, so a renamed section is not read as an empty list."""
    text = path.read_text()
    m = re.search(rf"^(#+) {re.escape(heading)}\s*$", text, flags=re.M)
    assert m, f"{path.name} has no heading {heading!r}"
    level = len(m.group(1))
    end = re.search(rf"^#{{1,{level}}} ", text[m.end():], flags=re.M)
    return text[m.end(): m.end() + end.start() if end else len(text)]


def between(text: str, start: str, end: str = ")") -> str:
    """The text after the first ``start`` up to the next ``end``."""
    assert start in text, f"{start!r} not found"
    rest = text.split(start, 1)[1]
    assert end in rest, f"no {end!r} after {start!r}"
    return rest.split(end, 1)[0]


def ticked(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


def test_design_record_columns_and_types_are_the_schema() -> None:
    rows = re.findall(r"^\| `(\w+)` \| (\w+) \|", section(DESIGN, "Records (`results/records/run_id=<id>/epoch=<e>.parquet`)"),
                      flags=re.M)
    assert [(name, pa.type_for_alias(kind)) for name, kind in rows] == [(f.name, f.type) for f in records.SCHEMA]


def _later_fields() -> list[str]:
    from flctl.config import FIELDS

    return [f.name for f in FIELDS.values() if f.later]


def test_design_later_fields_are_the_code() -> None:
    listed = ticked(between(section(DESIGN, "Identity"), "Fields added after the first release ("))
    assert len(listed) == len(set(listed))
    assert set(listed) == set(_later_fields())


def _modules() -> set[str]:
    """flctl's modules and packages as the layer list names them: flctl/x.py, or flctl/x/ for a package."""
    package = Path(flctl.__file__).parent
    out = {f"flctl/{p.name}" for p in package.glob("*.py") if p.name != "__init__.py"}
    return out | {f"flctl/{p.name}/" for p in package.iterdir() if (p / "__init__.py").is_file()}


def test_design_layers_name_every_module_once() -> None:
    layers = section(DESIGN, "Layers")
    # The package's own modules and subpackages: a layer's text may also name a module inside a subpackage.
    named = [path for path in ticked(layers) if re.fullmatch(r"flctl/[a-z_]+(\.py|/)", path)]
    assert len(named) == len(set(named)), "a module is in two layers"
    assert set(named) == _modules()


def test_readme_report_columns_are_the_summary_metrics() -> None:
    listed = ticked(between(README.read_text(), "Columns are `SPLIT.METRIC` with the recorded summary metrics ("))
    assert listed == list(SUMMARY_METRICS)


def test_readme_database_bullet_lists_the_summary_metrics() -> None:
    bullet = between(section(REFERENCE, "Where things go"), "summary metrics (")
    listed = [m for m in ticked(bullet) if m.split(".")[0] not in ("SPLIT", *SPLITS)]   # not `train.avg_loss`
    assert listed == list(SUMMARY_METRICS)


@pytest.mark.parametrize(("doc", "start"), [(REFERENCE, "per-sample records at each eval epoch: `"),
                                            (RESULTS_README, "(columns: ")],
                         ids=["README", "results-README"])
def test_record_column_lists_are_the_schema(doc: Path, start: str) -> None:
    listed = between(" ".join(doc.read_text().split()), start, "`" if start.endswith("`") else ";")
    assert [c.strip() for c in listed.split(",")] == records.SCHEMA.names


def test_run_states_are_named_through_the_status_module() -> None:
    """A state is spelled once (flctl.status.Status): no module compares or assigns one as a bare string."""
    import ast

    from flctl.status import Status

    # Read through the syntax tree, not the tokenizer: Python 3.12 tokenizes an f-string's inner expressions (PEP
    # 701), so `f"{x['stopped']}"` showed a string token on 3.12 and none on 3.11. The tree holds that constant on
    # every version.
    states = {s.value for s in Status}
    # the cancel outcome's "stopped" lists the processes cancel stopped: a JSON key, not a run's state
    allowed = {("flctl/launch/cancel.py", "stopped"), ("flctl/cli/ledger.py", "stopped")}
    found = []
    for path in sorted((ROOT / "flctl").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "flctl/status.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in states
                    and (rel, node.value) not in allowed):
                found.append(f"{rel}:{node.lineno} {node.value!r}")
    assert not found, found


def test_modules_stay_small_and_each_job_has_one_home() -> None:
    """docs/design.md's layers, held: no module over 350 lines, no class over 250; the claim token, SQLite's locking
    and the Slurm commands each in their own module; db/ and launch/ modules import few flctl modules outside their
    package."""
    import ast

    sources = {p.relative_to(ROOT).as_posix(): p.read_text() for p in sorted((ROOT / "flctl").rglob("*.py"))}
    long = [f"{path}: {text.count(chr(10))} lines" for path, text in sources.items() if text.count("\n") > 350]
    big = [f"{path}: class {node.name} {node.end_lineno - node.lineno + 1} lines"
           for path, text in sources.items() for node in ast.walk(ast.parse(text))
           if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > 250]
    assert not long and not big, long + big

    def holding(*needles: str) -> set[str]:
        return {path for path, text in sources.items() if any(n in text for n in needles)}

    assert holding("claim_token") == {"flctl/db/claims.py", "flctl/db/queue.py", "flctl/db/schema.py",
                                      "flctl/migrations/versions/0003_claim_token.py"}
    assert holding("F_OFD_SETLK", "journal_mode") <= {"flctl/db/sqlite.py", "flctl/db/store.py"}
    assert holding('"scancel"', '"squeue"', '"sinfo"') == {"flctl/launch/backends/slurm.py"}
    for path, text in sources.items():
        package = path.split("/")[1]
        if package not in ("db", "launch"):
            continue
        imported = {(node.module or "") for node in ast.walk(ast.parse(text)) if isinstance(node, ast.ImportFrom)}
        imported |= {a.name for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Import) for a in node.names}
        outside = {m for m in imported if m.startswith("flctl") and not m.startswith(f"flctl.{package}")}
        assert len(outside) <= 8, (path, sorted(outside))


CLI_DEF_LINES = 60


def test_commands_parse_call_and_print() -> None:
    """No def in flctl/cli/ over 60 lines, counted from its `def` line to its last (the signature, where a command's
    options are declared, included; its decorators not): a command parses, calls what does the work (flctl/launch/,
    flctl/runner.py or a named function beside it) and prints."""
    import ast

    long = [f"{path.relative_to(ROOT).as_posix()}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
            for path in sorted((ROOT / "flctl" / "cli").glob("*.py")) for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > CLI_DEF_LINES]
    assert not long, long


def _layout() -> tuple[list[str], list[list[str]]]:
    """README's layout block: the top-level paths (the first word of each unindented line) and flctl/'s groups (the
    names, comma-separated, on the lines indented by two spaces, up to the colon that ends a group)."""
    block = between(section(REFERENCE, "Layout"), "```\n", "```")
    top, groups, names = [], [], []
    for line in block.splitlines():
        if re.match(r"\S", line):
            top.append(line.split()[0])
        elif re.match(r"  \S", line):
            head, colon, _ = line.partition(":")
            names += [name.strip() for name in head.split(",") if name.strip()]
            if colon:
                groups.append(names)
                names = []
    assert not names, f"README's layout block: {names} end no group (no colon after them)"
    return top, groups


def test_readme_layout_is_the_tree() -> None:
    """Every path README's layout block names exists (top-level ones in the checkout, the indented ones in
    flctl/), and every module and subpackage of flctl/ is named, once, in the group of its layer in docs/design.md,
    the groups in the layers' order. Not named, so not required: modules inside flctl's subpackages (design.md
    describes them) and every top-level folder (a checkout also holds venvs, caches and results)."""
    from tests.test_structure import layers

    top, groups = _layout()
    missing = [path for path in top if not (ROOT / path).exists()]
    missing += [f"flctl/{name}" for group in groups for name in group if not (ROOT / "flctl" / name).exists()]
    assert not missing, f"README's layout names what is not there: {missing}"
    named = [f"flctl/{name}" for group in groups for name in group]
    assert len(named) == len(set(named)), "README's layout names a module twice"
    assert set(named) == _modules(), ("README's layout, flctl/: not named "
                                      f"{sorted(_modules() - set(named))}, no module {sorted(set(named) - _modules())}")
    known = layers()
    assert [sorted({known[f"flctl/{name}"] for name in group}) for group in groups] == \
        [[n] for n in range(1, max(known.values()) + 1)], "README's layout: one group per layer, in design.md's order"
