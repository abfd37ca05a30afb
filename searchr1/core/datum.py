"""The PyTRIO datums of a trajectory: exactly the sampled tokens, with the loss masked to the
policy's own actions.

The token sequence of a trajectory is ``prompt + completion_1 + observation_1 + completion_2 +
...``. Each turn's ``prompt_tokens`` is the whole model input before that turn. A turn whose
prompt *extends* the sequence so far continues it (the part it adds is the observation: tool
messages plus the next assistant header); a turn whose prompt does not (a context that was
folded or rewritten) starts a new sequence, so a trajectory is one datum per such context, each
completion token in exactly one of them. Only completion tokens were chosen by the policy:

* completion tokens carry their turn's advantage and the sampler's (old-policy) logprob;
* prompt and observation tokens carry advantage 0 and logprob 0 and keep their real target
  (masking by advantage, as the lab port; PyTRIO would also accept ``-100`` targets).

Then ONE shift turns a sequence into next-token prediction: ``input = tokens[:-1]``,
``target = tokens[1:]``, and the logprob and advantage arrays are shifted the same way, so
position ``i`` predicts token ``i + 1`` and carries *that token's* logprob and advantage.
All four arrays have length ``len(input)``, which pytrio requires with ``auto_shift=False``.

``max_tokens`` bounds ``len(input)``: the trainer passes one context's cap (the window), the
same cap the rollout kept every context under (``RolloutBudgets.window``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from searchr1.core.types import DEFAULT_MAX_TRAJECTORY_TOKENS, Trajectory

if TYPE_CHECKING:
    from pytrio.types import Datum, TensorData


class DatumError(ValueError):
    """A trajectory cannot become a datum. The message names it (question/group, turn)."""


class NonFiniteValues(RuntimeError):
    """A NaN or infinity in what a step sends or gets back (a sampler logprob, an advantage, a
    loss); the step stops before ``optim_step``."""


class DatumTooLong(DatumError):
    """The shifted input is longer than ``max_tokens``."""


@dataclass(frozen=True)
class TrainingDatum:
    datum: Datum
    num_tokens: int  # len(model_input)
    loss_tokens: int  # positions with a non-zero advantage
    question_index: int
    group_index: int
    first_turn: int = 0  # the trajectory's turn its sequence starts with


@dataclass
class DatumArrays:
    """The unshifted arrays of one datum of a trajectory, and the turn it starts with."""

    first_turn: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    advantages: list[float] = field(default_factory=list)


def _name(trajectory: Trajectory) -> str:
    return f"trajectory q{trajectory.question_index}/g{trajectory.group_index}"


def datum_arrays(trajectory: Trajectory) -> list[DatumArrays]:
    """The unshifted tokens, logprobs and advantages of each context of a trajectory, checked:
    a turn whose prompt extends the sequence so far continues it, any other turn starts the next.

    Raises :class:`DatumError` (naming the trajectory and turn) when there are no turns, a
    sequence's first prompt is empty, a turn's logprobs do not match its completion, or nothing
    was sampled; :class:`NonFiniteValues` when a logprob is not finite.
    """
    name = _name(trajectory)
    if not trajectory.turns:
        raise DatumError(f"{name} has no assistant turns")
    sequences: list[DatumArrays] = []
    for index, turn in enumerate(trajectory.turns):
        prompt = list(turn.prompt_tokens)
        if not sequences or prompt[: len(sequences[-1].tokens)] != sequences[-1].tokens:
            if not prompt:
                raise DatumError(f"{name} turn {index} has an empty prompt")
            sequences.append(DatumArrays(index))
        sequence = sequences[-1]
        delta = prompt[len(sequence.tokens):]
        sequence.tokens += delta
        sequence.logprobs += [0.0] * len(delta)
        sequence.advantages += [0.0] * len(delta)
        if len(turn.completion_tokens) != len(turn.logprobs):
            raise DatumError(
                f"{name} turn {index}: {len(turn.completion_tokens)} completion tokens but "
                f"{len(turn.logprobs)} logprobs"
            )
        for position, value in enumerate(turn.logprobs):
            if not math.isfinite(value):  # the one check of the sampler's logprobs
                raise NonFiniteValues(f"{name} turn {index}: the sampler's logprob of token {position} is "
                                      f"{value!r} (nothing was sent to forward_backward)")
        sequence.tokens += list(turn.completion_tokens)
        sequence.logprobs += [float(v) for v in turn.logprobs]
        sequence.advantages += [float(turn.advantage)] * len(turn.completion_tokens)
    if not any(turn.completion_tokens for turn in trajectory.turns):
        raise DatumError(f"{name} has no completion tokens")
    return sequences


def _tensor(tensor_type: type[TensorData], array: np.ndarray, dtype: str) -> TensorData:
    """``TensorData.from_numpy(array)`` for a 1-D int64 or float32 array, without re-checking
    each element."""
    return tensor_type.model_construct(data=array.tolist(), dtype=dtype, shape=[int(array.shape[0])])


def build_datum(trajectory: Trajectory, sequence: DatumArrays, *,
                max_tokens: int = DEFAULT_MAX_TRAJECTORY_TOKENS) -> TrainingDatum:
    """The datum of one sequence of ``trajectory``: shifted by one, checked against ``max_tokens``."""
    tokens = sequence.tokens
    model_input = tokens[:-1]
    if len(model_input) > max_tokens:
        raise DatumTooLong(
            f"{_name(trajectory)}: {len(model_input)} input tokens exceed max_tokens={max_tokens}"
        )
    from pytrio.types import Datum, ModelInput, TensorData  # loaded when the first datum is built

    target_tokens = np.asarray(tokens[1:], dtype=np.int64)
    shifted_logprobs = np.asarray(sequence.logprobs[1:], dtype=np.float32)
    shifted_advantages = np.asarray(sequence.advantages[1:], dtype=np.float32)
    # Built as pytrio's validators would leave them (int64 / float32 values as Python numbers,
    # shape [n]) without running them: they check each element in Python, twice per tensor
    # (TensorData, then Datum again), a tenth of a step's local CPU; forward_backward validates
    # every datum once more anyway. tests/core/test_datum.py checks equality with the validated build.
    datum = Datum.model_construct(
        model_input=ModelInput.from_ints(model_input),
        loss_fn_inputs={
            "target_tokens": _tensor(TensorData, target_tokens, "int64"),
            "logprobs": _tensor(TensorData, shifted_logprobs, "float32"),
            "advantages": _tensor(TensorData, shifted_advantages, "float32"),
        },
    )
    return TrainingDatum(
        datum=datum,
        num_tokens=len(model_input),
        loss_tokens=int(np.count_nonzero(shifted_advantages)),
        question_index=trajectory.question_index,
        group_index=trajectory.group_index,
        first_turn=sequence.first_turn,
    )


def build_datums(trajectory: Trajectory, *, max_tokens: int = DEFAULT_MAX_TRAJECTORY_TOKENS) -> list[TrainingDatum]:
    """The datums of one trajectory, one per context; a context none of whose tokens carries an
    advantage sends nothing."""
    return [build_datum(trajectory, sequence, max_tokens=max_tokens)
            for sequence in datum_arrays(trajectory) if any(sequence.advantages)]


def sends_datum(trajectory: Trajectory) -> bool:
    """Whether a trajectory contributes to the update (before its tokens are checked)."""
    return (
        trajectory.excluded is None
        and not trajectory.sampler_error
        and any(turn.advantage != 0.0 and turn.completion_tokens for turn in trajectory.turns)
    )


def build_training_datums(
    trajectories: Iterable[Trajectory], *, max_tokens: int = DEFAULT_MAX_TRAJECTORY_TOKENS
) -> list[TrainingDatum]:
    """Datums of the trajectories that carry signal, in input order. Skips excluded and
    sampler-error trajectories and those none of whose sampled tokens carries an advantage; a
    malformed remaining trajectory raises :class:`DatumError`."""
    return [item for t in trajectories if sends_datum(t) for item in build_datums(t, max_tokens=max_tokens)]


def drop_out_of_vocab(datums: Sequence[TrainingDatum], vocab_size: int) -> tuple[list[TrainingDatum], int]:
    """PyTRIO rejects any token id >= len(tokenizer) (the embedding has 243 spare rows the
    sampler can in principle emit); drop such datums instead of failing the step."""
    kept = []
    for item in datums:
        ids = item.datum.model_input.to_ints()
        targets = item.datum.loss_fn_inputs["target_tokens"].data
        if max(ids, default=0) < vocab_size and max(targets, default=0) < vocab_size:
            kept.append(item)
    return kept, len(datums) - len(kept)
