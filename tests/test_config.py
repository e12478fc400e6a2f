"""RunConfig's field metadata is the one source of the command-line options, sweep axes and study parameters."""

from __future__ import annotations

import dataclasses

import pytest
import typer

from flctl.axes import AXES
from flctl.cli import app
from flctl.config import FIELDS, NOT_IDENTITY, RunConfig
from flctl.study import PARAM_FIELDS
from tests.helpers import config

pytestmark = pytest.mark.notorch


def test_every_identity_field_is_an_option_an_axis_a_plan_column_and_a_study_parameter() -> None:
    # One declaration (RunConfig's field metadata) feeds all four; a field added there shows up everywhere.
    commands = typer.main.get_command(app).commands
    options = {name: {p.name for p in commands[name].params} for name in ("run", "sweep")}
    identity = {f.name for f in dataclasses.fields(RunConfig)} - NOT_IDENTITY - {"task", "options"}
    assert identity and identity <= set(FIELDS)
    for name in identity:
        assert name in options["run"] and name in options["sweep"], name
        assert name in AXES and name in PARAM_FIELDS, name
    assert {"option", "p_min"} <= options["run"] & options["sweep"]          # options and p_min, by hand
    assert {"device", "data_dir"} <= options["run"] & options["sweep"]      # where, not what: options, not axes
    assert not {"device", "data_dir"} & set(AXES)


@pytest.mark.parametrize("task,lr", [("cifar10", 0.1), ("utkface", 1e-4)])
def test_cserm_takes_a_tenth_of_the_primal_step_on_cifar10_and_utkface(task: str, lr: float) -> None:
    # paper, primal hyper-parameters table: CSERM uses lr/10 on these two tasks; the run's config records it,
    # and a given --lr is taken as given.
    assert config(task, "erm").lr == config(task, "fl").lr == lr
    assert config(task, "cserm").lr == pytest.approx(lr / 10)
    assert config(task, "cserm", lr=0.5).lr == 0.5
    assert config("two-moons", "cserm").lr == config("two-moons", "erm").lr      # other tasks: one lr for all
