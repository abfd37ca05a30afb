"""A tiny language model whose loss gradients are exact: the ground truth for the
accumulation proofs and the "model" behind the offline PyTRIO fake.

Model: a *bucketed bigram softmax*. Token ids (up to the real vocabulary, 248,077) fall into
``K`` buckets by ``id % K``. A ``K x K`` table ``W`` gives, for the bucket of the previous
token, logits over the bucket of the next token; within a bucket every id is equally likely::

    log p(t | prev) = log_softmax(W[prev % K])[t % K] - log(size of bucket t % K)

This is a proper distribution over ``[0, vocab_size)`` (the bucket sizes add up to the
vocabulary), it conditions on context (only the last token, which is all a bigram needs),
and its gradient is closed-form: ``d log p / d W[r, :] = onehot(t % K) - softmax(W[r])``.

Losses (per active position, i.e. target ``!= -100``):

* ``importance_sampling`` (pytrio's name): ``-exp(logp - old_logprob) * advantage``.
  Its derivative w.r.t. ``logp`` is the term itself.
* ``cross_entropy``: ``-weight * logp``.

Reductions of one call, given totals of the *whole* call (pytrio sends those totals with
every chunk, so a split call reduces exactly like an unsplit one):

* ``per_token``: sum of the terms / ``active_tokens``, the positions whose target is not
  ``-100`` *including* zero-advantage prompt and observation positions (pytrio's
  ``total_active_tokens``);
* ``per_sample``: sum of the terms / ``samples``. Each datum contributes the *sum* of its
  token terms, and the call averages those over datums. This is the reading of "the server
  averages per sample" under which only ``total_samples`` is needed; the n_k/N argument
  works for any per-datum quantity, so the token-mean-per-datum variant would prove the
  same thing;
* ``sum``: the plain sum.

The optimiser is AdamW with pytrio's ``AdamParams`` fields, following ``torch.optim.AdamW``
(decoupled weight decay, bias correction, ``eps`` added to the root of the second moment)
plus optional global-norm clipping. The server's exact optimiser is not published.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pytrio.types import AdamParams, Datum

Reduction = Literal["per_token", "per_sample", "sum"]
REDUCTIONS: tuple[str, ...] = ("per_token", "per_sample", "sum")
IGNORE_INDEX = -100


# --- the model ---------------------------------------------------------------------------


def bucket_sizes(num_buckets: int, vocab_size: int) -> np.ndarray:
    """How many ids in ``[0, vocab_size)`` fall in each bucket ``id % num_buckets``."""
    if num_buckets < 1 or vocab_size < num_buckets:
        raise ValueError(f"need 1 <= num_buckets <= vocab_size, got {num_buckets}, {vocab_size}")
    sizes = np.full(num_buckets, vocab_size // num_buckets, dtype=np.int64)
    sizes[: vocab_size % num_buckets] += 1
    return sizes


def _log_softmax(rows: np.ndarray) -> np.ndarray:
    shifted = rows - rows.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def next_bucket_logprobs(weights: np.ndarray, previous_tokens: np.ndarray) -> np.ndarray:
    """``log_softmax(W[prev % K])`` for each previous token: shape ``[n, K]``."""
    return _log_softmax(weights[np.asarray(previous_tokens, dtype=np.int64) % weights.shape[0]])


def token_logprobs(
    weights: np.ndarray, vocab_size: int, inputs: np.ndarray, targets: np.ndarray
) -> np.ndarray:
    """``log p(targets[i] | inputs[i])`` per position; 0.0 where the target is ``-100``."""
    inputs = np.asarray(inputs, dtype=np.int64)
    targets = np.asarray(targets, dtype=np.int64)
    num_buckets = weights.shape[0]
    active = targets != IGNORE_INDEX
    out = np.zeros(len(targets), dtype=np.float64)
    if active.any():
        buckets = targets[active] % num_buckets
        rows = next_bucket_logprobs(weights, inputs[active])
        sizes = bucket_sizes(num_buckets, vocab_size)
        out[active] = rows[np.arange(len(buckets)), buckets] - np.log(sizes[buckets])
    return out


# --- one datum as arrays -----------------------------------------------------------------


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
    def from_datum(cls, datum: Datum, *, auto_shift: bool = False) -> PolicySample:
        """With ``auto_shift`` the datum holds the unshifted sequence: the trainer drops the
        first label, so ``inputs[i]`` predicts ``targets[i + 1]``."""
        inputs = np.asarray(datum.model_input.to_ints(), dtype=np.int64)
        fields = datum.loss_fn_inputs
        n = len(inputs)

        def get(key: str, default: float) -> np.ndarray:
            if key in fields:
                return fields[key].to_numpy().astype(np.float64).reshape(-1)
            return np.full(n, default, dtype=np.float64)

        targets = fields["target_tokens"].to_numpy().astype(np.int64).reshape(-1)
        arrays = (targets, get("logprobs", 0.0), get("advantages", 0.0), get("weights", 1.0))
        if auto_shift:
            return cls(inputs[:-1], *(a[1:] for a in arrays))
        return cls(inputs, *arrays)


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


# --- losses and exact gradients ----------------------------------------------------------

# A loss maps (sample, new logprobs at active positions) to (terms, d term / d logp).
TermFn = Callable[[PolicySample, np.ndarray], tuple[np.ndarray, np.ndarray]]


def _importance_sampling_terms(
    sample: PolicySample, logp: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    active = sample.active
    ratio = np.exp(logp - sample.old_logprobs[active])
    terms = -ratio * sample.advantages[active]
    return terms, terms


def _cross_entropy_terms(sample: PolicySample, logp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    weights = sample.weights[sample.active]
    return -weights * logp, -weights


LOSS_TERMS: dict[str, TermFn] = {
    "importance_sampling": _importance_sampling_terms,
    "cross_entropy": _cross_entropy_terms,
}


@dataclass(frozen=True)
class LossResult:
    loss: float  # reduced: loss_sum / denominator
    grad: np.ndarray  # d loss / d W, same shape as W
    loss_sum: float  # unreduced sum of the terms over active positions
    token_count: int  # active positions in these samples
    logprobs: list[np.ndarray]  # new-policy target logprobs per sample (0.0 at -100)


def loss_and_grad(
    weights: np.ndarray,
    samples: Sequence[PolicySample],
    *,
    vocab_size: int,
    loss_fn: str = "importance_sampling",
    reduction: Reduction = "per_token",
    totals: Totals | None = None,
) -> LossResult:
    """Loss and exact gradient of ``samples`` reduced with ``totals`` (default: their own).

    Passing the totals of a larger call makes this the contribution of one chunk of it;
    the chunks' losses and gradients then add up to the whole call's.
    """
    if loss_fn not in LOSS_TERMS:
        raise ValueError(f"toy policy has no loss {loss_fn!r}; expected one of {tuple(LOSS_TERMS)}")
    term_fn = LOSS_TERMS[loss_fn]
    denominator = (totals or totals_of(samples)).denominator(reduction)
    num_buckets = weights.shape[0]
    grad = np.zeros_like(weights, dtype=np.float64)
    loss_sum = 0.0
    token_count = 0
    all_logprobs = []
    for sample in samples:
        logp_all = token_logprobs(weights, vocab_size, sample.inputs, sample.targets)
        all_logprobs.append(logp_all)
        active = sample.active
        if not active.any():
            continue
        terms, dterms = term_fn(sample, logp_all[active])
        loss_sum += float(terms.sum())
        token_count += int(active.sum())
        rows = sample.inputs[active] % num_buckets
        buckets = sample.targets[active] % num_buckets
        probs = np.exp(next_bucket_logprobs(weights, sample.inputs[active]))
        dlogp_drow = -probs
        dlogp_drow[np.arange(len(buckets)), buckets] += 1.0
        np.add.at(grad, rows, dterms[:, None] * dlogp_drow)
    return LossResult(
        loss=loss_sum / denominator,
        grad=grad / denominator,
        loss_sum=loss_sum,
        token_count=token_count,
        logprobs=all_logprobs,
    )


# --- optimiser ---------------------------------------------------------------------------


@dataclass(frozen=True)
class AdamState:
    m: np.ndarray
    v: np.ndarray
    step: int = 0

    @classmethod
    def zeros_like(cls, params: np.ndarray) -> AdamState:
        return cls(
            np.zeros_like(params, dtype=np.float64), np.zeros_like(params, dtype=np.float64), 0
        )


@dataclass(frozen=True)
class AdamUpdate:
    params: np.ndarray
    state: AdamState
    grad_norm: float  # global L2 norm of the gradient before clipping


def adam_step(
    params: np.ndarray, grad: np.ndarray, state: AdamState, adam: AdamParams
) -> AdamUpdate:
    """One AdamW step (pure: returns new arrays)."""
    grad_norm = float(np.sqrt(np.sum(grad * grad)))
    if adam.grad_clip_norm > 0.0 and grad_norm > adam.grad_clip_norm:
        grad = grad * (adam.grad_clip_norm / grad_norm)
    step = state.step + 1
    lr = adam.learning_rate
    decayed = params * (1.0 - lr * adam.weight_decay)
    m = adam.beta1 * state.m + (1.0 - adam.beta1) * grad
    v = adam.beta2 * state.v + (1.0 - adam.beta2) * grad * grad
    m_hat = m / (1.0 - adam.beta1**step)
    v_hat = v / (1.0 - adam.beta2**step)
    new_params = decayed - lr * m_hat / (np.sqrt(v_hat) + adam.eps)
    return AdamUpdate(new_params, AdamState(m, v, step), grad_norm)


# --- sampling (used by the fake sampler) -------------------------------------------------


def sample_next_token(
    weights: np.ndarray,
    vocab_size: int,
    previous_token: int,
    rng: np.random.Generator,
    *,
    temperature: float = 1.0,
) -> tuple[int, float]:
    """Draw one token and return it with its logprob under the distribution it was drawn
    from (the tempered one when ``temperature != 1``)."""
    num_buckets = weights.shape[0]
    logits = weights[previous_token % num_buckets] / max(temperature, 1e-6)
    bucket_logprobs = _log_softmax(logits)
    bucket = int(rng.choice(num_buckets, p=np.exp(bucket_logprobs)))
    size = int(bucket_sizes(num_buckets, vocab_size)[bucket])
    token = bucket + num_buckets * int(rng.integers(size))
    return token, float(bucket_logprobs[bucket] - math.log(size))
