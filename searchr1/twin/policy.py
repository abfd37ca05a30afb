"""What the twin's server runs as "the model": a policy with trainable parameters.

The twin server owns everything PyTRIO owns (runs, checkpoints, the optimiser, the wire
protocol); a policy owns only the math of one model family:

* ``initial_params``: the trainable delta of a fresh LoRA run (zeros: the run starts as the
  base model, as LoRA does);
* ``sample``: draw ``num_samples`` continuations of a prompt from the distribution defined by
  the base model plus ``params``, each with the exact logprob of every returned token under
  the distribution it was drawn from. A sequence that ends by the model's choice includes
  the stop token (the server applies the configured stop-token convention afterwards);
* ``loss_and_grad``: the loss of a list of datums (already split into aligned arrays) and its
  exact gradient with respect to ``params``, reduced with the totals of the whole call.

A policy never sees rewards or answers; it learns only from the datums a real service
receives (tokens, targets, the sampler's logprobs, advantages) and the loss name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..toy_policy import IGNORE_INDEX, REDUCTIONS, LossResult, PolicySample, Reduction, Totals, totals_of

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
    ) -> LossResult: ...
