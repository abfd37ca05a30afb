"""Kimi k1.5's length reward (``--length-reward W``, core/shaping.py): lambda = 0.5 - (len - min) /
(max - min) within a question's samples; a right answer gets lambda, any other min(0, lambda)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from searchr1.core.shaping import assign_length_rewards, length_reward
from searchr1.core.types import RewardResult, SearchExample, Termination, Trajectory, Turn

lengths = st.integers(0, 4000)


def test_the_formula_at_its_edges():
    assert length_reward(10, 10, 50, right=True) == 0.5  # the shortest right answer
    assert length_reward(50, 10, 50, right=True) == -0.5  # the longest
    assert length_reward(30, 10, 50, right=True) == 0.0  # halfway
    assert length_reward(10, 10, 50, right=False) == 0.0  # a wrong answer never gains
    assert length_reward(50, 10, 50, right=False) == -0.5  # and the longest wrong one loses as much
    assert length_reward(20, 20, 20, right=True) == 0.0  # every sample equally long: no length signal


@given(st.lists(lengths, min_size=1, max_size=16), st.data())
def test_a_longer_sample_never_earns_more_and_a_wrong_one_never_gains(group, data):
    shortest, longest = min(group), max(group)
    terms = {length: length_reward(length, shortest, longest, right=True) for length in group}
    ordered = sorted(terms)
    assert all(terms[a] >= terms[b] for a, b in zip(ordered, ordered[1:]))
    assert all(-0.5 <= term <= 0.5 for term in terms.values())
    length = data.draw(st.sampled_from(group))
    wrong = length_reward(length, shortest, longest, right=False)
    assert wrong <= 0.0 and wrong == min(0.0, terms[length])


def _trajectory(question: int, generated: int, score: float, sampler_error: bool = False) -> Trajectory:
    trajectory = Trajectory(SearchExample(f"q{question}", "Q?", ("a",), "nq"), question, 0, [])
    trajectory.turns.append(Turn([1, 2], [7] * generated, [-0.1] * generated, "text"))
    trajectory.finish(Termination.SAMPLER_ERROR if sampler_error else Termination.ANSWER)
    if not sampler_error:
        trajectory.reward_result = RewardResult(score, True, score == 1.0, "a")
    return trajectory


def test_lengths_are_compared_within_each_questions_group_and_added_with_the_weight():
    group_a = [_trajectory(0, 10, 1.0), _trajectory(0, 30, 1.0), _trajectory(0, 20, 0.0)]
    group_b = [_trajectory(1, 100, 1.0), _trajectory(1, 100, 0.0)]  # equal lengths: no term
    failed = _trajectory(1, 5, 0.0, sampler_error=True)  # not scored: takes no part
    metrics = assign_length_rewards(group_a + group_b + [failed], weight=0.2)
    assert [t.reward for t in group_a] == pytest.approx([1.0 + 0.2 * 0.5, 1.0 - 0.2 * 0.5, 0.0])
    assert [t.reward for t in group_b] == pytest.approx([1.0, 0.0])
    assert failed.shaping == 0.0
    assert metrics["reward/length"] == pytest.approx((0.1 - 0.1 + 0 + 0 + 0) / 5)
    assign_length_rewards(group_a, weight=0.2)  # assigned again, not added twice
    assert group_a[0].reward == pytest.approx(1.1)


@pytest.mark.slow  # two short offline runs (seconds)
def test_a_run_with_the_length_reward_reports_it_and_one_without_does_not(tmp_path):
    import json

    from click.testing import CliRunner

    from searchr1.cli import main

    base = ["train", "--offline", "--quiet", "--max-steps", "2", "--questions-per-batch", "2", "--group-size", "4"]
    for name, extra in (("with", ["--length-reward", "0.2"]), ("without", [])):
        result = CliRunner().invoke(main, [*base, *extra, "--run-dir", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
    lines = {name: [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
             for name in ("with", "without")}
    assert all(-0.2 <= line["reward/length"] <= 0.2 for line in lines["with"])
    assert not any("reward/length" in line for line in lines["without"])


def test_the_overlong_penalty_at_its_edges():
    from searchr1.core.shaping import overlong_penalty

    assert overlong_penalty(7000, limit=8192, buffer=1024) == 0.0  # before the buffer
    assert overlong_penalty(8192 - 1024, limit=8192, buffer=1024) == 0.0  # where it starts
    assert overlong_penalty(8192 - 512, limit=8192, buffer=1024) == -0.5  # halfway into it
    assert overlong_penalty(8192, limit=8192, buffer=1024) == -1.0  # at the budget
    assert overlong_penalty(9000, limit=8192, buffer=1024) == -1.0  # never below -1


@given(lengths, lengths, st.integers(1, 2000))
def test_the_overlong_penalty_never_rewards_and_falls_with_length(a, b, buffer):
    from searchr1.core.shaping import overlong_penalty

    shorter, longer = sorted((a, b))
    assert 0.0 >= overlong_penalty(shorter, 4000, buffer) >= overlong_penalty(longer, 4000, buffer) >= -1.0


def test_the_overlong_penalty_reads_the_whole_length_and_adds_to_the_length_reward():
    from searchr1.core.shaping import assign_overlong_penalties
    from searchr1.core.config import StepConfig
    from searchr1.core.settings import SettingError

    near, far = _trajectory(0, 10, 1.0), _trajectory(0, 10, 1.0)
    near.whole_tokens, far.whole_tokens = 960, 500
    metrics = assign_overlong_penalties([near, far], limit=1000, buffer=100)
    assert (near.reward, far.reward) == pytest.approx((0.4, 1.0))
    assert metrics["reward/overlong"] == pytest.approx(-0.3)
    with pytest.raises(SettingError, match="--overlong-buffer"):
        StepConfig(overlong_buffer=9000)
