"""Group advantages: isolation, degenerate detection on rewards, environment failures."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from training_strategies import fail_search, plain_trajectory

from searchr1.core.advantage import (
    ADVANTAGE_MODES,
    ZSCORE_EPSILON,
    assign_group_advantages,
    group_advantages,
    summarize_groups,
)
from searchr1.core.types import Exclusion

rewards = st.sampled_from([-0.1, 0.0, 1.0]) | st.floats(-3, 3, allow_nan=False)
groups = st.lists(st.lists(rewards, min_size=1, max_size=16), min_size=1, max_size=6)


def make(groups_of_rewards):
    return [
        plain_trajectory(q, g, reward)
        for q, group in enumerate(groups_of_rewards)
        for g, reward in enumerate(group)
    ]


def by_question(trajectories, question):
    return [t for t in trajectories if t.question_index == question]


@given(groups, st.data())
def test_group_isolation(reward_groups, data):
    """Changing any other group's rewards leaves a group's advantages unchanged."""
    first = make(reward_groups)
    assign_group_advantages(first)
    changed = [list(g) for g in reward_groups]
    keep = data.draw(st.integers(0, len(changed) - 1))
    for q in range(len(changed)):
        if q != keep:
            changed[q] = data.draw(st.lists(rewards, min_size=1, max_size=16))
    second = make(changed)
    assign_group_advantages(second)
    assert [t.advantage for t in by_question(first, keep)] == [
        t.advantage for t in by_question(second, keep)
    ]


@given(
    st.integers(1, 32),
    st.sampled_from([-0.1, 0.0, 1.0, 0.1, 0.3]) | st.floats(-1e6, 1e6, allow_nan=False),
)
def test_degenerate_detection_for_all_equal_groups_of_any_size_and_value(size, value):
    trajectories = make([[value] * size])
    assert assign_group_advantages(trajectories).degenerate == 1
    assert all(t.advantage == 0.0 and t.excluded == Exclusion.DEGENERATE_GROUP for t in trajectories)


@pytest.mark.parametrize("size", [3, 6, 7, 8, 16])
def test_minus_point_one_groups_are_degenerate_although_naive_centring_is_not_zero(size):
    # The lab port's bug, reproduced independently: mean-centred advantages are not exactly 0.
    naive = [-0.1 - sum([-0.1] * size) / size for _ in range(size)]
    assert any(a != 0.0 for a in naive)
    trajectories = make([[-0.1] * size, [0.0, 1.0]])
    assert assign_group_advantages(trajectories).degenerate == 1
    assert [t.advantage for t in by_question(trajectories, 0)] == [0.0] * size
    assert summarize_groups(trajectories).degenerate == 1


@given(groups)
def test_mean_mode_centres_each_non_degenerate_group(reward_groups):
    trajectories = make(reward_groups)
    degenerate = assign_group_advantages(trajectories).degenerate
    assert degenerate == sum(len(set(g)) == 1 for g in reward_groups)
    for q, group in enumerate(reward_groups):
        advantages = [t.advantage for t in by_question(trajectories, q)]
        if len(set(group)) > 1:
            expected = np.asarray(group) - np.mean(group)
            assert np.allclose(advantages, expected, rtol=1e-12, atol=1e-12)
            assert all(t.excluded is None for t in by_question(trajectories, q))


@given(st.lists(st.floats(-3, 3, allow_nan=False), min_size=2, max_size=16))
def test_zscore_mode_divides_by_sample_std_plus_epsilon(group):
    assume(len(set(group)) > 1)
    trajectories = make([group])
    assign_group_advantages(trajectories, mode="zscore")
    values = np.asarray(group)
    expected = (values - values.mean()) / (values.std(ddof=1) + ZSCORE_EPSILON)
    assert np.allclose([t.advantage for t in trajectories], expected, rtol=1e-9, atol=1e-9)


@given(st.lists(st.floats(-3, 3, allow_nan=False), min_size=2, max_size=16))
def test_none_mode_uses_raw_rewards_in_non_degenerate_groups(group):
    assume(len(set(group)) > 1)
    trajectories = make([group])
    assign_group_advantages(trajectories, mode="none")
    assert [t.advantage for t in trajectories] == group


def test_unknown_mode_is_rejected():
    expected = r"^unknown advantage mode 'rank'; expected one of \('mean', 'zscore', 'rloo', 'none'\)$"
    with pytest.raises(ValueError, match=expected):
        assign_group_advantages(make([[0.0, 1.0]]), mode="rank")
    with pytest.raises(ValueError, match=expected):
        group_advantages([0.0, 1.0], mode="rank")


@pytest.mark.parametrize("mode", ["zscore", "rloo"])
def test_a_mode_that_compares_with_the_others_needs_two_rewards(mode):
    with pytest.raises(ValueError, match=f"^{mode} advantages need at least two rewards$"):
        group_advantages([1.0], mode=mode)
    assert group_advantages([1.0], mode="mean") == [0.0] and group_advantages([1.0], mode="none") == [1.0]


@given(groups, st.data())
def test_a_group_with_an_env_failure_is_left_out_by_default(reward_groups, data):
    trajectories = make(reward_groups)
    failed_question = data.draw(st.integers(0, len(reward_groups) - 1))
    victim = data.draw(st.sampled_from(by_question(trajectories, failed_question)))
    if data.draw(st.booleans()):
        fail_search(victim)
    else:
        victim.termination = "sampler_error"
    degenerate = assign_group_advantages(trajectories).degenerate
    for t in by_question(trajectories, failed_question):
        assert t.advantage == 0.0 and t.excluded == Exclusion.ENV_FAILURE_GROUP
    others = [g for q, g in enumerate(reward_groups) if q != failed_question]
    assert degenerate == sum(len(set(g)) == 1 for g in others)
    summary = summarize_groups(trajectories)
    assert (summary.groups, summary.env_failure, summary.degenerate) == (
        len(reward_groups),
        1,
        degenerate,
    )
    assert summary.trained == len(reward_groups) - 1 - degenerate


def test_keep_env_failures_scores_search_errors_and_drops_sampler_errors():
    trajectories = make([[1.0, 0.0, -0.1, 0.5]])
    fail_search(trajectories[1])  # search failed: still scored
    trajectories[2].termination = "sampler_error"  # no real reward: not scored
    assign_group_advantages(trajectories, keep_env_failures=True)
    scored_mean = (1.0 + 0.0 + 0.5) / 3
    assert [t.advantage for t in trajectories] == pytest.approx(
        [1.0 - scored_mean, -scored_mean, 0.0, 0.5 - scored_mean]
    )
    assert [t.excluded for t in trajectories] == [None, None, Exclusion.SAMPLER_ERROR, None]
    assert summarize_groups(trajectories, keep_env_failures=True).env_failure == 0


def test_assignment_resets_previous_marks():
    trajectories = make([[0.0, 1.0]])
    for t in trajectories:
        t.excluded = Exclusion.DEGENERATE_GROUP
        t.credit(5.0)
    assign_group_advantages(trajectories)
    assert [t.excluded for t in trajectories] == [None, None]
    assert [t.advantage for t in trajectories] == [-0.5, 0.5]
    assert [turn.advantage for t in trajectories for turn in t.turns] == [-0.5, 0.5]


@given(groups, st.sampled_from(ADVANTAGE_MODES), st.booleans())
def test_every_turn_carries_its_trajectorys_advantage(reward_groups, mode, keep):
    """Trajectory-level credit: the advantage each turn's tokens carry is its trajectory's, 0 when the
    trajectory is left out."""
    trajectories = make(reward_groups)
    assign_group_advantages(trajectories, mode=mode, keep_env_failures=keep)
    for t in trajectories:
        assert t.turns and all(turn.advantage == t.advantage for turn in t.turns)
        assert t.excluded is None or t.advantage == 0.0


@given(groups)
def test_summarize_groups_is_pure_and_agrees_with_assignment(reward_groups):
    trajectories = make(reward_groups)
    before = [(t.advantage, t.excluded) for t in trajectories]
    summary = summarize_groups(trajectories)
    assert [(t.advantage, t.excluded) for t in trajectories] == before
    assert summary == assign_group_advantages(trajectories)
    assert summary.groups == len(reward_groups)
    assert not math.isnan(sum(t.advantage for t in trajectories))


# --- every mode (rloo included) -----------------------------------------------------------

MODES = ["mean", "zscore", "rloo", "none"]


@pytest.mark.parametrize("mode", MODES)
@given(groups, st.data())
def test_group_isolation_holds_in_every_mode(mode, reward_groups, data):
    first = make(reward_groups)
    assign_group_advantages(first, mode=mode)
    keep = data.draw(st.integers(0, len(reward_groups) - 1))
    changed = [list(g) if q == keep else data.draw(st.lists(rewards, min_size=1, max_size=16))
               for q, g in enumerate(reward_groups)]
    second = make(changed)
    assign_group_advantages(second, mode=mode)
    assert [t.advantage for t in by_question(first, keep)] == [t.advantage for t in by_question(second, keep)]


@pytest.mark.parametrize("mode", MODES)
@given(st.integers(1, 16), st.sampled_from([-0.1, 0.0, 1.0, 0.3]))
def test_degenerate_groups_get_exactly_zero_in_every_mode(mode, size, value):
    trajectories = make([[value] * size])
    assign_group_advantages(trajectories, mode=mode)
    assert all(t.advantage == 0.0 and t.excluded == Exclusion.DEGENERATE_GROUP for t in trajectories)


@pytest.mark.parametrize("mode", ["mean", "rloo"])
@given(st.lists(st.floats(-3, 3, allow_nan=False), min_size=2, max_size=16))
def test_mean_and_rloo_advantages_of_a_group_sum_to_zero(mode, group):
    assume(len(set(group)) > 1)
    trajectories = make([group])
    assign_group_advantages(trajectories, mode=mode)
    assert math.fsum(t.advantage for t in trajectories) == pytest.approx(0.0, abs=1e-9)


@given(st.lists(st.floats(-3, 3, allow_nan=False), min_size=2, max_size=16))
def test_rloo_is_the_reward_minus_the_mean_of_the_other_rewards(group):
    assume(len(set(group)) > 1)
    trajectories = make([group])
    assign_group_advantages(trajectories, mode="rloo")
    for i, trajectory in enumerate(trajectories):
        others = group[:i] + group[i + 1:]
        assert trajectory.advantage == pytest.approx(group[i] - sum(others) / len(others), abs=1e-9)


@given(st.lists(st.floats(-3, 3, allow_nan=False), min_size=2, max_size=16), st.floats(0.5, 20))
def test_zscore_advantages_do_not_change_when_rewards_are_scaled(group, scale):
    values = np.asarray(group)
    assume(values.std(ddof=1) > 0.05)  # far from the epsilon, which is not scale-free
    plain, scaled = make([group]), make([[scale * r for r in group]])
    assign_group_advantages(plain, mode="zscore")
    assign_group_advantages(scaled, mode="zscore")
    assert np.allclose([t.advantage for t in plain], [t.advantage for t in scaled], rtol=1e-4, atol=1e-5)


def test_by_default_a_group_with_a_failed_search_is_left_out():
    from searchr1.core.advantage import classified_groups, classify_group

    group = [plain_trajectory(0, g, reward) for g, reward in enumerate((0.0, 1.0))]
    fail_search(group[0])
    assert classify_group(group) == Exclusion.ENV_FAILURE_GROUP
    assert classified_groups(group) == [(0, group, Exclusion.ENV_FAILURE_GROUP)]
    assert classify_group(group, keep_env_failures=True) is None
