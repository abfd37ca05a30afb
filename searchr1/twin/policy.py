"""What the twin's server runs as "the model": a policy with trainable parameters.

The twin server owns everything PyTRIO owns (runs, checkpoints, the optimiser, the wire
protocol, limits, the stop-token convention); a policy owns only the math of one model family:

* ``initial_params``: the trainable delta of a fresh LoRA run (zeros: the run starts as the
  base model, as LoRA does);
* ``sample``: draw ``num_samples`` continuations of a prompt from the distribution defined by
  the base model plus ``params``, each with the exact logprob of every returned token under
  the distribution it was drawn from. A sequence that ends by the model's choice includes
  the stop token (the server applies the request's stop rules and the configured stop-token
  convention afterwards);
* ``loss_and_grad``: the loss of a list of datums (already split into aligned arrays) and its
  exact gradient with respect to ``params``, reduced with the totals of the whole call, for
  every loss of :mod:`searchr1.core.objective` and its ``loss_config``.

A policy never sees rewards or answers; it learns only from the datums a real service
receives (tokens, targets, the sampler's logprobs, advantages) and the loss name.

This module also holds the data types the server and every policy share: one datum as
aligned arrays (:class:`PolicySample`), the denominators of one call (:class:`Totals`) and
what ``loss_and_grad`` returns (:class:`LossResult`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np

if TYPE_CHECKING:
    from pytrio.protocol.actor.events.trainer.forward import TrainerForwardDatum
    from pytrio.types import Datum

__all__ = [
    "IGNORE_INDEX",
    "REDUCTIONS",
    "LossResult",
    "PolicySample",
    "Reduction",
    "SampledSequence",
    "Totals",
    "TwinPolicy",
    "totals_of",
]

Reduction = Literal["per_token", "per_sample", "sum"]
REDUCTIONS: tuple[str, ...] = ("per_token", "per_sample", "sum")
IGNORE_INDEX = -100


@dataclass(frozen=True)
class PolicySample:
    """A datum's arrays, aligned so that ``inputs[i]`` predicts ``targets[i]``."""

    inputs: np.ndarray
    targets: np.ndarray
    old_logprobs: np.ndarray
    advantages: np.ndarray
    weights: np.ndarray  # cross-entropy weights (1.0 when absent)

    @property
    def active(self) -> np.ndarray:
        return self.targets != IGNORE_INDEX

    @classmethod
    def from_arrays(
        cls,
        inputs: Sequence[int] | np.ndarray,
        targets: Sequence[int] | np.ndarray,
        *,
        logprobs: Sequence[float] | np.ndarray | None = None,
        advantages: Sequence[float] | np.ndarray | None = None,
        weights: Sequence[float] | np.ndarray | None = None,
        auto_shift: bool = False,
    ) -> PolicySample:
        """With ``auto_shift`` the arrays hold the unshifted sequence: the trainer drops the
        first label, so ``inputs[i]`` predicts ``targets[i + 1]``."""
        ids = np.asarray(inputs, dtype=np.int64)
        n = len(ids)

        def column(values: Sequence[float] | np.ndarray | None, default: float) -> np.ndarray:
            if values is None:
                return np.full(n, default, dtype=np.float64)
            return np.asarray(values, dtype=np.float64).reshape(-1)

        arrays = (
            np.asarray(targets, dtype=np.int64).reshape(-1),
            column(logprobs, 0.0),
            column(advantages, 0.0),
            column(weights, 1.0),
        )
        if auto_shift:
            return cls(ids[:-1], *(a[1:] for a in arrays))
        return cls(ids, *arrays)

    @classmethod
    def from_datum(cls, datum: Datum, *, auto_shift: bool = False) -> PolicySample:
        """From a pytrio ``Datum`` (what a user passes to ``forward_backward``)."""
        fields = datum.loss_fn_inputs

        def get(key: str) -> np.ndarray | None:
            return fields[key].to_numpy().reshape(-1) if key in fields else None

        return cls.from_arrays(
            datum.model_input.to_ints(),
            fields["target_tokens"].to_numpy().reshape(-1),
            logprobs=get("logprobs"),
            advantages=get("advantages"),
            weights=get("weights"),
            auto_shift=auto_shift,
        )

    @classmethod
    def from_wire(cls, datum: TrainerForwardDatum, *, auto_shift: bool = False) -> PolicySample:
        """From one ``data[]`` entry of a forward event (what the server receives)."""
        tokens: list[int] = []
        for chunk in datum.model_input.chunks:
            if getattr(chunk, "type", None) != "encoded_text":
                raise ValueError("the twin's policies read text tokens only, not image chunks")
            tokens.extend(chunk.tokens)
        return cls.from_arrays(
            tokens,
            datum.target_ids,
            logprobs=datum.logprobs,
            advantages=datum.advantages,
            weights=datum.weights,
            auto_shift=auto_shift,
        )


@dataclass(frozen=True)
class Totals:
    """Denominators of one call, as pytrio's ``GradientAccumulationTotals``."""

    samples: int
    active_tokens: int
    advantage_tokens: int

    def denominator(self, reduction: Reduction) -> float:
        if reduction == "per_token":
            return float(max(self.active_tokens, 1))
        if reduction == "per_sample":
            return float(max(self.samples, 1))
        if reduction == "sum":
            return 1.0
        raise ValueError(f"unknown reduction {reduction!r}; expected one of {REDUCTIONS}")


def totals_of(samples: Sequence[PolicySample]) -> Totals:
    return Totals(
        samples=len(samples),
        active_tokens=int(sum(s.active.sum() for s in samples)),
        advantage_tokens=int(sum((s.active & (s.advantages != 0.0)).sum() for s in samples)),
    )


@dataclass(frozen=True)
class LossResult:
    loss: float  # reduced: loss_sum / denominator
    grad: np.ndarray  # d loss / d params, same shape as params
    loss_sum: float  # unreduced sum of the terms over active positions
    token_count: int  # active positions in these samples
    logprobs: list[np.ndarray]  # new-policy target logprobs per sample (0.0 at -100)


@dataclass(frozen=True)
class SampledSequence:
    """One continuation: its tokens and the logprob of each under the sampling distribution.

    ``stopped`` is True when the policy ended the turn itself (the last token is its stop
    token); False when it was cut by ``max_tokens``.
    """

    tokens: list[int]
    logprobs: list[float]
    stopped: bool


class TwinPolicy(Protocol):
    """A model family the twin can serve (see the module docstring)."""

    #: recorded in every checkpoint; a checkpoint loads only into a policy of the same kind
    kind: str

    def initial_params(self) -> np.ndarray: ...

    def sample(
        self,
        params: np.ndarray,
        prompt: Sequence[int],
        num_samples: int,
        *,
        max_tokens: int,
        seed: int | None,
        temperature: float,
    ) -> list[SampledSequence]: ...

    def loss_and_grad(
        self,
        params: np.ndarray,
        samples: Sequence[PolicySample],
        *,
        loss_fn: str,
        reduction: Reduction,
        totals: Totals,
        loss_config: Mapping[str, object] | None = None,
    ) -> LossResult: ...
