"""Datum building: one shift, masks on non-action tokens, one datum per context, length checks."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pytrio.client.training_batch import plan_training_batch
from pytrio.model.limits import TrainingLimits
from training_strategies import VOCAB_SIZE, float32, generated_trajectories

from searchr1.core.datum import (
    NonFiniteValues,
    DatumError,
    DatumTooLong,
    build_datums,
    build_training_datums,
)
from searchr1.core.types import Turn

NO_LIMITS = TrainingLimits(max_batch_size=None, max_tokens_per_request=None, max_seq_len=None)


def one_datum(trajectory, **limits):
    """The datum of a trajectory whose turns all extend one sequence."""
    (item,) = build_datums(trajectory, **limits)
    return item


def arrays(item):
    fields = item.datum.loss_fn_inputs
    return (
        item.datum.model_input.to_ints(),
        fields["target_tokens"].to_numpy(),
        fields["logprobs"].to_numpy(),
        fields["advantages"].to_numpy(),
    )


@given(generated_trajectories())
def test_shift_alignment(generated):
    inputs, targets, _, _ = arrays(one_datum(generated.trajectory))
    assert all(inputs[i + 1] == targets[i] for i in range(len(inputs) - 1))
    assert inputs == generated.tokens[:-1]
    assert targets.tolist() == generated.tokens[1:]


@given(generated_trajectories())
def test_input_targets_logprobs_and_advantages_have_equal_lengths(generated):
    item = one_datum(generated.trajectory)
    inputs, targets, logprobs, advantages = arrays(item)
    assert len(inputs) == len(targets) == len(logprobs) == len(advantages) == item.num_tokens
    assert item.num_tokens == len(generated.tokens) - 1


@given(generated_trajectories())
def test_advantages_are_zero_off_actions_and_the_trajectory_advantage_on_actions(generated):
    _, _, _, advantages = arrays(one_datum(generated.trajectory))
    expected = float32(generated.trajectory.advantage)
    # position i carries token i + 1
    for position, action in enumerate(generated.is_action[1:]):
        assert advantages[position] == (expected if action else 0.0)


@given(generated_trajectories())
def test_logprobs_are_zero_off_actions_and_the_sampler_logprob_on_actions(generated):
    _, _, logprobs, _ = arrays(one_datum(generated.trajectory))
    for position, (action, value) in enumerate(
        zip(generated.is_action[1:], generated.logprobs[1:])
    ):
        assert logprobs[position] == (float32(value) if action else 0.0)


@given(generated_trajectories())
def test_loss_tokens_count_the_action_tokens_and_the_key_names_the_trajectory(generated):
    item = one_datum(generated.trajectory)
    assert item.loss_tokens == sum(generated.is_action)
    assert (item.question_index, item.group_index) == (generated.trajectory.question_index, generated.trajectory.group_index)


@given(generated_trajectories())
def test_dtypes_are_int64_targets_and_float32_logprobs_and_advantages(generated):
    fields = one_datum(generated.trajectory).datum.loss_fn_inputs
    assert fields["target_tokens"].dtype == "int64"
    assert fields["logprobs"].dtype == "float32"
    assert fields["advantages"].dtype == "float32"


@settings(max_examples=30)
@given(generated_trajectories())
def test_every_built_datum_passes_pytrio_validation(generated):
    item = one_datum(generated.trajectory)
    plan = plan_training_batch(
        [item.datum],
        loss_fn="importance_sampling",
        auto_shift=False,
        limits=NO_LIMITS,
        tokenizer_vocab_size=VOCAB_SIZE,
    )
    assert plan.totals.total_advantage_tokens == sum(generated.is_action)
    assert plan.totals.total_active_tokens == item.num_tokens


@given(generated_trajectories(per_turn=True, folds=True, max_turns=6))
def test_each_context_is_one_datum_and_each_sampled_token_is_trained_once_with_its_turns_advantage(generated):
    """A turn whose prompt does not extend the sequence so far starts a new datum; every datum is
    its context shifted by one, every completion token in exactly one datum, with its own sampler
    logprob and its own turn's advantage; a context without an advantage sends nothing."""
    sent = [context for context in generated.contexts if any(context.advantages)]
    built = build_datums(generated.trajectory)
    assert len(built) == len(sent)
    for item, context in zip(built, sent):
        inputs, targets, logprobs, advantages = arrays(item)
        assert inputs == context.tokens[:-1] and targets.tolist() == context.tokens[1:]
        assert logprobs.tolist() == [float32(v) for v in context.logprobs[1:]]
        assert advantages.tolist() == [float32(v) for v in context.advantages[1:]]
    assert [item.first_turn for item in built] == [context.first_turn for context in sent]
    trajectory = generated.trajectory  # every datum names its own trajectory: groups stay apart
    assert {(item.question_index, item.group_index) for item in built} <= {(trajectory.question_index,
                                                                          trajectory.group_index)}
    trained = [token for item in built for token, advantage in zip(arrays(item)[1], arrays(item)[3]) if advantage]
    expected = [token for turn in generated.trajectory.turns if turn.advantage for token in turn.completion_tokens]
    assert trained == expected


@given(generated_trajectories(max_turns=4).filter(lambda g: len(g.trajectory.turns) >= 2), st.data())
def test_a_prompt_that_does_not_extend_the_sequence_starts_the_next_datum_there(generated, data):
    trajectory = generated.trajectory
    turn_index = data.draw(st.integers(1, len(trajectory.turns) - 1))
    assume(any(later.completion_tokens for later in trajectory.turns[turn_index:]))  # the new datum trains
    turn = trajectory.turns[turn_index]
    previous = trajectory.turns[turn_index - 1]
    covered = len(previous.prompt_tokens) + len(previous.completion_tokens)  # must be repeated
    position = data.draw(st.integers(0, covered - 1))
    corrupted = list(turn.prompt_tokens)
    corrupted[position] = (corrupted[position] + 1) % VOCAB_SIZE
    for later in trajectory.turns[turn_index:]:  # the turns after it extend the new context
        later.prompt_tokens = corrupted + later.prompt_tokens[len(corrupted):]
    first, second = build_datums(trajectory)
    assert (first.first_turn, second.first_turn) == (0, turn_index)
    assert arrays(second)[0][: len(corrupted)] == corrupted
    assert first.num_tokens == len(previous.prompt_tokens) + len(previous.completion_tokens) - 1


def test_a_shorter_prompt_starts_a_new_datum():
    turns = [
        Turn(prompt_tokens=[1, 2, 3], completion_tokens=[4, 5], logprobs=[-1.0, -1.0], text="", advantage=1.0),
        Turn(prompt_tokens=[1, 2, 3, 4], completion_tokens=[6], logprobs=[-2.0], text="", advantage=1.0),
    ]
    from training_strategies import EXAMPLE

    from searchr1.core.types import Trajectory

    trajectory = Trajectory(example=EXAMPLE, question_index=3, group_index=1, messages=[], turns=turns)
    first, second = build_datums(trajectory)  # the prompt stops where the sequence goes on
    assert arrays(first)[0] == [1, 2, 3, 4] and arrays(second)[0] == [1, 2, 3, 4]
    assert arrays(second)[1].tolist() == [2, 3, 4, 6] and arrays(second)[3].tolist() == [0.0, 0.0, 0.0, 1.0]


def test_a_context_that_does_not_start_with_a_prompt_is_refused_naming_its_turn():
    from training_strategies import plain_trajectory

    trajectory = plain_trajectory(7, 2, reward=1.0, advantage=0.5)
    trajectory.turns.append(Turn(prompt_tokens=[], completion_tokens=[9], logprobs=[-1.0], text="", advantage=0.5))
    with pytest.raises(DatumError, match="q7/g2 turn 1 has an empty prompt"):
        build_datums(trajectory)


@given(generated_trajectories(), st.integers(0, 3))
def test_length_limit_follows_max_tokens(generated, slack):
    length = len(generated.tokens) - 1
    assert one_datum(generated.trajectory, max_tokens=length + slack).num_tokens == length
    if length - 1 - slack >= 0:
        with pytest.raises(
            DatumTooLong, match=f"{length} input tokens exceed max_tokens={length - 1 - slack}"
        ):
            one_datum(generated.trajectory, max_tokens=length - 1 - slack)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda t: t.turns.clear(), "has no assistant turns"),
        (lambda t: setattr(t.turns[0], "logprobs", t.turns[0].logprobs + [-1.0]), "logprobs"),
        (lambda t: setattr(t.turns[0], "prompt_tokens", []), "empty prompt"),
        (
            lambda t: setattr(t.turns[0], "logprobs", [float("-inf")] * len(t.turns[0].logprobs)),
            "the sampler's logprob of token 0 is -inf",
        ),
    ],
)
def test_malformed_trajectories_raise_datum_errors(mutate, message):
    from training_strategies import plain_trajectory

    trajectory = plain_trajectory(7, 2, reward=1.0, advantage=0.5)
    mutate(trajectory)
    with pytest.raises((DatumError, NonFiniteValues), match=message) as caught:
        one_datum(trajectory)
    assert "q7/g2" in str(caught.value)


def test_a_trajectory_without_completion_tokens_raises():
    from training_strategies import plain_trajectory

    trajectory = plain_trajectory(0, 0, reward=1.0, advantage=1.0)
    trajectory.turns[0].completion_tokens = []
    trajectory.turns[0].logprobs = []
    with pytest.raises(DatumError, match="no completion tokens"):
        one_datum(trajectory)


@given(st.lists(generated_trajectories(), min_size=1, max_size=8), st.data())
def test_build_training_datums_keeps_exactly_the_trajectories_with_signal(items, data):
    trajectories = [g.trajectory for g in items]
    choices = []
    for index, trajectory in enumerate(trajectories):
        trajectory.question_index, trajectory.group_index = index, 0
        choice = data.draw(st.sampled_from(["keep", "zero", "excluded", "sampler_error", "empty"]))
        if choice == "zero":
            trajectory.credit(0.0)
        elif choice == "excluded":
            trajectory.excluded = "degenerate_group"
        elif choice == "sampler_error":
            trajectory.termination = "sampler_error"
        elif choice == "empty":
            for turn in trajectory.turns:
                turn.completion_tokens, turn.logprobs = [], []
        choices.append(choice)
    built = build_training_datums(trajectories)
    assert [b.question_index for b in built] == [
        t.question_index for t, choice in zip(trajectories, choices) if choice == "keep"
    ]


@settings(max_examples=40)
@given(generated_trajectories())
def test_a_datum_built_without_revalidation_equals_the_one_pytrio_validates_from_numpy(generated):
    from pytrio.types import Datum, ModelInput, TensorData

    item = one_datum(generated.trajectory)
    datum = item.datum
    fields = datum.loss_fn_inputs
    validated = Datum(
        model_input=ModelInput.from_ints(datum.model_input.to_ints()),
        loss_fn_inputs={name: TensorData.from_numpy(fields[name].to_numpy()) for name in fields},
    )
    assert datum.model_dump(mode="json") == validated.model_dump(mode="json")
    assert Datum.model_validate(datum.model_dump()) == validated
    for name, tensor in fields.items():
        assert all(type(x) is (int if tensor.dtype == "int64" else float) for x in tensor.data), name


def test_float_tensors_hold_float32_values_whatever_precision_the_sampler_sent():
    """A logprob or advantage of the trajectory that float32 cannot hold exactly (-0.1) is sent
    as its float32 value, as the tensor's dtype says."""
    from training_strategies import plain_trajectory

    trajectory = plain_trajectory(0, 0, reward=1.0, advantage=0.1)
    trajectory.turns[0].logprobs = [-0.1] * len(trajectory.turns[0].completion_tokens)
    fields = one_datum(trajectory).datum.loss_fn_inputs
    for name in ("logprobs", "advantages"):
        values = [value for value in fields[name].data if value != 0.0]
        assert values and all(value == float(np.float32(value)) for value in values), name
    assert {float(np.float32(-0.1))} == {value for value in fields["logprobs"].data if value != 0.0}
