"""The toy policy's exact gradient: the objective's per-token gradients (searchr1.core.objective,
tested in tests/core/test_objective.py) chained through the bigram's ``d logp / d W``."""

from __future__ import annotations

import numpy as np

from searchr1.twin.policy import PolicySample, Totals
from searchr1.twin.toy_policy import loss_and_grad

CONFIG = {"importance_sampling": {}, "ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
          "dro": {"beta": 0.3}, "cross_entropy": {}}


def test_the_toy_policys_parameter_gradient_matches_finite_differences_for_every_loss():
    """cispo is left out: its gradient is by definition not the derivative of its value."""
    rng = np.random.default_rng(3)
    weights = rng.normal(size=(4, 4))
    sample = PolicySample.from_arrays([5, 6, 7, 8, 9], [6, 7, 8, 9, -100],
                                      logprobs=[-1.2, -1.5, -1.0, -1.4, 0.0],
                                      advantages=[0.7, -0.4, 0.9, -1.1, 0.0])
    totals = Totals(1, 4, 4)

    def loss(theta: np.ndarray, name: str) -> float:
        return loss_and_grad(theta, [sample], vocab_size=64, loss_fn=name, totals=totals,
                             loss_config=CONFIG[name]).loss

    for name in CONFIG:
        grad = loss_and_grad(weights, [sample], vocab_size=64, loss_fn=name, totals=totals,
                             loss_config=CONFIG[name]).grad
        numeric = np.zeros_like(weights)
        for index in np.ndindex(weights.shape):
            step = np.zeros_like(weights)
            step[index] = 1e-6
            numeric[index] = (loss(weights + step, name) - loss(weights - step, name)) / 2e-6
        np.testing.assert_allclose(grad, numeric, rtol=1e-4, atol=1e-7)
        assert np.abs(grad).max() > 1e-3  # a gradient that is there, not zeros matched by zeros
