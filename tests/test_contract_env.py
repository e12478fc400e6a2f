"""The environment's part of the contract: every FLCTL_* variable flctl reads (found in its source, so a new one
fails test_every_variable_has_bad_values until it is given some), set to a value that cannot be right, under every
command: one `error:` line and exit 2 where the command uses it, never a traceback, and the results folder as it was.
No option parser reads the environment, so these values reach flctl's own checks unguarded."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flctl.cli import app
from tests.test_bad_input import first_run, populated, snapshot, template  # noqa: F401 - fixtures
from tests.test_contract_cli import BASES

runner = CliRunner()
SOURCE = Path(__file__).resolve().parents[1] / "flctl"
LONG = "a" * 300

# Each variable's bad values; "{file}": a file where a folder goes. Those marked every=True are read by every
# command that opens the database (every command but the catalogue's), which must refuse them.
BAD: dict[str, tuple[bool, list[str]]] = {
    "FLCTL_RESULTS": (True, [LONG, "{file}"]),
    "FLCTL_DB": (True, ["nosuch://x", "sqlite:///:memory:", f"sqlite:///{LONG}/flctl.db"]),
    "FLCTL_TASKS": (False, ["/no/such/task.py", LONG]),
    "FLCTL_TRACKER_TIMEOUT_S": (False, ["soon", "-1", "nan"]),
    "FLCTL_STALE_AFTER": (False, ["soon", "-5", "inf"]),
    "FLCTL_HEARTBEAT": (False, ["soon", "0", "nan"]),
}
CATALOGUE = {"tasks", "methods", "new-task"}


def read_variables() -> set[str]:
    return {m for p in SOURCE.rglob("*.py") for m in re.findall(r"FLCTL_[A-Z_]+", p.read_text())}


def test_every_variable_has_bad_values() -> None:
    assert read_variables() == set(BAD), f"give each variable flctl reads its bad values in BAD of {__file__}"


def cases():
    for name, (every, values) in BAD.items():
        for value in values:
            for command in sorted(BASES):
                yield pytest.param(name, value, command, every and command not in CATALOGUE,
                                   id=f"{name}={value[:20]} {command}")


# clean_plugins: an FLCTL_TASKS entry read in this process is remembered by it (flctl.plugins), and would be told
# again in the errors of the tests that follow in this xdist worker
@pytest.mark.usefixtures("no_cuda", "clean_plugins")
@pytest.mark.parametrize("name,value,command,refused", list(cases()))
def test_a_bad_variable_is_one_line_or_harmless(template: Path, populated: Path, tmp_path: Path,  # noqa: F811
                                                 monkeypatch: pytest.MonkeyPatch, name: str, value: str,
                                                 command: str, refused: bool) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("x")
    before, after = BASES[command]
    words = [w.format(run=first_run(template)) for w in [*before, *after]]
    if name != "FLCTL_RESULTS":
        words += ["--results-dir", str(populated)] if command not in CATALOGUE else []
    env = {name: value.format(file=tmp_path / "a-file"), "COLUMNS": "200"}
    snap = snapshot(populated)
    res = runner.invoke(app, words, env=env)
    assert res.exception is None or isinstance(res.exception, SystemExit), (words, res.output)
    assert "Traceback" not in res.output, res.output
    if refused:
        assert res.exit_code == 2, (words, res.output)
    if res.exit_code not in (0, 1, 3):            # refused: one line, and nothing written
        assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, (words, res.output)
        assert snapshot(populated) == snap
