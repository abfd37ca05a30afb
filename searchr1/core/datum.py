"""One PyTRIO ``Datum`` per trajectory: exactly the sampled tokens, with the loss masked to
the policy's own actions.

The full token sequence of a trajectory is ``prompt + completion_1 + observation_1 +
completion_2 + ...``. Each turn's ``prompt_tokens`` is the whole model input before that
turn, so it must *extend* everything before it; the part it adds is the observation (tool
message plus the next assistant header). Only completion tokens were chosen by the policy:

* completion tokens carry the trajectory advantage and the sampler's (old-policy) logprob;
* prompt and observation tokens carry advantage 0 and logprob 0 and keep their real target
  (masking by advantage, as the seed; PyTRIO would also accept ``-100`` targets).

Then ONE shift turns the sequence into next-token prediction: ``input = tokens[:-1]``,
``target = tokens[1:]``, and the logprob and advantage arrays are shifted the same way, so
position ``i`` predicts token ``i + 1`` and carries *that token's* logprob and advantage.
All four arrays have length ``len(input)``, which pytrio requires with ``auto_shift=False``.

``max_tokens`` bounds ``len(input)``: the trainer passes its configured trajectory cap
(``--max-trajectory-tokens``), the same cap the rollout kept every trajectory under.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
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


class PrefixViolation(DatumError):
    """A turn's prompt does not extend the tokens accumulated before it."""


class DatumTooLong(DatumError):
    """The shifted input is longer than ``max_tokens``."""


@dataclass(frozen=True)
class TrainingDatum:
    datum: Datum
    num_tokens: int  # len(model_input)
    loss_tokens: int  # positions with a non-zero advantage
    question_index: int
    group_index: int


def _name(trajectory: Trajectory) -> str:
    return f"trajectory q{trajectory.question_index}/g{trajectory.group_index}"


def trajectory_arrays(trajectory: Trajectory) -> tuple[list[int], list[float], list[float]]:
    """The unshifted ``(tokens, logprobs, advantages)`` of a trajectory, checked.

    Raises :class:`DatumError` (naming the trajectory and turn) when there are no turns, the
    first prompt is empty, a turn's logprobs do not match its completion, a turn's prompt does
    not extend the sequence so far, or nothing was sampled; :class:`NonFiniteValues` when a
    logprob is not finite.
    """
    name = _name(trajectory)
    if not trajectory.turns:
        raise DatumError(f"{name} has no assistant turns")
    advantage = float(trajectory.advantage)
    tokens: list[int] = []
    logprobs: list[float] = []
    advantages: list[float] = []
    completion_count = 0
    for index, turn in enumerate(trajectory.turns):
        prompt = list(turn.prompt_tokens)
        if index == 0 and not prompt:
            raise DatumError(f"{name} turn 0 has an empty prompt")
        if prompt[: len(tokens)] != tokens:
            mismatch = next(
                (i for i, (a, b) in enumerate(zip(prompt, tokens)) if a != b),
                min(len(prompt), len(tokens)),
            )
            raise PrefixViolation(
                f"{name} turn {index}: prompt ({len(prompt)} tokens) does not extend the "
                f"previous sequence ({len(tokens)} tokens); first difference at token {mismatch}"
            )
        delta = prompt[len(tokens) :]
        tokens += delta
        logprobs += [0.0] * len(delta)
        advantages += [0.0] * len(delta)
        if len(turn.completion_tokens) != len(turn.logprobs):
            raise DatumError(
                f"{name} turn {index}: {len(turn.completion_tokens)} completion tokens but "
                f"{len(turn.logprobs)} logprobs"
            )
        for position, value in enumerate(turn.logprobs):
            if not math.isfinite(value):  # the one check of the sampler's logprobs
                raise NonFiniteValues(f"{name} turn {index}: the sampler's logprob of token {position} is "
                                      f"{value!r} (nothing was sent to forward_backward)")
        tokens += list(turn.completion_tokens)
        logprobs += [float(v) for v in turn.logprobs]
        advantages += [advantage] * len(turn.completion_tokens)
        completion_count += len(turn.completion_tokens)
    if completion_count == 0:
        raise DatumError(f"{name} has no completion tokens")
    return tokens, logprobs, advantages


def _tensor(tensor_type: type[TensorData], array: np.ndarray, dtype: str) -> TensorData:
    """``TensorData.from_numpy(array)`` for a 1-D int64 or float32 array, without re-checking
    each element."""
    return tensor_type.model_construct(data=array.tolist(), dtype=dtype, shape=[int(array.shape[0])])


def build_datum(trajectory: Trajectory, *, max_tokens: int = DEFAULT_MAX_TRAJECTORY_TOKENS) -> TrainingDatum:
    tokens, logprobs, advantages = trajectory_arrays(trajectory)
    model_input = tokens[:-1]
    if len(model_input) > max_tokens:
        raise DatumTooLong(
            f"{_name(trajectory)}: {len(model_input)} input tokens exceed max_tokens={max_tokens}"
        )
    from pytrio.types import Datum, ModelInput, TensorData  # loaded when the first datum is built

    target_tokens = np.asarray(tokens[1:], dtype=np.int64)
    shifted_logprobs = np.asarray(logprobs[1:], dtype=np.float32)
    shifted_advantages = np.asarray(advantages[1:], dtype=np.float32)
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
    )


def sends_datum(trajectory: Trajectory) -> bool:
    """Whether a trajectory contributes to the update (before its tokens are checked)."""
    return (
        trajectory.excluded is None
        and not trajectory.sampler_error
        and trajectory.advantage != 0.0
        and any(turn.completion_tokens for turn in trajectory.turns)
    )


def build_training_datums(
    trajectories: Iterable[Trajectory], *, max_tokens: int = DEFAULT_MAX_TRAJECTORY_TOKENS
) -> list[TrainingDatum]:
    """Datums of the trajectories that carry signal, in input order. Skips excluded,
    zero-advantage and sampler-error trajectories and those without completion tokens; a
    malformed remaining trajectory raises :class:`DatumError`."""
    return [build_datum(t, max_tokens=max_tokens) for t in trajectories if sends_datum(t)]


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
