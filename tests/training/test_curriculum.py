"""The curriculum's draw: frequencies that follow the weights, distinct questions, weights from the
outcomes the schedule allows, and a record a resumed run replays."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from searchr1.core.types import SearchExample
from searchr1.training.curriculum import (Curriculum, CurriculumRecord, draw_weights, group_outcomes,
                                          weighted_draw)

DRAWS = 4000


def examples(count: int) -> list[SearchExample]:
    return [SearchExample(f"q{i}", f"question {i}?", ("a",), "nq") for i in range(count)]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0.05, 1.0), min_size=2, max_size=6), st.integers(0, 2**31 - 1))
def test_single_draws_follow_the_weights(weights, seed):
    """Each question's share of DRAWS one-question draws (one per batch index) lies within five
    binomial standard deviations of its weight's share."""
    w = np.array(weights)
    counts = np.zeros(len(w))
    for batch in range(DRAWS):
        counts[weighted_draw(w, 1, seed, batch)[0]] += 1
    expected = w / w.sum()
    for count, share in zip(counts, expected):
        sigma = math.sqrt(DRAWS * share * (1 - share))
        assert abs(count - DRAWS * share) <= 5 * sigma + 1, (counts / DRAWS, expected)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=12), st.integers(1, 16), st.integers(0, 10**6))
@example([1.0, 1.0, 5e-324], 3, 0)  # a weight whose share of the sum rounds to 0 (found by hypothesis)
@example([1.0, 5e-324, 0.0], 2, 0)  # and it still comes before a zero weight
def test_a_batch_holds_distinct_questions_and_as_many_as_it_can(weights, size, batch):
    """Weights of zero come last: a batch holds min(size, n) distinct indices, every positive-weight
    question before any zero-weight one."""
    w = np.array(weights)
    chosen = weighted_draw(w, size, 7, batch)
    assert len(chosen) == len(set(chosen)) == min(size, len(w))
    positive = int((w > 0).sum())
    assert all(w[i] > 0 for i in chosen[:min(size, positive)])


def test_weights_are_one_minus_success_above_the_floor_and_never_all_zero():
    assert draw_weights([0.0, 0.25, 1.0], 0.05).tolist() == [1.0, 0.75, 0.05]
    assert draw_weights([1.0, 1.0], 0.0).tolist() == [1.0, 1.0]  # all solved, no floor: uniform


def test_the_success_rate_is_the_latest_group_and_lags_by_the_off_policy_window():
    curriculum = Curriculum(examples(3), {"q1": 0.5}, seed=1, floor=0.0, questions_per_batch=2, lag=1)
    assert curriculum.weights_for(0).tolist() == [1.0, 0.5, 1.0]
    curriculum.record(0, {"q0": (8, 8), "q1": (2, 8)})
    assert curriculum.weights_for(1).tolist() == [1.0, 0.5, 1.0]  # batch 1 rolls out before step 0 ends
    assert curriculum.weights_for(2).tolist() == [0.0, 0.75, 1.0]
    curriculum.record(1, {"q0": (0, 8)})
    assert curriculum.weights_for(3).tolist() == [1.0, 0.75, 1.0]  # the latest group, not the mean
    assert curriculum.weights_for(2).tolist() == [0.0, 0.75, 1.0]  # asked again out of order: the same
    with pytest.raises(RuntimeError, match="before the outcomes of batch 2"):
        curriculum.weights_for(4)


def test_the_same_seed_and_outcomes_draw_the_same_batches():
    def draws() -> list[list[str]]:
        curriculum = Curriculum(examples(10), {}, seed=3, floor=0.05, questions_per_batch=4, lag=0)
        out = []
        for batch in range(5):
            chosen = curriculum.batch(batch)
            out.append([e.id for e in chosen])
            curriculum.record(batch, {e.id: (batch % 3, 4) for e in chosen})
        return out

    assert draws() == draws()


def test_the_record_replays_the_steps_before_a_resume_and_forgets_the_rest(tmp_path):
    record = CurriculumRecord.of_run(tmp_path)
    for step in range(4):
        record.append(step, {"q0": (step, 4)})
    with record.path.open("a") as file:
        file.write('{"step": 4, "outc')  # torn by a kill
    assert record.read_before(2) == {0: {"q0": (0, 4)}, 1: {"q0": (1, 4)}}
    assert [json.loads(line)["step"] for line in record.path.read_text().splitlines()] == [0, 1]


def test_group_outcomes_count_exact_matches_and_leave_out_failed_attempts():
    from searchr1.core.types import FORMAT_PENALTY, RewardResult, Termination, Trajectory

    def trajectory(question: str, right: bool, sampler_error: bool = False) -> Trajectory:
        t = Trajectory(SearchExample(question, "?", ("a",), "nq"), 0, 0, messages=[])
        t.finish(Termination.SAMPLER_ERROR if sampler_error else Termination.ANSWER)
        t.reward_result = RewardResult(1.0 if right else FORMAT_PENALTY, True, right, "a")
        return t

    outcomes = group_outcomes([trajectory("a", True), trajectory("a", False), trajectory("b", True, True)])
    assert outcomes == {"a": (1, 2)}
