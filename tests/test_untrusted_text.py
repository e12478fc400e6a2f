"""A shared results folder cannot be turned against its users: what one user types or plants (sweep names, Slurm
options, dataset files, database rows) is data to the next one, never a script line, code, markup or terminal
control; and a database password never shows in a message. One-line bad-input rows live in tests/test_bad_input.py.
"""

from __future__ import annotations

import builtins
import json
import os
import pickle
import re
import sqlite3
import struct
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from flctl.cli import app
from tests.data_writers import write_cifar10
from tests.helpers import files_under

runner = CliRunner()

ESC, RLO = "\x1b", "\u202e"
# A name that retitles the terminal, clears it, and reverses the rest of the line.
HOSTILE = f"a{ESC}]0;PWNED\x07b{ESC}[2Jc{RLO}def"


def flctl(*args: str, **env: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "200", **env})


def one_error_line(res) -> str:
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (res.exit_code, res.output)
    assert ESC not in res.output and RLO not in res.output
    return lines[0]


# ---- 3. no shell, no newline: nothing user-given leaves its line in the Slurm batch script ----

@pytest.mark.parametrize("flags,needle", [
    (["--sbatch", "comment=a\ntouch /tmp/flctl-pwned"], "comment='a\\ntouch /tmp/flctl-pwned': the value holds a "
                                                        "control character (U+000A)"),
    (["--sbatch", f"comment=x{ESC}[2J"], "U+001B"),
    (["--sbatch", "comment\ntouch /tmp/flctl-pwned=1"], "an sbatch option name is letters"),
    (["--partition", "gpu\ntouch"], "--partition must be one word"),
    (["--account", f"lab{ESC}"], "--account must be one word"),
    (["--qos", f"high{RLO}"], "--qos must be one word"),
])
@pytest.mark.parametrize("dry_run", [True, False])
@pytest.mark.notorch
def test_slurm_values_with_control_characters_are_refused(results: Path, flags: list[str], needle: str,
                                                          dry_run: bool) -> None:
    # Checked where the launch settings are resolved: before the check for sbatch (not installed here) and
    # before anything is recorded.
    res = flctl("sweep", "two-moons", "--epochs", "1", "--executor", "slurm", *flags, *(["--dry-run"] * dry_run))
    assert needle in one_error_line(res)
    assert not results.exists()


@pytest.mark.notorch
def test_an_ordinary_sbatch_value_still_plans(results: Path) -> None:
    res = flctl("sweep", "two-moons", "--epochs", "1", "--executor", "slurm", "--sbatch", "comment=a b 'c'",
                "--sbatch", "constraint=a100", "--partition", "gpu", "--dry-run")
    assert res.exit_code == 0, res.output
    assert "nothing was written" in res.stdout and not results.exists()


@pytest.mark.notorch
def test_a_spec_with_a_newline_in_an_sbatch_value_records_nothing(tmp_path: Path, results: Path) -> None:
    spec = tmp_path / "moons.toml"
    spec.write_text('task = "two-moons"\nepochs = 1\n[launch]\nexecutor = "slurm"\n'
                    '[launch.sbatch]\ncomment = "a\\ntouch /tmp/flctl-pwned"\n')
    res = flctl("sweep", "--spec", str(spec))
    assert "the value holds a control character (U+000A)" in one_error_line(res)
    assert not results.exists()


@pytest.mark.notorch
def test_a_results_folder_with_a_newline_is_refused_for_slurm(tmp_path: Path) -> None:
    root = tmp_path / "res\ntouch /tmp/flctl-pwned"
    res = flctl("sweep", "two-moons", "--epochs", "1", "--executor", "slurm", "--results-dir", str(root), "--dry-run")
    assert "the Slurm batch script would hold this path" in one_error_line(res)
    assert not root.exists()


# ---- 4. safe loads: a planted CIFAR-10 batch is refused before it runs anything ----

class _System:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _Eval:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (builtins.eval, (f"open({str(self.marker)!r}, 'w').close()",))


@pytest.mark.parametrize("make,asks", [
    (lambda m: pickle.dumps(_System(m), protocol=2), f"{os.system.__module__}.system"),
    (lambda m: pickle.dumps({"data": _Eval(m), "labels": [1]}, protocol=4), "builtins.eval"),
    (lambda m: pickle.dumps([1, _Eval(m)], protocol=0), "__builtin__.eval"),   # Python 2 names, as written
])
@pytest.mark.notorch
def test_a_planted_batch_is_refused_and_runs_nothing(tmp_path: Path, results: Path, make, asks: str) -> None:
    data = write_cifar10(tmp_path / "data", per_batch=4)
    marker = tmp_path / "MARKER"
    (data / "cifar-10-batches-py" / "data_batch_2").write_bytes(make(marker))
    res = flctl("run", "cifar10", "--data-dir", str(data), "--epochs", "1")
    line = one_error_line(res)
    assert f"data_batch_2 is not a CIFAR-10 python batch: it asks for {asks}" in line
    assert not marker.exists()
    assert files_under(results) == []


def _py2_str(b: bytes) -> bytes:
    """A Python 2 str in a pickle: SHORT_BINSTRING, or BINSTRING when longer than 255 bytes."""
    return b"U" + bytes([len(b)]) + b if len(b) < 256 else b"T" + struct.pack("<i", len(b)) + b


def _py2_batch(labels: list[int], data: np.ndarray) -> bytes:
    """A batch as the real cifar-10-batches-py files hold it: pickled by Python 2 with numpy 1 (protocol 2, str
    keys, the array rebuilt through numpy.core.multiarray._reconstruct, its bytes a Python 2 str)."""
    n = len(labels)
    array = (b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85" + _py2_str(b"b") + b"\x87R"
             + b"(K\x01M" + struct.pack("<H", n) + b"M" + struct.pack("<H", 3072) + b"\x86"
             + b"cnumpy\ndtype\n" + _py2_str(b"u1") + b"K\x00K\x01\x87R"
             + b"(K\x03" + _py2_str(b"|") + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb"
             + b"\x89" + _py2_str(data.tobytes()) + b"tb")
    return (b"\x80\x02}(" + _py2_str(b"data") + array
            + _py2_str(b"labels") + b"](" + b"".join(b"K" + bytes([y]) for y in labels) + b"e"
            + _py2_str(b"batch_label") + _py2_str(b"training batch 1 of 5")
            + _py2_str(b"filenames") + b"](" + b"".join(_py2_str(f"img_{i}.png".encode()) for i in range(n))
            + b"eu.")


def test_the_real_python2_batch_format_still_loads(tmp_path: Path) -> None:
    from flctl.tasks import get_task

    data = write_cifar10(tmp_path / "data", per_batch=4)        # Python 3 pickles, protocol 2 (_codecs.encode)
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (3, 3072), dtype=np.uint8)
    (data / "cifar-10-batches-py" / "data_batch_1").write_bytes(_py2_batch([3, 7, 9], pixels))
    loaded = get_task("cifar10").load({"width": 8}, str(data))
    assert loaded.train.x.shape == (3 + 4 * 4, 3, 32, 32)
    assert loaded.train.y[:3].tolist() == [3, 7, 9]
    assert np.array_equal(loaded.train.x[:3].reshape(3, -1).numpy(), pixels)


# ---- 8. text from users is text ----

def _sweep_named(name: str, seed: int):
    return flctl("sweep", "two-moons", "-m", "erm", "--epochs", "1", "--seed", str(seed), "--executor", "debug",
                 "--name", name)


def test_a_name_with_markup_is_stored_and_listed_literally(results: Path) -> None:
    assert _sweep_named("[/x] [bold]loud", 0).exit_code == 0
    res = flctl("sweeps")
    assert res.exit_code == 0, res.output
    assert "[/x] [bold]loud" in res.stdout
    status = flctl("status", "[/x] [bold]loud")
    assert status.exit_code == 0 and "completed" in status.stdout


@pytest.mark.parametrize("name", [HOSTILE, f"left{RLO}thgir", "two\nlines", "tab\there"])
@pytest.mark.notorch
def test_a_name_with_control_characters_is_refused(results: Path, name: str) -> None:
    line = one_error_line(_sweep_named(name, 0))
    assert "holds a control character" in line
    assert not results.exists()


@pytest.mark.notorch
def test_a_spec_name_with_control_characters_is_refused(tmp_path: Path, results: Path) -> None:
    spec = tmp_path / "moons.toml"
    spec.write_text('task = "two-moons"\nname = "a\\u001b]0;PWNED\\u0007b"\nepochs = 1\n')
    assert "holds a control character (U+001B)" in one_error_line(flctl("sweep", "--spec", str(spec)))
    assert not results.exists()


def test_hostile_text_already_in_the_database_prints_as_plain_text(results: Path) -> None:
    """Rows written by another user (or an older flctl) with ESC sequences, U+202E and markup: every listing still
    works and prints neither control characters nor markup."""
    assert _sweep_named("plain", 0).exit_code == 0
    with sqlite3.connect(results / "flctl.db") as db:
        db.execute("UPDATE sweeps SET name = ?", (HOSTILE + "[/x]",))
        config = json.loads(db.execute("SELECT config FROM runs").fetchone()[0])
        config["options"] = {**config.get("options", {}), "note": HOSTILE}
        db.execute("UPDATE runs SET host = ?, error = ?, config = ?",
                   (f"node{ESC}[31m", f"boom [/red] {HOSTILE}", json.dumps(config)))
    run_id = json.loads(flctl("runs", "--json").stdout)[0]["id"]
    for args in (["sweeps"], ["runs"], ["show", run_id], ["status"]):
        res = flctl(*args)
        assert res.exit_code == 0, (args, res.output)
        assert ESC not in res.output and RLO not in res.output and "\x07" not in res.output, args
    assert "[/x]" in flctl("sweeps").stdout
    shown = flctl("show", run_id).stdout
    assert "boom [/red] a]0;PWNEDb[2Jcdef" in shown and "node[31m" in shown


@pytest.mark.notorch
def test_a_device_name_is_not_an_emoji(results: Path) -> None:
    # rich prints `:x:` as an emoji; the message must quote what was typed
    line = one_error_line(flctl("run", "two-moons", "--device", "cuda:x:", "--epochs", "1"))
    assert "unknown device 'cuda:x:'" in line and "\u274c" not in line


@pytest.mark.notorch
def test_a_usage_error_quoting_hostile_text_stays_one_plain_line(results: Path) -> None:
    # The message is click's, quoting what was typed. Some versions of click (or of the copy typer 0.29 carries) write
    # ESC as the text \x1b, others pass it through and flctl drops it, as it drops U+202E (the H200 image's showed
    # `--bogus`): either way the line names the option and holds no control character (one_error_line).
    line = one_error_line(flctl("run", "two-moons", f"--bo{ESC}gus{RLO}"))
    assert re.search(r"No such option: --bo(\\x1b)?gus \(see", line), line


@pytest.mark.parametrize("url", [
    "postgresql://u:secret@127.0.0.1:1/x",                  # nothing listens on port 1
    "postgresql://u:secret@127.0.0.1:abc/x",                # not a URL: the message quotes it
    "postgresql://u@127.0.0.1:1/x?password=secret",         # a password as a query parameter
    "postgresql+nodriver://u:secret@127.0.0.1/x",           # unknown driver
])
@pytest.mark.notorch
def test_a_database_password_never_shows(results: Path, url: str) -> None:
    res = flctl("runs", "--db", url)
    one_error_line(res)
    assert "secret" not in res.output and "***" in res.output


@pytest.mark.notorch
def test_a_driver_message_quoting_the_connection_string_is_redacted() -> None:
    from flctl.db.store import _one_line

    class DriverError(Exception):
        pass

    quoted = DriverError('invalid dsn: "host=h port=1 user=u password=s3cr@t dbname=x"\nDETAIL: more')
    assert _one_line(quoted) == 'invalid dsn: "host=h port=1 user=u password=*** dbname=x"'
    echoed = DriverError("could not connect as u with s3cr@t to postgresql://u:s3cr%40t@h/x")
    text = _one_line(echoed, "postgresql://u:s3cr%40t@h/x")
    assert "s3cr" not in text and text.count("***") == 2
