"""Figure 18 (which questions to train on) runs: the filtered curriculum never spends its batch on
a guessable question, uniform sampling does, and each step's policy is evaluated."""

from __future__ import annotations

import pytest

from searchr1.bench.curriculum import curriculum_figure


@pytest.mark.slow  # two short learning runs, each evaluated after every step (seconds)
def test_the_quick_figure_runs_both_variants_and_evaluates_every_step(tokenizer):
    figure = curriculum_figure(tokenizer, quick=True)
    values = {measure.key: measure.value for measure in figure.measures}
    assert values["guessable_curriculum"] == 0.0  # every question the probe found guessable was dropped
    assert values["guessable_uniform"] > 0.0  # the data's order brings them in
    curves = figure.details["curves"]
    assert isinstance(curves, dict) and all(len(curve) == figure.details["steps"] for runs in curves.values()
                                            for curve in runs)
    assert any("not the model" in note for note in figure.notes)
