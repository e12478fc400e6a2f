"""Every `flctl` command of the README, as a new user types it, on a folder that several tasks fill.

The lines are read from README.md's bash blocks in order, so a renamed option or a changed default breaks this
test, not a user's first afternoon. `[...]` parts are tried one at a time (each alternative of `a | b` and of
`x|y|z` on its own); SWEEP, ID, T, F and NAME stand for the newest sweep, two-moons, a table file and a figure
stem. Lines that need what this machine lacks (a GPU, the CIFAR-10, UTKFace or Llama downloads, a Slurm cluster)
must stop with one line and exit 2. Everything else must work in at least one of its forms, and no form may end in
a traceback. One deviation from the text: what trains checks wiring here, not numbers, so sweeps that train get
`--epochs 5`, one worker (`--workers 1`: each worker is a new interpreter; test_sweep_launch counts workers) and at
most 3 --tune trials (test_first_contact_sweep runs the --tune line's 20 trials), `flctl run`
lines without --epochs get `--epochs 2`, except the Quick start's, which trains verbatim, and fashion-mnist's train on
`--subset 500` of its 70,000 real images (tests/test_fashion_mnist.py trains it at length).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from flctl_tasks.fashion_mnist import DEBIAN, complete
from tests import warm
from tests.data_writers import orca_rows
from tests.helpers import in_process

# Slow (pyproject.toml's markers; `pytest -m "not slow"` is the fast loop): every README command on a folder several
# tasks fill: 106 s of the suite's 904 s of test time (2 cores, xdist -n 2).
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
# What a line needs that this machine does not have; such a line must refuse in one line, exit 2.
UNAVAILABLE = {"cifar10": "CIFAR-10 (a download)", "utkface": "UTKFace (a download)",
               "orca-dpo.toml": "Llama-3.1-8B (a download)", "--executor slurm": "a Slurm cluster"}
if not torch.cuda.is_available():   # where CUDA is (a GPU run sets CUDA_VISIBLE_DEVICES), a GPU line must work
    UNAVAILABLE["--device cuda"] = "a GPU"
if not complete(DEBIAN):       # installed by .ci/run; elsewhere its line must refuse in one line
    UNAVAILABLE["fashion-mnist"] = "Fashion-MNIST (apt install dataset-fashion-mnist)"


def readme_lines() -> list[str]:
    """The `flctl` command of every line of the README's bash blocks, comment stripped (the Quick start's after
    its `&&` install steps)."""
    text = (REPO / "README.md").read_text() + (REPO / "docs" / "reference.md").read_text()   # the README's rest
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            command = re.split(r"\s#\s", line.split(" && ")[-1])[0].strip()
            if command.startswith("flctl "):
                lines.append(command)
    return lines


def forms(line: str) -> list[str]:
    """The line without its `[...]` parts, then with each alternative of each part alone; a bare `a|b|c` word gives
    one line per alternative (each expanded so)."""
    parts = re.split(r"(\[[^\]]*\])", line)
    for part in parts:
        for word in ([] if part.startswith("[") else part.split()):
            if "|" in word:
                return [f for alt in word.split("|") for f in forms(line.replace(word, alt, 1))]
    base = ["" if p.startswith("[") else p for p in parts]

    def joined(chosen: list[str]) -> str:
        return " ".join(" ".join(p.split()) for p in chosen if p.strip())

    found = [joined(base)]
    for i, part in enumerate(parts):
        if not part.startswith("["):
            continue
        inner = part[1:-1]
        if " | " in inner:                        # [--sweep ID | --task T]
            options = inner.split(" | ")
        elif "|" in inner:                        # [--format rich|markdown|latex|csv]
            flag, values = inner.split(" ", 1)
            options = [f"{flag} {v}" for v in values.split("|")]
        else:
            options = [inner]
        found += [joined([*base[:i], option, *base[i + 1:]]) for option in options]
    return found


def test_forms_expand_options_one_at_a_time() -> None:
    assert forms("flctl status [SWEEP] [--json]") == ["flctl status", "flctl status SWEEP", "flctl status --json"]
    assert forms("flctl report --plot a|b [--task T]") == ["flctl report --plot a", "flctl report --plot a --task T",
                                                           "flctl report --plot b", "flctl report --plot b --task T"]
    assert forms("flctl report --table main [--sweep ID | --task T] [--format rich|csv]") == [
        "flctl report --table main", "flctl report --table main --sweep ID", "flctl report --table main --task T",
        "flctl report --table main --format rich", "flctl report --table main --format csv"]


# Commands that only read (and draw), and `flctl run` and `flctl paper`, run in this process; the rest (sweeps and
# their ledger, whose workers and signals are other processes') as processes of their own. A new interpreter
# spends about 8 s here importing torch, torch._dynamo and scikit-learn before a run trains its first epoch: the ~60
# report forms and the six training lines would spend minutes on it. The other commands are processes forked warm
# (tests/warm.py; their workers are new interpreters); the Quick start's line is a new interpreter, as are
# test_first_contact_run's.
IN_PROCESS = ("report", "runs", "show", "sweeps", "tasks", "methods", "run", "paper")


def _run(cwd: Path, command: str, quick_start: bool = False) -> subprocess.CompletedProcess:
    args = shlex.split(command)[1:]
    if args[0] in IN_PROCESS and "--watch" not in args and not quick_start:
        assert Path.cwd() == cwd
        return in_process(*args, env={"COLUMNS": "160"})
    start = subprocess.run if quick_start else warm.run
    return start([sys.executable, "-m", "flctl", *args], capture_output=True, text=True, timeout=300, cwd=cwd,
                 errors="replace", env={**os.environ, "COLUMNS": "160"})


def _newest_sweep(cwd: Path) -> str:
    out = _run(cwd, "flctl sweeps --json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)[0]["id"]


@pytest.mark.timeout(900)
def test_every_readme_command_works_on_a_populated_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sweeps").symlink_to(REPO / "sweeps")
    with open(tmp_path / "orca.jsonl", "w") as f:     # the README's --data orca.jsonl, in the dataset's columns
        for row in orca_rows(16):
            f.write(json.dumps(row) + "\n")
    # Another task's runs and an ERM baseline for `--samples diff --methods erm,fl`: a folder of several tasks.
    for extra in ("flctl run two-moons --method erm --epochs 5", "flctl run diabetes --method erm --epochs 3"):
        assert _run(tmp_path, extra).returncode == 0

    failures, took = [], []
    quick_start, *_ = readme_lines()
    for line in readme_lines():
        needs = [what for key, what in UNAVAILABLE.items() if key in line]
        worked = False
        for form in forms(line):
            trains = form.startswith("flctl sweep ") and "--dry-run" not in form and "--spec" not in form
            command = re.sub(r"--tune \d+", "--tune 3", form + " --epochs 5 --workers 1") if trains else form
            if form.startswith("flctl run ") and "--epochs" not in form and line != quick_start:
                command = form + " --epochs 2"
            if form.startswith("flctl run fashion-mnist") and "--subset" not in form:
                command += " --subset 500"
            if re.search(r"\b(SWEEP|ID)\b", command):
                command = re.sub(r"\b(SWEEP|ID)\b", _newest_sweep(tmp_path), command)
            command = re.sub(r"\bT\b", "two-moons", command)
            command = re.sub(r"\bF\b", "table.out", command).replace("NAME", "figure")
            started = time.monotonic()
            out = _run(tmp_path, command, quick_start=line == quick_start)
            took.append((time.monotonic() - started, command))
            said = out.stdout + out.stderr
            if "Traceback" in said or out.returncode not in (0, 2):
                failures.append(f"{command}: exit {out.returncode}\n{said[-2000:]}")
            elif out.returncode == 2 and (len(out.stderr.strip().splitlines()) != 1
                                          or not out.stderr.startswith("error: ")):
                failures.append(f"{command}: exit 2 without a one-line error\n{out.stderr[-2000:]}")
            elif out.stdout and not out.stdout.endswith("\n"):
                failures.append(f"{command}: output does not end with a newline")
            worked |= out.returncode == 0
            if out.returncode == 0 and command.startswith("flctl sweep ") and "--dry-run" not in command:
                # a sweep without --wait returns while its workers train: wait as the README says
                watch = _run(tmp_path, f"flctl status {_newest_sweep(tmp_path)} --watch")
                assert watch.returncode == 0, watch.stderr
        if needs and worked:
            failures.append(f"{line}: needs {', '.join(needs)} but worked here")
        if not needs and not worked:
            failures.append(f"{line}: no form of it worked; the last said\n{said[-2000:]}")
    print("\n".join(f"{s:6.1f} s  {c}" for s, c in sorted(took, reverse=True)))
    assert not failures, "\n\n".join(failures)
    # what the README says its lines leave behind
    assert (tmp_path / "runs.csv").read_text().startswith("run,task,method,seed,")
    assert (tmp_path / "results" / "reports" / "figure.png").is_file()
    assert list(itertools.islice((tmp_path / "results" / "records").iterdir(), 1))
