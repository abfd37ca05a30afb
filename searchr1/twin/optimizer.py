"""The server's optimiser: AdamW with pytrio's ``AdamParams`` fields.

It follows ``torch.optim.AdamW`` (decoupled weight decay, bias correction, ``eps`` added to
the root of the second moment) plus optional global-norm clipping, which is what the
``grad_clip_norm`` field asks for. The real service's optimiser is not published; this one is
the twin's, applied to whatever parameters the served policy has. Pure: every step returns new
arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from pytrio.types import AdamParams


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


def adam_step(params: np.ndarray, grad: np.ndarray, state: AdamState, adam: AdamParams) -> AdamUpdate:
    """One AdamW step. ``adam`` has pytrio's ``AdamParams`` fields (``learning_rate``,
    ``beta1``, ``beta2``, ``eps``, ``weight_decay``, ``grad_clip_norm``)."""
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
