"""A judge's verdict as a reward term (``--judge-weight W``, core/shaping.py): an answer's score
becomes ``(1 - W) * rule + W * judge``; a judge that failed is an environment failure whose group
is left out, never a reward."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from training_strategies import plain_trajectory

from searchr1.core.advantage import ADVANTAGE_MODES, assign_group_advantages
from searchr1.core.datum import build_training_datums, sends_datum
from searchr1.core.shaping import assign_judge_rewards
from searchr1.core.types import Exclusion, Verdict

rules = st.sampled_from([0.0, 1.0, 0.5, 2 / 3, 0.25])  # what a valid answer scores (em, cover_em, f1)
weights = st.floats(0.0, 1.0, allow_nan=False)
verdicts = st.sampled_from(["yes", "no", "failed", "not asked"])


def judged(question: int, sample: int, rule: float, verdict: str):
    trajectory = plain_trajectory(question, sample, rule)
    if verdict != "not asked":
        trajectory.verdict = (Verdict(False, error="the judge answered HTTP 503") if verdict == "failed"
                              else Verdict(verdict == "yes"))
    return trajectory


@given(st.lists(st.tuples(rules, verdicts), min_size=1, max_size=12))
def test_at_weight_zero_every_reward_is_the_rule_exactly(samples):
    trajectories = [judged(0, i, rule, verdict) for i, (rule, verdict) in enumerate(samples)]
    assign_judge_rewards(trajectories, 0.0)
    assert [t.reward for t in trajectories] == [rule for rule, _ in samples]


@given(st.lists(st.tuples(rules, st.sampled_from(["yes", "no"])), min_size=1, max_size=12))
def test_at_weight_one_every_judged_reward_is_the_verdict_exactly(samples):
    trajectories = [judged(0, i, rule, verdict) for i, (rule, verdict) in enumerate(samples)]
    assign_judge_rewards(trajectories, 1.0)
    assert [t.reward for t in trajectories] == [1.0 if verdict == "yes" else 0.0 for _, verdict in samples]


@given(rules, st.booleans(), weights)
def test_the_reward_is_the_weighted_mix_and_lies_between_rule_and_verdict(rule, correct, weight):
    trajectory = judged(0, 0, rule, "yes" if correct else "no")
    assign_judge_rewards([trajectory], weight)
    assert trajectory.reward == pytest.approx((1 - weight) * rule + weight * float(correct))
    assert min(rule, float(correct)) - 1e-12 <= trajectory.reward <= max(rule, float(correct)) + 1e-12
    assert trajectory.score.exact_match == (rule == 1.0)  # the rule's own scores are kept


def test_the_metrics_count_verdicts_disagreements_and_failures():
    trajectories = [judged(0, 0, 1.0, "yes"), judged(0, 1, 0.0, "yes"), judged(0, 2, 1.0, "no"),
                    judged(0, 3, 0.0, "no"), judged(0, 4, 0.0, "failed"), judged(0, 5, -0.1, "not asked")]
    metrics = assign_judge_rewards(trajectories, 0.5)
    assert metrics == {"reward/judge": 2 / 4, "reward/judge_disagrees": 2 / 4, "reward/judge_failed": 1 / 5}
    assert trajectories[4].reward == 0.0 and trajectories[5].reward == -0.1  # neither mixed
    assert trajectories[4].env_error and not trajectories[5].env_error
    assert assign_judge_rewards([], 0.5) == {"reward/judge": 0.0, "reward/judge_disagrees": 0.0,
                                             "reward/judge_failed": 0.0}


@given(st.lists(st.lists(st.tuples(rules, verdicts), min_size=2, max_size=6), min_size=1, max_size=5),
       weights, st.sampled_from(ADVANTAGE_MODES), st.booleans())
def test_a_judges_failure_never_becomes_a_reward(groups, weight, mode, keep_env_failures):
    """Invariant: whatever the pattern of verdicts and failures, the weight, the advantage mode and
    --keep-env-failures, a trajectory the judge failed on, and every sibling measured against it,
    carries no advantage and sends no datum; its group counts as an environment failure."""
    trajectories = [judged(q, i, rule, verdict) for q, group in enumerate(groups)
                    for i, (rule, verdict) in enumerate(group)]
    assign_judge_rewards(trajectories, weight)
    summary = assign_group_advantages(trajectories, mode=mode, keep_env_failures=keep_env_failures)
    failed_groups = {t.question_index for t in trajectories if t.judge_failed}
    for trajectory in trajectories:
        if trajectory.question_index in failed_groups:
            assert trajectory.excluded == Exclusion.ENV_FAILURE_GROUP
            assert trajectory.advantage == 0.0 and all(turn.advantage == 0.0 for turn in trajectory.turns)
            assert not sends_datum(trajectory)
    assert summary.env_failure == len(failed_groups)
    outside = [t for t in trajectories if t.question_index not in failed_groups]
    assert len(build_training_datums(trajectories)) == len(build_training_datums(outside))
