"""Hypothesis strategies for trajectories, with the expected datum layout recorded at
generation time (so tests never derive expectations from the code under test)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from searchr1.core.types import CallRecord, RewardResult, SearchExample, Trajectory, Turn

VOCAB_SIZE = 248_077  # len() of the Qwen3.5 tokenizer
EXAMPLE = SearchExample(id="q", question="Who?", answers=("x",), data_source="nq")

token_ids = st.integers(min_value=0, max_value=VOCAB_SIZE - 1)
logprob_values = st.floats(-30.0, 0.0, allow_nan=False, allow_subnormal=False, width=32)
nonzero_advantages = st.floats(min_value=-4.0, max_value=4.0, allow_nan=False, allow_subnormal=False, width=32).filter(
    lambda a: a != 0.0
)


@dataclass
class Context:
    """One datum's unshifted sequence as generated: its tokens, which are the policy's actions, each
    token's sampler logprob (0.0 off actions) and advantage (its turn's on actions, else 0.0)."""

    tokens: list[int]
    is_action: list[bool]
    logprobs: list[float]
    advantages: list[float]
    first_turn: int = 0


@dataclass
class Generated:
    trajectory: Trajectory
    contexts: list[Context]  # one per datum the trajectory is built into, in turn order

    @property
    def only(self) -> Context:
        assert len(self.contexts) == 1, f"{len(self.contexts)} contexts"
        return self.contexts[0]

    @property
    def tokens(self) -> list[int]:  # the full unshifted sequence of a one-context trajectory
        return self.only.tokens

    @property
    def is_action(self) -> list[bool]:
        return self.only.is_action

    @property
    def logprobs(self) -> list[float]:  # per token: the sampler logprob on actions, else 0.0
        return self.only.logprobs


@st.composite
def generated_trajectories(
    draw,
    *,
    question_index: int | None = None,
    group_index: int | None = None,
    advantage=nonzero_advantages,
    max_turns: int = 4,
    max_len: int = 12,
    per_turn: bool = False,
    folds: bool = False,
) -> Generated:
    """A trajectory and the datums it must become. ``per_turn``: each turn draws its own advantage
    (0 allowed after the first); ``folds``: a turn after the first may start a new context whose
    prompt does not extend the sequence so far (it differs in its first token)."""
    contexts: list[Context] = []
    turns = []
    trajectory_advantage = draw(advantage)
    n_turns = draw(st.integers(1, max_turns))
    for index in range(n_turns):
        turn_advantage = trajectory_advantage
        if per_turn and index > 0:
            turn_advantage = draw(advantage | st.just(0.0))
        if index == 0 or (folds and draw(st.booleans())):
            prompt = draw(st.lists(token_ids, min_size=1, max_size=max_len))
            if contexts:  # not a prefix extension: a different first token
                prompt[0] = (contexts[-1].tokens[0] + 1) % VOCAB_SIZE
            contexts.append(Context(list(prompt), [False] * len(prompt), [0.0] * len(prompt), [0.0] * len(prompt),
                                    first_turn=index))
        else:
            observation = draw(st.lists(token_ids, max_size=max_len))
            context = contexts[-1]
            context.tokens += observation
            context.is_action += [False] * len(observation)
            context.logprobs += [0.0] * len(observation)
            context.advantages += [0.0] * len(observation)
        context = contexts[-1]
        turn_prompt = list(context.tokens)
        completion = draw(st.lists(token_ids, min_size=1 if index == 0 else 0, max_size=max_len))
        lps = draw(st.lists(logprob_values, min_size=len(completion), max_size=len(completion)))
        context.tokens += completion
        context.is_action += [True] * len(completion)
        context.logprobs += lps
        context.advantages += [turn_advantage] * len(completion)
        turns.append(Turn(prompt_tokens=turn_prompt, completion_tokens=completion, logprobs=lps, text="",
                          advantage=turn_advantage))
    trajectory = Trajectory(
        example=EXAMPLE,
        question_index=draw(st.integers(0, 50)) if question_index is None else question_index,
        group_index=draw(st.integers(0, 15)) if group_index is None else group_index,
        messages=[],
        turns=turns,
        advantage=trajectory_advantage,
    )
    return Generated(trajectory, contexts)


def fail_search(trajectory: Trajectory) -> None:
    """Record a failed search: what makes a trajectory an environment failure."""
    trajectory.turns[-1].calls.append(CallRecord("q", ok=False, observation="Search error: timeout", error="timeout",
                                                 tool="search"))


def plain_trajectory(question_index: int, group_index: int, reward: float, **flags) -> Trajectory:
    """A one-turn trajectory for advantage tests."""
    trajectory = Trajectory(
        example=EXAMPLE,
        question_index=question_index,
        group_index=group_index,
        messages=[],
        turns=[
            Turn(
                prompt_tokens=[1, 2, 3], completion_tokens=[4, 5], logprobs=[-1.0, -2.0], text=""
            )
        ],
        reward_result=RewardResult(reward, reward >= 0, reward == 1.0, None),
    )
    if flags.pop("env_error", False):
        fail_search(trajectory)
    if "advantage" in flags:
        trajectory.credit(flags.pop("advantage"))
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
