"""Figure 15 (thinking off and on) runs, and thinking costs what the twin's reasoning adds: every
turn of a thinking run writes its reasoning, so a trajectory samples more tokens."""

from __future__ import annotations

import pytest

from searchr1.bench.thinking import thinking_figure


@pytest.mark.slow  # two short learning runs (seconds)
def test_the_quick_figure_measures_what_reasoning_costs(tokenizer):
    figure = thinking_figure(tokenizer, quick=True)
    values = {measure.key: measure.value for measure in figure.measures}
    assert values["sampled_on"] > values["sampled_off"] > 0 and values["sampled_ratio"] > 1
    assert values["trained_on"] > values["trained_off"] > 0
    assert any("not the model" in note for note in figure.notes)
