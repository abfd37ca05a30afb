"""Figure 19 (partial rollouts against the bounded overlap) runs: every variant trains its timed
steps, no makespan beats the training queue's bound, and both learning variants are counted."""

from __future__ import annotations

import pytest

from searchr1.bench.partial_rollouts import QUICK_STEPS, VARIANTS, partial_rollouts_figure


@pytest.mark.slow  # three short served runs and two learning runs (seconds)
def test_the_quick_figure_runs_every_variant_and_no_makespan_beats_its_bound(tokenizer):
    figure = partial_rollouts_figure(tokenizer, quick=True)
    values = {measure.key: measure.value for measure in figure.measures}
    assert figure.number == 19 and figure.details["timed_steps"] == QUICK_STEPS
    for variant in VARIANTS:
        assert values[f"steps_per_hour_{variant}"] > 0
        assert values[f"makespan_over_bound_{variant}"] >= 1.0  # a step takes at least its training
    assert set(figure.details["reached"]) == {"bounded", "partial"}
    assert values["partial_over_bounded_throughput"] > 0 and values["partial_over_bounded_steps_to_reward"] > 0
