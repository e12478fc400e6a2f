"""The contract of every command and option, generated from the code: the Typer app is walked, each option is given
the classes of bad input that fit its kind, and each case must end in one `error:` line, exit 2, no traceback, and
the results folder exactly as it was (every file's bytes). A new command, option or argument that this module does
not know the kind of fails test_every_option_has_a_kind until it is given one (KINDS), so the matrix grows with
the code, not with someone's memory.

The kind comes from the option's Python type where that says enough (int, float, Path, a flag); a str or list
option says what it holds in KINDS. The cases run in this process (CliRunner): every one fails while its words are
read or its arguments checked, before any heavy import, so the whole matrix takes seconds; one that were accepted
would do its command's real work (each command's base is a dry run where it has one), and fail its case.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import typer.main
from typer.testing import CliRunner

from flctl.cli import app
from flctl.cli.parsing import kinds, takes_value
from flctl.db import Store
from tests.test_bad_input import first_run, populated, snapshot, template  # noqa: F401 - fixtures

runner = CliRunner()
GROUP = typer.main.get_command(app)

# What a str (or list-of-str) option or argument holds, by flag (or argument name), where its Python type does not
# say: each kind below has its classes of bad input (CLASSES).
KINDS: dict[str, str] = {
    # names from a closed list: tasks, methods, tables, formats, executors, ...
    **dict.fromkeys(["TASK", "--task", "--method", "--dual-optimizer", "--engine", "--optimizer", "--precision",
                     "--scheduler", "--device", "--direction", "--executor", "--format", "--plot", "--samples",
                     "--scale", "--split", "--status", "--table", "--by", "--model", "--objective", "--log-to",
                     "--to", "--methods", "--only", "--columns"], "choice"),
    # a sweep's axes: one value, a list or a range, of a number
    **dict.fromkeys(["--alpha", "--batch-size", "--dual-lr", "--epochs", "--eps", "--eval-every", "--ki", "--kp",
                     "--lr", "--micro-batch", "--momentum", "--nu", "--p-min", "--prune-after", "--prune-patience",
                     "--seed", "--subset", "--warmup-steps", "--weight-decay"], "axis"),
    # free text that lands in a database row, a Slurm script or a file: one line of printable text
    **dict.fromkeys(["--name", "--description", "--account", "--partition", "--qos", "NAME"], "text"),
    # KEY=VALUE pairs, repeatable
    **dict.fromkeys(["--option", "--sbatch"], "pairs"),
    "--db": "database",
    "--data-dir": "path-in",             # a folder, or a file (orca-dpo's)
    # a run or sweep of the database: by id or unique id prefix (runs), by id, prefix or name (sweeps), or either
    "REF": "ref", "RUN_ID": "ref-run", **dict.fromkeys(["SWEEP_REF", "--sweep"], "ref-sweep"),
}
# Path options: a folder flctl writes into, a file it writes, or something it reads.
PATH_KINDS = {"--results-dir": "folder-out", "--dir": "folder-out", "--spec": "file-in", "--specs": "folder-in",
              ("report", "--out"): "file-out", ("paper", "--out"): "folder-out",
              # a dry run plans a cluster's programme on a laptop: the data folder named is not looked for
              ("paper", "--data-dir"): "path-planned"}

# Each command as a user gives it, against the populated folder: the words before the option under test, and after
# (a dry run where the command has one, so that a case wrongly accepted costs a plan, not a training).
BASES: dict[str, tuple[list[str], list[str]]] = {
    "run": (["run", "two-moons", "--epochs", "1"], ["--dry-run"]),
    "sweep": (["sweep", "two-moons", "-m", "erm", "--epochs", "1", "--executor", "debug"], ["--dry-run"]),
    "cancel": (["cancel", "moons"], []),
    "status": (["status", "moons"], []),
    "sweeps": (["sweeps"], []),
    "runs": (["runs"], []),
    "show": (["show", "{run}"], []),
    "report": (["report", "--table", "main"], []),
    "paper": (["paper", "--only", "figure:3", "--scale", "smoke"], ["--dry-run"]),
    "export": (["export", "{run}", "--to", "tensorboard"], []),
    "tasks": (["tasks"], []),
    "methods": (["methods"], []),
    "new-task": (["new-task", "my-task"], []),
    "migrate": (["migrate"], []),
    "verify": (["verify", "{run}"], []),
    "reproduce": (["reproduce", "{run}"], []),
}

LONG = "x" * 300
# The classes of bad input, by kind: (class name, the value; "{file}" a file that exists, "{missing}" a path that
# does not). Every option that takes a value also gets the two classes of ALL.
ALL = [("value is the next option", None), ("empty", "")]
CLASSES: dict[str, list[tuple[str, str]]] = {
    "int": [("not a number", "abc"), ("a fraction", "1.5"), ("too large", "9" * 30), ("a bool", "true")],
    "float": [("not a number", "abc"), ("nan", "nan"), ("inf", "inf"), ("a bool", "true")],
    "choice": [("unknown", "no-such-value"), ("too long", LONG)],
    "axis": [("not a number", "abc"), ("nan", "nan"), ("a broken range", "1..")],
    "text": [("a control character", "a\nb"), ("too long", "y" * 5000)],
    "pairs": [("no =", "novalue"), ("no key", "=1")],
    "database": [("not a URL", "nosuch://x"), ("in memory", "sqlite:///:memory:")],
    "ref-run": [("unknown", "zzzz-no-such"), ("a prefix too short", "ab"), ("an ambiguous prefix", "{run_prefix}")],
    "ref-sweep": [("unknown", "zzzz-no-such"), ("a prefix too short", "ab"),
                  ("an ambiguous prefix", "{sweep_prefix}")],
    "ref": [("unknown", "zzzz-no-such"), ("a prefix too short", "ab"), ("an ambiguous run prefix", "{run_prefix}"),
            ("an ambiguous sweep prefix", "{sweep_prefix}"), ("names a run and a sweep", "{run_and_sweep}")],
    "folder-out": [("a file", "{file}"), ("a name too long", LONG), ("read-only", "{readonly}")],
    "folder-in": [("missing", "{missing}"), ("a file", "{file}"), ("a name too long", LONG)],
    "path-in": [("missing", "{missing}"), ("a name too long", LONG)],
    "path-planned": [("a name too long", LONG)],
    "file-in": [("missing", "{missing}"), ("a folder", "{folder}"), ("a name too long", LONG)],
    "file-out": [("a folder", "{folder}"), ("a name too long", LONG), ("in a read-only folder", "{readonly}/out.png")],
}


def kind(command: str, param) -> str | None:
    """The kind of ``param`` of ``command``: from KINDS / PATH_KINDS, else from its Python type; None: unknown."""
    flag = param.opts[0] if param.param_type_name == "option" else param.name.upper()
    python = kinds(GROUP.commands[command]).get(param.name)
    if (command, flag) in PATH_KINDS:
        return PATH_KINDS[command, flag]
    if python is Path:
        return PATH_KINDS.get(flag)
    if python in (int, float):
        return python.__name__
    if command == "sweep" and flag in KINDS and KINDS[flag] == "axis":
        return "axis"
    found = KINDS.get(flag)
    return None if found == "axis" else found       # an axis flag of `run` has its own type: int or float


def every_param():
    for name, command in sorted(GROUP.commands.items()):
        for param in command.params:
            if param.param_type_name == "argument" or takes_value(param):
                yield name, param


def cases():
    for command, param in every_param():
        found = kind(command, param)
        flag = param.opts[0] if param.param_type_name == "option" else None
        for label, value in (ALL[1:] if flag is None else ALL) + CLASSES.get(found or "", []):
            if (command, flag) == ("report", "--table") and label == "value is the next option":
                continue         # the base's own --table: the same case as report --plot's
            yield pytest.param(command, flag or param.name, label, value,
                               id=f"{command} {flag or param.name.upper()} {label}")


def test_every_option_has_a_kind() -> None:
    """Every command's every value and argument has a kind the matrix knows; every command has a base."""
    unknown = [f"{c} {p.opts[0] if p.param_type_name == 'option' else p.name}" for c, p in every_param()
               if kind(c, p) not in CLASSES]
    assert not unknown, f"give these a kind in KINDS or PATH_KINDS of {__file__}: {unknown}"
    assert set(GROUP.commands) == set(BASES), "give each new command a base in BASES"
    # and the matrix is big: every value option of every command, several classes each
    assert sum(1 for _ in cases()) > 400


@pytest.fixture(scope="module")
def crowded(template: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:  # noqa: F811
    """The populated template with what makes a reference ambiguous, made the way a user would: a run whose id shares
    its first 4 digits with another's (a seed found by trying), a sweep whose id shares 4 with 'moons' (a name found
    by trying), and a sweep named as a run's id prefix. Returns the folder and those three references."""
    from flctl import api
    from flctl.sweep import sweep_id

    root = tmp_path_factory.mktemp("crowded") / "results"
    shutil.copytree(template, root, ignore=shutil.ignore_patterns("flctl.db-wal", "flctl.db-shm"))
    store = Store.open(f"sqlite:///{root / 'flctl.db'}", readonly=True)
    runs, moons = [r.id for r in store.list_runs()], store.get_sweep("moons")
    store.close()
    seed = next(s for s in range(1, 10**6) if api.config("digits", "fl", epochs=1, seed=s).run_id[:4]
                in {r[:4] for r in runs})
    configs = [api.config("two-moons", m, epochs=2) for m in ("erm", "fl")]
    assert sweep_id(SimpleNamespace(name="moons"), configs) == moons["id"]     # how flctl names it, still
    twin = next(f"moons-{i}" for i in range(10**6)
                if sweep_id(SimpleNamespace(name=f"moons-{i}"), configs)[:4] == moons["id"][:4])
    for args in (["run", "digits", "-m", "fl", "--epochs", "1", "--seed", str(seed)],
                 ["sweep", "two-moons", "-m", "erm,fl", "--epochs", "2", "--executor", "debug", "--name", twin],
                 ["sweep", "two-moons", "-m", "erm,fl", "--epochs", "2", "--executor", "debug", "--name", runs[0][:6]]):
        res = runner.invoke(app, [*args, "--results-dir", str(root)])
        assert res.exit_code == 0, res.output
    with sqlite3.connect(root / "flctl.db") as conn:
        assert conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
    conn.close()
    return root, {"run_prefix": api.config("digits", "fl", epochs=1, seed=seed).run_id[:4],
                  "sweep_prefix": moons["id"][:4], "run_and_sweep": runs[0][:6]}


@pytest.fixture
def read_only(tmp_path: Path):
    """An empty folder nothing can be written into, even by root (chattr +i; chmod where not root); the case is
    skipped on a file system that has neither."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    made = subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0 if os.geteuid() == 0 \
        else folder.chmod(0o555) is None
    try:
        (folder / "probe").touch()
        (folder / "probe").unlink()
        writable = True
    except OSError:
        writable = False
    try:
        yield folder if made and not writable else None
    finally:
        subprocess.run(["chattr", "-i", str(folder)], capture_output=True)
        folder.chmod(0o755)


def invocation(command: str, name: str, value: str | None, root: Path, tmp: Path, run_id: str,
               refs: dict[str, str] | None = None) -> list[str]:
    before, after = BASES[command]
    before = [w.format(run=run_id) for w in before]
    is_argument = not name.startswith("-")
    if value is None:                                    # the next word is one of the command's own options
        flags = [p.opts[0] for p in GROUP.commands[command].params if getattr(p, "is_flag", False)]
        value = "--dry-run" if "--dry-run" in flags else (flags[0] if flags else "--help")
    (tmp / "a-file").write_text("x")
    (tmp / "a-folder").mkdir(exist_ok=True)
    value = value.format(file=tmp / "a-file", folder=tmp / "a-folder", missing=tmp / "no" / "such",
                         readonly=tmp / "read-only", **(refs or {}))
    if is_argument:                                      # the argument itself replaced by the bad value
        position = {"run": 1, "sweep": 1, "new-task": 1, "show": 1, "export": 1, "verify": 1, "cancel": 1,
                    "status": 1, "reproduce": 1}[command]
        words = [*before[:position], value, *before[position + 1:]]
    else:
        words = [*before, name, value]
    where = [] if name == "--results-dir" else ["--results-dir", str(root)]
    return [*words, *after, *where]


@pytest.mark.usefixtures("no_cuda")
@pytest.mark.parametrize("command,name,label,value", list(cases()))
def test_bad_value_is_one_line_and_changes_nothing(crowded: tuple[Path, dict[str, str]], read_only: Path | None,
                                                    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str,
                                                    name: str, label: str, value: str | None) -> None:
    if "{readonly}" in (value or "") and read_only is None:
        pytest.skip("no way to make a folder read-only on this file system")
    monkeypatch.chdir(tmp_path)               # new-task writes into the current folder
    folder = tmp_path / "results"
    shutil.copytree(crowded[0], folder)
    args = invocation(command, name, value, folder, tmp_path, first_run(crowded[0]), crowded[1])
    before = snapshot(folder)
    cwd_before = sorted(p.name for p in tmp_path.iterdir())
    res = runner.invoke(app, args, env={"COLUMNS": "200"})
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2, f"{args}: exit {res.exit_code}\n{res.output}"
    assert len(lines) == 1 and lines[0].startswith("error: "), f"{args}:\n{res.stderr}"
    assert "Traceback" not in res.output, res.output
    assert snapshot(folder) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == cwd_before


@pytest.mark.parametrize("command", sorted(BASES))
def test_a_flag_given_a_value_is_one_line(command: str, populated: Path) -> None:  # noqa: F811
    flags = [p.opts[0] for p in GROUP.commands[command].params if getattr(p, "is_flag", False)
             and p.opts[0] != "--help"]
    for flag in flags:
        res = runner.invoke(app, [command, f"{flag}=yes", "--results-dir", str(populated)])
        assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, (flag, res.output)


def wrong_case_cases():
    for command, param in every_param():
        if kind(command, param) == "choice" and param.param_type_name == "option":
            values = [str(v.value) for v in param.shell_complete(GROUP.commands[command].context_class(
                GROUP.commands[command]), "")] if getattr(param, "_custom_shell_complete", None) else []
            values = [v for v in values if v.upper() != v]
            if values:
                yield pytest.param(command, param.opts[0], values[0].upper(), id=f"{command} {param.opts[0]}")


@pytest.mark.usefixtures("no_cuda")
@pytest.mark.parametrize("command,flag,value", list(wrong_case_cases()))
def test_a_name_in_the_wrong_case_is_taken_or_refused_in_one_line(template: Path, populated: Path,  # noqa: F811
                                                                   tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   command: str, flag: str, value: str) -> None:
    """`--method FL`, `--table MAIN`: either the name it means (exit 0) or one line and exit 2; never a traceback."""
    monkeypatch.chdir(tmp_path)
    args = invocation(command, flag, value, populated, tmp_path, first_run(template))
    res = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert res.exit_code in (0, 2), f"{args}: exit {res.exit_code}\n{res.output}"
    assert "Traceback" not in res.output and res.exception is None or isinstance(res.exception, SystemExit), res.output
    if res.exit_code == 2:
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), f"{args}:\n{res.stderr}"


def test_a_filter_that_matches_nothing_says_so_and_a_misspelt_name_is_one_line(populated: Path) -> None:  # noqa: F811
    """`flctl runs --status failed` where none failed (at e320564: a 40-line traceback from an empty column) and
    `--task two-moon` (a typo: the closest name)."""
    where = ["--results-dir", str(populated)]
    none = runner.invoke(app, ["runs", "--status", "failed", *where])
    assert none.exit_code == 0 and none.stdout.strip() == "no run matches", none.output
    assert runner.invoke(app, ["runs", "--status", "failed", "--json", *where]).stdout.strip() == "[]"
    typo = runner.invoke(app, ["runs", "--task", "two-moon", *where])
    assert typo.exit_code == 2 and typo.stderr.strip().splitlines() == [
        "error: --task 'two-moon': no such task; did you mean 'two-moons'? (choose one of: "
        + ", ".join(__import__("flctl.tasks", fromlist=["all_tasks"]).all_tasks()) + ")"], typo.output


@pytest.mark.parametrize("words", [
    ["two-moons", "--eps", "-0.1"], ["two-moons", "--lr", "-1e-3"], ["two-moons", "--eps=-1"],
    ["two-moons", "-o", "depth=-1"], ["two-moons", "--eps", "-.5"], ["two-moons", "--", "--eps"],
    ["two-moons", "--data-dir", "-a folder with spaces"]])
def test_legitimate_words_pass_the_option_rules(words: list[str]) -> None:
    """Negative numbers, a value glued on with `=`, a dash value with a space in it, and what follows `--` are
    values: the rules refuse what cannot be one, nothing else."""
    from flctl.cli.parsing import check_words

    assert check_words(GROUP.commands["run"], words) is None
    assert check_words(GROUP.commands["sweep"], ["two-moons", "--eps", "-1..1", "--lr", "-1e-3,1e-3"]) is None


def test_a_short_option_missing_its_value_is_told_without_a_glued_form_click_would_misread() -> None:
    from flctl.cli.parsing import check_words

    said = check_words(GROUP.commands["run"], ["two-moons", "-m", "--dry-run"])
    assert said == "-m needs a value, and --dry-run is an option; give the value after -m"
