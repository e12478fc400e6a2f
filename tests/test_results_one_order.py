"""One bad results folder or database, one first error, from the CLI and the Python API alike: both find a command's
folder through the one doorway (flctl.results.find), which checks in one order. The cases are the contract matrix's
(tests/test_contract_cli.py: a --results-dir that is a file, a name too long, a folder that takes no file; a --db that
is not a URL, an in-memory one) each alone and each folder case with each database case, for a command that writes,
one that plans and one that reads; the API's error must be the CLI's line, in the API's words where the two voices
of flctl.results.Voice differ (the same check, with the same values)."""

from __future__ import annotations

import dataclasses
import re
import string
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from flctl import api, results
from flctl.cli import app
from flctl.errors import ConfigError, StoreError
from tests.test_contract_cli import CLASSES, read_only  # noqa: F401 - a fixture

runner = CliRunner()

# The matrix's values, less those each surface refuses in its own argument check before any doorway (an empty
# value: the CLI's word rules, the API's flctl.api_args.checked).
FOLDERS = [(label, value) for label, value in CLASSES["folder-out"]]
DATABASES = [(label, value) for label, value in CLASSES["database"]]
# Each command as the CLI gives it and as the API calls it (the results folder and database added to both).
COMMANDS: dict[str, tuple[list[str], Any]] = {
    "run": (["run", "two-moons", "--epochs", "1"], lambda **where: api.run("two-moons", epochs=1, **where)),
    "sweep --dry-run": (["sweep", "two-moons", "-m", "erm", "--epochs", "1", "--executor", "debug", "--dry-run"],
                        lambda **where: api.sweep("two-moons", method="erm", epochs=1, dry_run=True,
                                              launch={"executor": "debug"}, **where)),
    "runs": (["runs"], lambda **where: api.runs(**where)),
}


def cases():
    for command in COMMANDS:
        for folder in [None, *FOLDERS]:
            for db in [None, *DATABASES]:
                if folder is not None or db is not None:
                    yield pytest.param(command, folder, db, id=f"{command}: {folder and folder[0]}, {db and db[0]}")
    # a folder with no database yet: bad input only where the command reads one
    yield pytest.param("runs", ("a folder with no database", "{empty}"), None, id="runs: no database")


def parsed(template: str, text: str) -> dict[str, str] | None:
    """The values ``template`` (a Voice's format string) was filled with to say ``text``, each as it was written
    (``{root!r}``: quoted); None where these are not its words."""
    pattern, seen = "", set()
    for literal, name, _, conversion in string.Formatter().parse(template):
        pattern += re.escape(literal)
        if name is not None:
            key = f"{name}!{conversion}" if conversion else name
            group = re.sub(r"\W", "_", key)
            pattern += f"(?P={group})" if group in seen else f"(?P<{group}>.+?)"
            seen.add(group)
    found = re.fullmatch(pattern, text)
    return None if found is None else found.groupdict()


# The CLI names its options where the API names its arguments, and points at the command's help.
OPTIONS = {"--results-dir": "results_dir", "--db": "db"}
HELP = re.compile(r" \(see `flctl [a-z-]+ --help`\)$")


def same_error(cli: str, said: str) -> None:
    """``said`` (the API's message) is the CLI's line ``cli``: word for word (an option named as its argument), or
    the same Voice field with the same values where the two voices word it apart."""
    for field in dataclasses.fields(results.Voice):
        if (theirs := parsed(getattr(results.API, field.name), said)) is not None:
            ours = parsed(getattr(results.CLI, field.name), cli)
            assert ours is not None, f"the API said {field.name} ({said!r}), the CLI {cli!r}"
            common = set(ours) & set(theirs)
            assert {k: ours[k] for k in common} == {k: theirs[k] for k in common}, (cli, said)
            return
    flag, colon, rest = HELP.sub("", cli).partition(":")
    assert (OPTIONS.get(flag, flag) + colon + rest if colon else cli) == said


@pytest.mark.usefixtures("no_cuda")
@pytest.mark.parametrize("command,folder,db", list(cases()))
def test_the_cli_and_the_api_say_the_same_first_error(command: str, folder: tuple[str, str] | None,
                                                      db: tuple[str, str] | None, read_only: Path | None,  # noqa: F811
                                                      tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    value = None if folder is None else folder[1]
    if "{readonly}" in (value or "") and read_only is None:
        pytest.skip("no way to make a folder read-only on this file system")
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "empty").mkdir()
    results_dir = str(tmp_path / "results") if value is None else value.format(
        file=tmp_path / "a-file", readonly=tmp_path / "read-only", empty=tmp_path / "empty")
    where: dict[str, Any] = {"results_dir": results_dir, "db": None if db is None else db[1]}
    for name in ("FLCTL_RESULTS", "FLCTL_DB"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    words, call = COMMANDS[command]
    res = runner.invoke(app, [*words, "--results-dir", results_dir, *(["--db", db[1]] if db else [])],
                        env={"COLUMNS": "200"})
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), res.output
    with pytest.raises((ConfigError, StoreError)) as raised:
        call(**where)
    same_error(lines[0].removeprefix("error: "), str(raised.value))


@pytest.mark.usefixtures("no_cuda")
@pytest.mark.parametrize("words", [["runs"], ["run", "two-moons", "--epochs", "1", "--dry-run"],
                                   ["sweep", "two-moons", "-m", "erm", "--epochs", "1", "--dry-run"]])
def test_a_command_checks_its_folder_once(words: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The doorway's checks of a folder run once a command (before flctl.results.find: two or three times, each
    with its own chance to say another first error); the real checks run, counted."""
    real, calls = results.check_folder, []

    def counted(*args: Any, **kwargs: Any) -> None:
        calls.append(args)
        real(*args, **kwargs)

    monkeypatch.setattr(results, "check_folder", counted)
    (tmp_path / "empty").mkdir()
    res = runner.invoke(app, [*words, "--results-dir", str(tmp_path / "empty")])
    assert len(calls) == 1, (calls, res.output)
