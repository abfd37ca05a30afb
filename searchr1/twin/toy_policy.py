"""A tiny language model whose loss gradients are exact: the twin's ``toy`` policy and the
ground truth of the accumulation proofs.

Model: a *bucketed bigram softmax*. Token ids (up to the real vocabulary, 248,077) fall into
``K`` buckets by ``id % K``. A ``K x K`` table ``W`` gives, for the bucket of the previous
token, logits over the bucket of the next token; within a bucket every id is equally likely::

    log p(t | prev) = log_softmax(W[prev % K])[t % K] - log(size of bucket t % K)

This is a proper distribution over ``[0, vocab_size)`` (the bucket sizes add up to the
vocabulary), it conditions on context (only the last token, which is all a bigram needs),
and its gradient is closed-form: ``d log p / d W[r, :] = onehot(t % K) - softmax(W[r])``.

Losses (per active position, i.e. target ``!= -100``): every loss of
:mod:`searchr1.core.objective` (``importance_sampling``, ``ppo``, ``cispo``, ``dro``,
``cross_entropy``), each a term and its derivative w.r.t. ``logp``; the chain rule through
``d logp / d W`` below gives the exact gradient.

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

:class:`ToyPolicy` serves this model through the twin: ``W = base + params``, where the base
table is drawn from a seed derived from the base model's name and ``params`` (the LoRA
delta) starts at zero.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence

import numpy as np

from searchr1.core.objective import loss_terms, resolve_loss_config
from searchr1.twin.policy import LossResult, PolicySample, Reduction, SampledSequence, Totals, totals_of

DEFAULT_NUM_BUCKETS = 16
QWEN35_VOCAB_SIZE = 248_077  # len() of the Qwen3.5 tokenizer
QWEN35_IM_END = 248_046
DEFAULT_BASE_MODEL = "Qwen/Qwen3.5-4B"


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
    active = targets != -100
    out = np.zeros(len(targets), dtype=np.float64)
    if active.any():
        buckets = targets[active] % num_buckets
        rows = next_bucket_logprobs(weights, inputs[active])
        sizes = bucket_sizes(num_buckets, vocab_size)
        out[active] = rows[np.arange(len(buckets)), buckets] - np.log(sizes[buckets])
    return out


# --- losses and exact gradients ----------------------------------------------------------

def loss_and_grad(
    weights: np.ndarray,
    samples: Sequence[PolicySample],
    *,
    vocab_size: int,
    loss_fn: str = "importance_sampling",
    reduction: Reduction = "per_token",
    totals: Totals | None = None,
    loss_config: Mapping[str, object] | None = None,
) -> LossResult:
    """Loss and exact gradient of ``samples`` reduced with ``totals`` (default: their own).

    Passing the totals of a larger call makes this the contribution of one chunk of it;
    the chunks' losses and gradients then add up to the whole call's.
    """
    config = resolve_loss_config(loss_fn, loss_config)
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
        terms, dterms = loss_terms(loss_fn, config, logp_all[active], sample.old_logprobs[active],
                                   sample.advantages[active], sample.weights[active])
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


# --- sampling ----------------------------------------------------------------------------


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


def base_table(base_model: str, num_buckets: int) -> np.ndarray:
    """The frozen "base model": a table drawn from a seed derived from its name."""
    seed = int.from_bytes(hashlib.sha256(base_model.encode()).digest()[:8], "little")
    return np.random.default_rng(seed).normal(0.0, 1.0, size=(num_buckets, num_buckets))


class ToyPolicy:
    """The twin's ``toy`` model (see the module docstring). Satisfies ``TwinPolicy``.

    ``stop_token`` (default ``<|im_end|>``) is the policy's own end of turn: a sequence that
    draws it stops there (``stopped=True``). Under the bigram it is rarely drawn, so most
    samples run to ``max_tokens`` or to a stop rule of the request.
    """

    def __init__(
        self,
        *,
        base_model: str = DEFAULT_BASE_MODEL,
        num_buckets: int = DEFAULT_NUM_BUCKETS,
        vocab_size: int = QWEN35_VOCAB_SIZE,
        stop_token: int | None = QWEN35_IM_END,
    ) -> None:
        bucket_sizes(num_buckets, vocab_size)  # validates the pair
        self.base_model = base_model
        self.num_buckets = num_buckets
        self.vocab_size = vocab_size
        self.stop_token = stop_token
        self.base = base_table(base_model, num_buckets)
        self.kind = f"toy-bigram-v1/k{num_buckets}/vocab{vocab_size}"

    def weights(self, params: np.ndarray) -> np.ndarray:
        """The effective table (base + LoRA delta)."""
        return self.base + params

    def initial_params(self) -> np.ndarray:
        return np.zeros((self.num_buckets, self.num_buckets), dtype=np.float64)

    def sample(
        self,
        params: np.ndarray,
        prompt: Sequence[int],
        num_samples: int,
        *,
        max_tokens: int,
        seed: int | None,
        temperature: float,
    ) -> list[SampledSequence]:
        weights = self.weights(params)
        rng = np.random.default_rng(seed)
        out = []
        for _ in range(num_samples):
            tokens: list[int] = []
            logprobs: list[float] = []
            previous, stopped = int(prompt[-1]), False
            while len(tokens) < max_tokens:
                token, logprob = sample_next_token(
                    weights, self.vocab_size, previous, rng, temperature=temperature
                )
                tokens.append(token)
                logprobs.append(logprob)
                previous = token
                if token == self.stop_token:
                    stopped = True
                    break
            out.append(SampledSequence(tokens, logprobs, stopped))
        return out

    def loss_and_grad(
        self,
        params: np.ndarray,
        samples: Sequence[PolicySample],
        *,
        loss_fn: str,
        reduction: Reduction,
        totals: Totals,
        loss_config: Mapping[str, object] | None = None,
    ) -> LossResult:
        # d loss / d params == d loss / d W, since W = base + params
        return loss_and_grad(
            self.weights(params),
            samples,
            vocab_size=self.vocab_size,
            loss_fn=loss_fn,
            reduction=reduction,
            totals=totals,
            loss_config=loss_config,
        )
