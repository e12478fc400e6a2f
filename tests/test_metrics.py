"""flctl.metrics on the losses a diverged model leaves (NaN, +inf): each summary a defined value, without numpy's
warnings."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from flctl.metrics import CVAR_Q, cvar, split_summary

pytestmark = pytest.mark.notorch


def test_cvar_is_the_mean_of_the_tail_at_or_above_the_quantile() -> None:
    losses = np.arange(1.0, 11.0)               # the 0.9-quantile is 9.1: only 10 is at or above it
    assert cvar(losses) == 10.0 and cvar(losses, 0.5) == 8.0


@pytest.mark.parametrize(("losses", "expected"), [
    ([0.1, 0.2, math.nan], math.nan),           # no order: undefined, as the mean is
    ([math.inf, math.nan, 0.3], math.nan),
    ([0.1] * 99 + [math.inf], math.inf),        # one inf in a hundred is in the top tenth, whatever its neighbours
    ([0.1, 0.2, math.inf], math.inf),
])
def test_cvar_of_a_diverged_models_losses_is_defined_and_warns_nothing(losses: list[float], expected: float) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # numpy's "Mean of empty slice", "invalid value encountered"
        got = cvar(np.array(losses))
        summary = split_summary(np.array(losses))
    assert got == expected or math.isnan(got) and math.isnan(expected), got
    assert summary[f"cvar_{CVAR_Q}"] == got or math.isnan(got) and math.isnan(summary[f"cvar_{CVAR_Q}"])
