"""Hypothesis strategies for trajectories, with the expected datum layout recorded at
generation time (so tests never derive expectations from the code under test)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from searchr1.core.types import AssistantTurn, RewardResult, SearchExample, SearchRecord, Trajectory

VOCAB_SIZE = 248_077  # len() of the Qwen3.5 tokenizer
EXAMPLE = SearchExample(id="q", question="Who?", answers=("x",), data_source="nq")

token_ids = st.integers(min_value=0, max_value=VOCAB_SIZE - 1)
logprob_values = st.floats(-30.0, 0.0, allow_nan=False, allow_subnormal=False, width=32)
nonzero_advantages = st.floats(min_value=-4.0, max_value=4.0, allow_nan=False, allow_subnormal=False, width=32).filter(
    lambda a: a != 0.0
)


@dataclass
class Generated:
    trajectory: Trajectory
    tokens: list[int]  # the full unshifted sequence
    is_action: list[bool]  # per token of ``tokens``
    logprobs: list[float]  # per token: the sampler logprob on actions, else 0.0


@st.composite
def generated_trajectories(
    draw,
    *,
    question_index: int | None = None,
    group_index: int | None = None,
    advantage=nonzero_advantages,
    max_turns: int = 4,
    max_len: int = 12,
) -> Generated:
    prompt = draw(st.lists(token_ids, min_size=1, max_size=max_len))
    tokens = list(prompt)
    is_action = [False] * len(prompt)
    logprobs = [0.0] * len(prompt)
    turns = []
    n_turns = draw(st.integers(1, max_turns))
    for index in range(n_turns):
        if index > 0:
            observation = draw(st.lists(token_ids, max_size=max_len))
            tokens += observation
            is_action += [False] * len(observation)
            logprobs += [0.0] * len(observation)
        turn_prompt = list(tokens)
        completion = draw(st.lists(token_ids, min_size=1 if index == 0 else 0, max_size=max_len))
        lps = draw(st.lists(logprob_values, min_size=len(completion), max_size=len(completion)))
        tokens += completion
        is_action += [True] * len(completion)
        logprobs += lps
        turns.append(
            AssistantTurn(
                prompt_tokens=turn_prompt, completion_tokens=completion, logprobs=lps, text=""
            )
        )
    trajectory = Trajectory(
        example=EXAMPLE,
        question_index=draw(st.integers(0, 50)) if question_index is None else question_index,
        group_index=draw(st.integers(0, 15)) if group_index is None else group_index,
        messages=[],
        turns=turns,
        advantage=draw(advantage),
    )
    return Generated(trajectory, tokens, is_action, logprobs)


def fail_search(trajectory: Trajectory) -> None:
    """Record a failed search: what makes a trajectory an environment failure."""
    trajectory.searches.append(SearchRecord("q", ok=False, observation="Search error: timeout", error="timeout"))


def plain_trajectory(question_index: int, group_index: int, reward: float, **flags) -> Trajectory:
    """A one-turn trajectory for advantage tests."""
    trajectory = Trajectory(
        example=EXAMPLE,
        question_index=question_index,
        group_index=group_index,
        messages=[],
        turns=[
            AssistantTurn(
                prompt_tokens=[1, 2, 3], completion_tokens=[4, 5], logprobs=[-1.0, -2.0], text=""
            )
        ],
        reward_result=RewardResult(reward, reward >= 0, reward == 1.0, None),
    )
    if flags.pop("env_error", False):
        fail_search(trajectory)
    for name, value in flags.items():
        setattr(trajectory, name, value)
    return trajectory


def float32(value: float) -> float:
    return float(np.float32(value))


class StubTokenizer:
    """Just enough tokenizer for the fake: the real vocabulary size, characters as ids."""

    eos_token_id = 0

    def __len__(self):
        return VOCAB_SIZE

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) if i < 0x110000 else "?" for i in ids)
