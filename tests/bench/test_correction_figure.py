"""Figure 17 (off-policy correction against a mismatched sampler) runs: every variant trains on a
sampler whose mismatch its metrics show, and the corrections make their forward call."""

from __future__ import annotations

import pytest

from searchr1.bench.correction import VARIANTS, correction_figure


@pytest.mark.slow  # six short learning runs (seconds)
def test_the_quick_figure_runs_every_correction_on_a_mismatched_sampler(tokenizer):
    figure = correction_figure(tokenizer, quick=True)
    values = {measure.key: measure.value for measure in figure.measures}
    assert values["mismatch_k3"] > 0  # the fault is on
    for name, (correction, _) in VARIANTS.items():
        assert values[f"steps_{name}"] > 0
        if correction != "none":
            assert values[f"measured_{name}"] > 0  # the forward call measured the mismatch
    assert any("not the model" in note for note in figure.notes)
