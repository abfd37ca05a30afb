"""Credit per turn (core/credit.py): GiGPO's step groups and the evidence step rewards, as
properties over batches whose calls come from a small alphabet, so states recur."""

from __future__ import annotations

import copy
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchr1.core.advantage import assign_group_advantages
from searchr1.core.config import StepConfig
from searchr1.core.credit import anchor_state, assign_step_advantages, assign_step_rewards, discounted_returns
from searchr1.core.settings import SettingError
from searchr1.core.types import (NOT_ANSWERED, CallRecord, RewardResult, SearchExample, Termination, Trajectory,
                                 Turn)

EXAMPLE = SearchExample("q", "Which city is the capital of France?", ("Paris",), "nq")
# the answer shows in the first observation only; two queries differ only in case and spacing
QUERIES = ("paris", "  Paris ", "france capital", "eiffel tower")
OBSERVATIONS = ("[1] Paris is the capital of France.", "Search returned no results.", "[1] The tower is 330 m.")
REWARDS = (RewardResult(1.0, True, True, "Paris"), RewardResult(0.0, True, False, "Lyon"), NOT_ANSWERED)

calls = st.builds(lambda query, ok, observation, refused: CallRecord(query, ok, observation, tool="search",
                                                                      refused=refused),
                  st.sampled_from(QUERIES), st.booleans(), st.sampled_from(OBSERVATIONS),
                  st.sampled_from([False, False, False, True]))  # now and then a refused call


@st.composite
def trajectories(draw, question: int, sample: int) -> Trajectory:
    turns = []
    count = draw(st.integers(1, 4))
    for index in range(count):
        made = draw(st.lists(calls, min_size=1, max_size=2)) if index < count - 1 else []  # a turn goes on by a call
        turns.append(Turn([1, 2], [3], [-0.5], "text", calls=made))
    trajectory = Trajectory(EXAMPLE, question, sample, [], turns, termination=Termination.ANSWER)
    trajectory.reward_result = draw(st.sampled_from(REWARDS))
    return trajectory


@st.composite
def batches(draw) -> list[Trajectory]:
    group = draw(st.integers(2, 4))
    return [draw(trajectories(q, g)) for q in range(draw(st.integers(1, 3))) for g in range(group)]


modes = st.sampled_from(["mean", "zscore", "rloo", "none"])


def credited(batch: list[Trajectory], mode: str = "mean", weight: float = 1.0, discount: float = 0.9,
             **options) -> list[Trajectory]:
    batch = copy.deepcopy(batch)
    assign_group_advantages(batch, mode=mode)
    assign_step_advantages(batch, mode=mode, weight=weight, discount=discount, **options)
    return batch


def turn_credit(batch: list[Trajectory]) -> list[tuple[float, int]]:
    return [(turn.advantage, turn.step_group) for t in batch for turn in t.turns]


@settings(max_examples=60, deadline=None)
@given(batch=batches(), mode=modes)
def test_step_groups_never_cross_questions(batch, mode):
    """Invariant: crediting a batch gives every turn what crediting its question alone gives it."""
    alone = [turn for q in sorted({t.question_index for t in batch})
             for turn in turn_credit(credited([t for t in batch if t.question_index == q], mode))]
    assert turn_credit(credited(batch, mode)) == alone


@settings(max_examples=60, deadline=None)
@given(batch=batches(), mode=modes, weight=st.floats(0.0, 4.0))
def test_with_every_state_distinct_gigpo_is_trajectory_credit(batch, mode, weight):
    """Invariant: when no two turns start from the same state, every turn carries exactly its
    trajectory's advantage (a step group of one adds nothing)."""
    batch = credited(batch, mode, weight, anchor=lambda t, turn: (t.question_index, t.group_index, turn))
    assert all(turn.advantage == t.advantage and turn.step_group == 1
               for t in batch if t.excluded is None for turn in t.turns)


@settings(max_examples=80, deadline=None)
@given(batch=batches(), weight=st.floats(0.1, 4.0), discount=st.floats(0.0, 1.0))
def test_the_step_advantages_of_a_step_group_sum_to_zero_under_mean(batch, weight, discount):
    batch = credited(batch, "mean", weight, discount)
    groups: dict[tuple, list[float]] = {}
    for t in batch:
        for index, turn in enumerate(t.turns):
            if t.excluded is None:
                groups.setdefault((t.question_index, anchor_state(t, index)), []).append(
                    (turn.advantage - t.advantage) / weight)
    assert groups or all(t.excluded for t in batch)
    for steps in groups.values():
        assert math.fsum(steps) == pytest.approx(0.0, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(batch=batches(), mode=modes)
def test_a_group_that_trains_on_nothing_gets_no_step_credit_and_first_turns_share_a_group(batch, mode):
    batch = credited(batch, mode)
    for q in {t.question_index for t in batch}:
        group = [t for t in batch if t.question_index == q]
        if group[0].excluded is not None:  # degenerate: every reward of the group is equal
            assert all(turn.advantage == 0.0 and turn.step_group == 0 for t in group for turn in t.turns)
        else:
            assert all(t.turns[0].step_group == len(group) for t in group)


def test_a_turn_that_starts_from_another_state_is_measured_only_among_its_own():
    """Two trajectories that searched the same thing share their second turn's group; one that
    searched something else stands alone there, and its second turn carries its own advantage."""
    def trajectory(sample, query, reward):
        first = Turn([1], [2], [-0.1], "a", calls=[CallRecord(query, True, OBSERVATIONS[2], tool="search")])
        t = Trajectory(EXAMPLE, 0, sample, [], [first, Turn([1], [2], [-0.1], "b")], termination=Termination.ANSWER)
        t.reward_result = REWARDS[0] if reward else REWARDS[1]
        return t
    batch = credited([trajectory(0, "eiffel", True), trajectory(1, "Eiffel ", False), trajectory(2, "paris", True)],
                     weight=1.0, discount=1.0)
    assert [[turn.step_group for turn in t.turns] for t in batch] == [[3, 2], [3, 2], [3, 1]]
    a, b, c = (t.advantage for t in batch)
    assert [turn.advantage for turn in batch[2].turns] == [c + (1.0 - 2 / 3), c]
    assert [t.turns[1].advantage for t in batch[:2]] == [a + 0.5, b - 0.5]


@settings(max_examples=60, deadline=None)
@given(batch=batches(), discount=st.floats(0.0, 1.0))
def test_without_step_rewards_a_turns_return_is_the_reward_discounted_from_the_last_turn(batch, discount):
    for t in batch:
        last = len(t.turns) - 1
        assert discounted_returns(t, discount) == pytest.approx(
            [t.reward * discount ** (last - index) for index in range(len(t.turns))])


@settings(max_examples=80, deadline=None)
@given(batch=batches(), bonus=st.floats(0.0, 1.0), penalty=st.floats(0.0, 1.0))
def test_step_rewards_pay_the_first_sight_of_the_answer_and_charge_each_repeated_call(batch, bonus, penalty):
    assign_step_rewards(batch, evidence_bonus=bonus, repeat_penalty=penalty)
    for t in batch:
        ran = [(index, c) for index, turn in enumerate(t.turns) for c in turn.calls if not c.refused]
        keys = [" ".join(c.query.lower().split()) for _, c in ran]
        repeats = len(keys) - len(set(keys))
        sights = [index for index, c in ran if c.ok and "paris" in c.observation.lower()]
        assert math.fsum(turn.reward for turn in t.turns) == pytest.approx(bonus * bool(sights) - penalty * repeats)
        if sights and penalty == 0.0:
            assert [turn.reward for turn in t.turns] == [bonus if i == sights[0] else 0.0 for i in range(len(t.turns))]


def test_step_rewards_without_gigpo_are_refused_in_one_line():
    with pytest.raises(SettingError, match=r"^--step-reward evidence: a step reward moves .* add --credit gigpo$"):
        StepConfig(step_reward="evidence")
    assert StepConfig(step_reward="evidence", credit="gigpo").step_reward == "evidence"
