"""Figure 16 (full against fold on the long-horizon world) runs and holds its own bounds: no turn's
context exceeds the window, a full trajectory is one context (folding itself is tested in
tests/core/test_context.py; the quick run is too short for the policy to reach a fold)."""

from __future__ import annotations

import pytest

from searchr1.bench.long_horizon import WINDOW, long_horizon_figure


@pytest.mark.slow  # four short learning runs (seconds)
def test_the_quick_figure_keeps_every_context_within_the_window(tokenizer):
    figure = long_horizon_figure(tokenizer, quick=True)
    values = {measure.key: measure.value for measure in figure.measures}
    assert 0 < values["longest_full"] <= WINDOW and 0 < values["longest_fold"] <= WINDOW
    assert values["contexts_full"] == 1.0 and values["contexts_fold"] >= 1.0
    assert values["full_reached"] == 0  # two long steps from a barely trained policy reach nothing
    assert any("not the model" in note for note in figure.notes)
