"""Which trajectories of a step are kept for reading, what a kept record holds, and how the run
directory's transcripts.jsonl is written and read back (crash and resume included)."""

from __future__ import annotations

import asyncio
import copy
import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from searchr1.core.types import RewardResult, SearchExample, SearchItem, SearchResult, Trajectory
from searchr1.core.rollout import RolloutConfig, rollout_batch_async
from searchr1.search.tool import with_search
from searchr1.offline import SCENARIO
from searchr1.twin.scripted_search import ScriptedSearch
from searchr1.wiring.services import scripted_sampling_client
from searchr1.twin.scenario import load_scenario
from searchr1.view.terminal import outcome
from searchr1.evaluation.transcripts import (
    TRANSCRIPTS_FILE,
    append_transcripts,
    is_run_transcript_file,
    read_run_transcripts,
    select_transcripts,
    transcript_record,
)

REWARDS = (-0.1, 0.0, 1.0)


def make(question: int, sample: int, reward: float) -> Trajectory:
    example = SearchExample(f"nq/q{question}", f"question {question}?", ("a",), "nq")
    return Trajectory(example, question, sample, messages=[], reward_result=RewardResult(reward, reward >= 0, reward == 1.0, None))


@st.composite
def steps(draw):
    questions = draw(st.integers(1, 6))
    group = draw(st.integers(1, 8))
    return [make(q, g, draw(st.sampled_from(REWARDS))) for q in range(questions) for g in range(group)]


def positions(trajectories):
    return [(t.question_index, t.group_index) for t in trajectories]


# --- selection ---------------------------------------------------------------------------------


@given(steps(), st.integers(0, 12))
def test_selection_holds_min_of_count_and_size_distinct_trajectories_of_the_step(trajectories, count):
    chosen = select_transcripts(trajectories, count)
    assert len(chosen) == min(count, len(trajectories))
    assert len({id(t) for t in chosen}) == len(chosen)
    assert all(any(t is c for t in trajectories) for c in chosen)
    assert positions(chosen) == sorted(positions(chosen))


@given(steps(), st.integers(0, 12), st.randoms(use_true_random=False))
def test_selection_does_not_depend_on_the_order_trajectories_arrive_in(trajectories, count, rng):
    shuffled = list(trajectories)
    rng.shuffle(shuffled)
    assert positions(select_transcripts(shuffled, count)) == positions(select_transcripts(trajectories, count))


@given(steps(), st.integers(1, 12))
def test_selection_shows_as_many_different_rewards_as_the_count_allows(trajectories, count):
    chosen = select_transcripts(trajectories, count)
    assert len({t.reward for t in chosen}) == min(count, len({t.reward for t in trajectories}))


@given(st.integers(1, 6), st.integers(1, 8), st.integers(1, 12), st.sampled_from(REWARDS))
def test_selection_spans_as_many_questions_as_the_count_allows_when_rewards_are_equal(questions, group, count, reward):
    trajectories = [make(q, g, reward) for q in range(questions) for g in range(group)]
    chosen = select_transcripts(trajectories, count)
    assert len({t.question_index for t in chosen}) == min(count, questions)


def test_selection_prefers_a_new_question_for_each_new_reward():
    # question 0 has every reward; question 1 only 0.0; question 2 only -0.1
    trajectories = [make(0, 0, 1.0), make(0, 1, 0.0), make(0, 2, -0.1), make(1, 0, 0.0), make(2, 0, -0.1)]
    chosen = select_transcripts(trajectories, 3)
    assert positions(chosen) == [(0, 0), (1, 0), (2, 0)]
    assert sorted(t.reward for t in chosen) == [-0.1, 0.0, 1.0]


def test_a_negative_count_is_refused():
    with pytest.raises(ValueError, match="count must be >= 0"):
        select_transcripts([make(0, 0, 1.0)], -1)


# --- records from a real rollout ------------------------------------------------------------------


@pytest.fixture(scope="module")
def rolled_out(tokenizer):
    """One step of the shipped offline scenario's scripted policy through the real engine (every
    query finds the same passage: only the shape of the records matters here)."""
    scenario = load_scenario(SCENARIO)
    passage = SearchItem("Passage", "Some evidence about the question.", "Wikipedia", "https://w/Passage")
    search = ScriptedSearch({}, default=SearchResult(True, (passage,)))
    with scripted_sampling_client(scenario, tokenizer) as sampler:
        return asyncio.run(rollout_batch_async(
            sampler, tokenizer, with_search(search), scenario.examples[:4],
            RolloutConfig(group_size=8, sample_retry_backoff=0.0), step=5,
        ))


def test_a_record_keeps_every_turn_search_and_the_training_fields(rolled_out):
    searched = next(t for t in rolled_out if t.calls)
    record = transcript_record(searched, 5)
    json.dumps(record, allow_nan=False)  # plain JSON
    assert record["step"] == 5
    assert record["id"] == searched.example.id
    assert record["question_index"] == searched.question_index
    assert record["group_index"] == searched.group_index
    assert record["advantage"] == searched.advantage
    assert record["reward"] == searched.reward
    assert record["termination"] == searched.termination
    assert [t["text"] for t in record["turns"]] == [t.text for t in searched.turns]
    assert [s["query"] for s in record["searches"]] == [s.query for s in searched.calls]
    assert [s["observation"] for s in record["searches"]] == [s.observation for s in searched.calls]


def test_a_record_keeps_the_advantage_and_the_sampler_of_each_turn(rolled_out):
    """What each turn's tokens were trained with, turn by turn, even where turns differ."""
    trajectory = copy.deepcopy(next(t for t in rolled_out if len(t.turns) >= 2))
    trajectory.credit(0.25)
    trajectory.turns[1].advantage, trajectory.turns[1].sampler = -0.5, 3
    record = transcript_record(trajectory, 5)
    assert [(t["advantage"], t["sampler"]) for t in record["turns"]] == (
        [(0.25, 0), (-0.5, 3)] + [(0.25, 0)] * (len(trajectory.turns) - 2))
    assert record["advantage"] == 0.25  # the trajectory's own, group-relative
    assert ("turn advantages", " ".join(["+0.250", "-0.500"] + ["+0.250"] * (len(trajectory.turns) - 2))) in (
        outcome(record))
    trajectory.credit(0.25)
    assert "turn advantages" not in dict(outcome(transcript_record(trajectory, 5)))  # shown only where they differ


def test_appended_steps_read_back_as_written(rolled_out, tmp_path):
    written = {}
    for step in (0, 1, 2):
        records = [transcript_record(t, step) for t in select_transcripts(rolled_out, 4)]
        append_transcripts(tmp_path, step, records)
        written[step] = records
    path = tmp_path / TRANSCRIPTS_FILE
    assert is_run_transcript_file(path)
    found = read_run_transcripts(path)
    assert found.steps == [0, 1, 2]
    assert {step: [{k: v for k, v in r.items() if k != "block"} for r in records]
            for step, records in found.by_step.items()} == written
    assert found.torn_lines == []


def test_a_step_repeated_after_a_resume_keeps_only_its_last_block(tmp_path):
    first = [{"id": "a", "reward": 1.0}, {"id": "b", "reward": 0.0}]
    again = [{"id": "c", "reward": -0.1}]
    append_transcripts(tmp_path, 0, first)
    append_transcripts(tmp_path, 1, first)
    append_transcripts(tmp_path, 1, again)  # the resumed run ran step 1 again
    append_transcripts(tmp_path, 2, first)
    found = read_run_transcripts(tmp_path / TRANSCRIPTS_FILE)
    assert [r["id"] for r in found.by_step[1]] == ["c"]
    assert [r["id"] for r in found.by_step[0]] == [r["id"] for r in found.by_step[2]] == ["a", "b"]


def test_a_line_torn_by_a_crash_is_skipped_and_named(tmp_path):
    append_transcripts(tmp_path, 0, [{"id": "a"}, {"id": "b"}])
    path = tmp_path / TRANSCRIPTS_FILE
    with open(path, "a", encoding="utf-8") as stream:
        stream.write('{"id": "c", "step": 1, "turns": [{"te')  # the process died mid-write
    found = read_run_transcripts(path)
    assert found.steps == [0]
    assert found.torn_lines == [3]


def test_the_step_argument_wins_over_a_step_inside_a_record(tmp_path):
    append_transcripts(tmp_path, 7, [{"id": "a", "step": 3}])
    assert read_run_transcripts(tmp_path / TRANSCRIPTS_FILE).steps == [7]


def test_nothing_is_written_for_a_step_without_records(tmp_path):
    append_transcripts(tmp_path, 0, [])
    assert not (tmp_path / TRANSCRIPTS_FILE).exists()


def test_an_eval_file_is_not_taken_for_run_transcripts(tmp_path):
    path = tmp_path / "eval.jsonl"
    path.write_text(json.dumps({"type": "eval_config", "config": {}}) + "\n" + json.dumps({"type": "trajectory"}) + "\n")
    assert not is_run_transcript_file(path)


def test_selection_over_a_real_step_mixes_rewards_and_questions(rolled_out):
    chosen = select_transcripts(rolled_out, 4)
    assert len({t.reward for t in chosen}) == min(4, len({t.reward for t in rolled_out}))
    assert len({t.question_index for t in chosen}) >= 2
    shuffled = list(rolled_out)
    random.Random(0).shuffle(shuffled)
    assert positions(select_transcripts(shuffled, 4)) == positions(chosen)
