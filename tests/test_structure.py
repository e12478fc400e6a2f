"""flctl's imports, held: no import cycle among its modules, and no module imports from a layer below its own in
docs/design.md's "Layers" list (the list is read out of the doc, so the doc and this test cannot disagree).

An import is an arrow wherever it is written: at the top of a module, inside a function (it still needs the other
module at run time, and hides a cycle rather than breaking it), and under ``if TYPE_CHECKING:`` (a type named in an
annotation is a dependency of the code that reads it: two modules that name each other's types are one piece).
``importlib.import_module`` calls are not: flctl makes them only of modules outside its package (a plugin, a task of
flctl_tasks, a tracker's library), which test_no_flctl_module_is_imported_by_name holds. ``from flctl.db.store import
Store`` is an arrow to flctl.db.store alone: that Python runs the package's ``__init__`` first is true of every
submodule, and counting it would make each package a cycle with its own modules; a package and the modules outside
it are held apart by test_no_two_packages_need_each_other instead."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.notorch

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "flctl"
DESIGN = ROOT / "docs" / "design.md"

# Arrows that break a rule today and are being removed, each with the reason; an entry whose import is gone fails
# test_every_waived_import_still_exists, so that the waiver goes with it. None today (the last, worker <-> submit,
# went when submit() began to take the worker it starts).
WAIVED: dict[tuple[str, str], str] = {}


def module_name(path: Path) -> str:
    """flctl/db/store.py -> flctl.db.store; a package's __init__.py is the package."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str) -> dict[str, int]:
    """The flctl modules that module ``name`` imports, each with the line of its first import there."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, int] = {}

    def target(module: str) -> str | None:
        # the module itself, else the nearest enclosing module (an import of a name defined in it)
        while module and module not in MODULES:
            module = module.rpartition(".")[0]
        return module or None

    def visit(node: ast.AST) -> None:
        named: list[str] = []
        if isinstance(node, ast.Import):
            named = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            # `from flctl import migrations` imports the module flctl.migrations; `from flctl.db import Store`, flctl.db
            named = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        for module in named:
            hit = target(module) if module.split(".")[0] == "flctl" else None
            if hit and hit != name:
                found.setdefault(hit, node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def import_graph() -> dict[str, dict[str, int]]:
    return {name: imports_of(name) for name in MODULES}


def _where(graph: dict[str, dict[str, int]], a: str, b: str) -> str:
    return f"{MODULES[a].relative_to(ROOT)}:{graph[a][b]} imports {b}"


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one module (Tarjan's algorithm, then a
    shortest way back to the component's first module): a component of n modules may hold several cycles, and
    breaking the one named shows the next."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    found = []
    for component in components:
        start, inside = component[0], set(component)
        way = {start: [start]}          # breadth first from start, inside the component, until an arrow leads back
        frontier, cycle = [start], None
        while cycle is None:
            following = []
            for v in frontier:
                for w in sorted(graph[v]):
                    if w == start and cycle is None:
                        cycle = way[v] + [start]
                    elif w in inside and w not in way:
                        way[w] = way[v] + [w]
                        following.append(w)
            frontier = following
        found.append(cycle)
    return found


def layers() -> dict[str, int]:
    """docs/design.md's layers: each ticked flctl/x.py or flctl/x/ in item n of the Layers list has layer n."""
    text = DESIGN.read_text()
    m = re.search(r"^## Layers\s*$(.*?)(?=^## )", text, flags=re.M | re.S)
    assert m, "docs/design.md has no section '## Layers'"
    items = re.split(r"^(\d+)\. ", m.group(1), flags=re.M)[1:]
    out = {}
    for number, body in zip(items[::2], items[1::2]):
        for path in re.findall(r"`(flctl/[a-z_]+(?:\.py|/))`", body):
            out[path] = int(number)
    assert sorted(set(out.values())) == list(range(1, len(items) // 2 + 1)), "the layers are not numbered 1, 2, ..."
    return out


def layer_of(name: str, known: dict[str, int]) -> int:
    """A module's layer: its package's (flctl/db/ for flctl.db.store) or its own. flctl/__init__.py holds only the
    version and imports nothing: layer 0, above them all, so that any import it gains is an arrow up from it."""
    parts = name.split(".")
    if len(parts) == 1:
        return 0
    key = f"flctl/{parts[1]}/" if len(parts) > 2 or MODULES[name].name == "__init__.py" else f"flctl/{parts[1]}.py"
    assert key in known, f"{key} is in none of docs/design.md's layers"
    return known[key]


def test_flctl_has_no_import_cycle() -> None:
    """No module of flctl imports itself back through others (the waived arrows aside)."""
    graph = import_graph()
    for a, b in WAIVED:
        graph[a].pop(b, None)
    found = [" -> ".join(cycle) + "\n    " + "\n    ".join(_where(graph, a, b) for a, b in zip(cycle, cycle[1:]))
             for cycle in cycles(graph)]
    assert not found, "import cycles in flctl (move what both sides need to the lower one):\n" + "\n".join(found)


def package_graph(graph: dict[str, dict[str, int]]) -> dict[str, dict[str, tuple[str, str]]]:
    """The import graph with each subpackage of flctl one node (flctl.db for flctl.db.store), each arrow between two
    nodes with one module import that makes it."""
    def node(name: str) -> str:
        parts = name.split(".")
        return ".".join(parts[:2]) if len(parts) > 2 or MODULES[name].name == "__init__.py" else name

    found: dict[str, dict[str, tuple[str, str]]] = {node(a): {} for a in graph}
    for a in graph:
        for b in graph[a]:
            if node(a) != node(b):
                found[node(a)].setdefault(node(b), (a, b))
    return found


def test_no_two_packages_need_each_other() -> None:
    """A package is one piece (docs/design.md names packages in its layers): none imports another, or a module
    outside it, that imports it back (flctl.db opens its schema through flctl.migrations, which then names nothing of
    flctl.db; flctl.launch runs a --tune search of flctl.tpe_search, which then waits through flctl.db, not
    flctl.launch.wait)."""
    graph = import_graph()
    for a, b in WAIVED:
        graph[a].pop(b, None)
    packages = package_graph(graph)
    found = [" -> ".join(cycle) + "\n    " + "\n    ".join(_where(graph, *packages[a][b]) for a, b in zip(cycle, cycle[1:]))
             for cycle in cycles({a: dict.fromkeys(b, 0) for a, b in packages.items()})]
    assert not found, "packages that import each other (move what both need to the lower one):\n" + "\n".join(found)


def test_no_flctl_module_is_imported_by_name() -> None:
    """importlib.import_module of an flctl module would be an arrow the graph above does not see."""
    def named(call: ast.Call) -> str:
        """The start of the name ``call`` imports, as far as it is written out ("" where it is not)."""
        first = call.args[0] if call.args else None
        if isinstance(first, ast.JoinedStr):         # f"flctl_tasks.{name}": its leading text
            first = first.values[0] if first.values else None
        return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else ""

    by_name = [f"{MODULES[name].relative_to(ROOT)}:{node.lineno}" for name in MODULES
               for node in ast.walk(ast.parse(MODULES[name].read_text()))
               if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
               and named(node).startswith("flctl.")]
    assert not by_name, "flctl modules imported by name (import them: the structure tests then see the arrow):\n" \
        + "\n".join(by_name)


def test_no_module_imports_from_a_layer_below_its_own() -> None:
    """docs/design.md: each layer imports only its own modules and the layers above it in the list (layer 1, the
    configuration, imports no training; the training no database; ...; nothing imports the CLI)."""
    graph, known = import_graph(), layers()
    wrong = [f"{_where(graph, a, b)}: layer {layer_of(a, known)} imports layer {layer_of(b, known)}"
             for a in graph for b in graph[a]
             if layer_of(b, known) > layer_of(a, known) and (a, b) not in WAIVED]
    assert not wrong, "imports from a layer below the importer's (docs/design.md, Layers):\n" + "\n".join(wrong)


def test_every_waived_import_still_exists() -> None:
    """A waiver goes with its import, so that the rule holds for it again."""
    graph = import_graph()
    gone = [f"{a} -> {b} ({why})" for (a, b), why in WAIVED.items() if b not in graph[a]]
    assert not gone, "these imports are gone: remove them from WAIVED in tests/test_structure.py\n" + "\n".join(gone)


def test_the_graph_sees_every_kind_of_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader above counts an import inside a function, under TYPE_CHECKING and in its else branch; a cycle
    made of them is found and named."""
    root = tmp_path / "flctl"
    (root / "db").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "db" / "__init__.py").write_text("")
    (root / "db" / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from flctl import c\n"
                                      "else:\n    from flctl.db import b\n")
    (root / "db" / "b.py").write_text("def f():\n    from ..c import X\n")
    (root / "c.py").write_text("import flctl.db.a\nX = 1\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    monkeypatch.setitem(globals(), "MODULES", {module_name(p): p for p in sorted(root.rglob("*.py"))})
    graph = import_graph()
    assert graph["flctl.db.a"] == {"flctl.c": 3, "flctl.db.b": 5}
    assert graph["flctl.db.b"] == {"flctl.c": 2}
    assert cycles(graph) == [["flctl.c", "flctl.db.a", "flctl.c"]]


def test_every_package_of_flctl_is_installed() -> None:
    """pyproject.toml lists its packages by name: one left out is missing from an installed flctl (flctl.records
    was, caught only by a test that installs it)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "flctl").rglob("__init__.py")
             if "__pycache__" not in p.parts and (p.parent / "__init__.py").is_file()}
    assert found - listed == set(), f"packages of flctl that pyproject.toml does not install: {sorted(found - listed)}"
