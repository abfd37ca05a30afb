"""The twin's sampler-learner mismatch (``TwinFaults.sampler_noise``, ``--offline-fault
mismatch@SCALE``): the sampler computes its distribution as a low-precision inference engine
does (bf16 or fp8 kernels, other reduction orders), slightly differently from the learner.

With the fault, the learning policy's sampler adds to each candidate turn's logit a noise of
standard deviation ``SCALE``, drawn once per (prompt, candidate) from a hash of both: the same
prompt always meets the same rounding, as one engine's kernels give the same numbers for the
same input, whatever the seed, and the noise does not depend on the weights. The sampler draws
its turns from that perturbed distribution and returns the perturbed logprobs; the learner
(``forward``, ``forward_backward``) computes the exact ones. So ``r = exp(p - q)`` leaves 1 on
every token where the candidates branch, and ``health/mismatch_k1`` and ``health/mismatch_k3``
show its size. Prompt logprobs (the KL penalty's base requests) stay exact.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import numpy as np


def check_scale(scale: float) -> float:
    """``scale`` when it is a finite number >= 0 (0: no fault); else ValueError."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale < 0:
        raise ValueError(f"TwinFaults.sampler_noise must be a finite number >= 0, got {scale!r}")
    return float(scale)


def sampler_noise(prompt: Sequence[int], candidates: Sequence[Sequence[int]], scale: float) -> np.ndarray:
    """One logit offset per candidate, ``scale`` times a standard normal drawn from the hash of
    the prompt and the candidate's tokens (pure, deterministic)."""
    if not scale:
        return np.zeros(len(candidates))
    head = hashlib.blake2b(np.asarray(prompt, dtype=np.int64).tobytes(), digest_size=16)
    out = np.empty(len(candidates))
    for index, tokens in enumerate(candidates):
        digest = head.copy()
        digest.update(np.asarray(tokens, dtype=np.int64).tobytes())
        out[index] = scale * np.random.default_rng(int.from_bytes(digest.digest(), "big")).standard_normal()
    return out
