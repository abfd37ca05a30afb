"""The twin's policy losses against an independent numpy reference written here.

The reference restates Tinker's documented objectives (tinker-docs.thinkingmachines.ai, loss
pages) token by token, as plain scalar Python: values directly, gradients by central finite
differences of the value (ppo, dro, importance_sampling), or by the documented stop-gradient
rule (cispo, whose gradient is not the derivative of its value).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from searchr1.twin.losses import LossConfigError, loss_terms, resolve_loss_config
from searchr1.twin.policy import PolicySample, Totals
from searchr1.twin.toy_policy import loss_and_grad

LOW, HIGH, BETA = 0.8, 1.2, 0.3


def reference_value(loss: str, logp: float, q: float, a: float) -> float:
    """One token's loss, written from the documentation's formulas."""
    r = math.exp(logp - q)
    if loss == "importance_sampling":
        return -(r * a)
    if loss == "ppo":
        return -min(r * a, min(max(r, LOW), HIGH) * a)
    if loss == "cispo":
        return -(min(max(r, LOW), HIGH) * logp * a)
    if loss == "dro":
        return -(logp * a - 0.5 * BETA * (logp - q) ** 2)
    raise AssertionError(loss)


def reference_gradient(loss: str, logp: float, q: float, a: float) -> float:
    if loss == "cispo":  # sg(clip(r)) * logp * A: only logp carries the gradient
        return -min(max(math.exp(logp - q), LOW), HIGH) * a
    h = 1e-6
    return (reference_value(loss, logp + h, q, a) - reference_value(loss, logp - h, q, a)) / (2 * h)


CONFIG = {"importance_sampling": {}, "ppo": {"clip_low_threshold": LOW, "clip_high_threshold": HIGH},
          "cispo": {"clip_low_threshold": LOW, "clip_high_threshold": HIGH}, "dro": {"beta": BETA}}

logprobs = st.floats(-6.0, 0.0)
log_ratios = st.floats(-0.7, 0.7)  # ratios from about 0.5 to 2: inside and outside [0.8, 1.2]
advantages = st.floats(-2.0, 2.0).filter(lambda a: abs(a) > 1e-3)


@pytest.mark.parametrize("loss", ["importance_sampling", "ppo", "cispo", "dro"])
@settings(max_examples=150, deadline=None)
@given(q=logprobs, log_ratio=log_ratios, a=advantages)
def test_each_loss_value_and_gradient_equal_the_documented_formula_for_any_ratio_and_advantage_sign(
        loss, q, log_ratio, a):
    logp = q + log_ratio
    r = math.exp(log_ratio)
    assume(min(abs(r - LOW), abs(r - HIGH)) > 1e-4)  # finite differences need to stay off the kinks
    config = resolve_loss_config(loss, CONFIG[loss])
    terms, slopes = loss_terms(loss, config, np.array([logp]), np.array([q]), np.array([a]), np.ones(1))
    assert terms[0] == pytest.approx(reference_value(loss, logp, q, a), rel=1e-9, abs=1e-12)
    assert slopes[0] == pytest.approx(reference_gradient(loss, logp, q, a), rel=1e-5, abs=1e-7)


@settings(max_examples=100, deadline=None)
@given(q=logprobs, a=st.floats(-2.0, 2.0))
def test_ppo_at_ratio_one_equals_importance_sampling(q, a):
    args = (np.array([q]), np.array([q]), np.array([a]), np.ones(1))
    ppo = loss_terms("ppo", resolve_loss_config("ppo", {}), *args)
    plain = loss_terms("importance_sampling", {}, *args)
    assert np.array_equal(ppo[0], plain[0]) and np.array_equal(ppo[1], plain[1])


@pytest.mark.parametrize(("log_ratio", "a"), [(0.5, 1.0), (-0.5, -1.0)])
def test_ppo_gives_no_gradient_to_a_token_clipped_against_its_advantage_while_cispo_keeps_a_capped_one(
        log_ratio, a):
    args = (np.array([-1.0 + log_ratio]), np.array([-1.0]), np.array([a]), np.ones(1))
    assert loss_terms("ppo", resolve_loss_config("ppo", {}), *args)[1][0] == 0.0
    capped = HIGH if log_ratio > 0 else LOW
    assert loss_terms("cispo", resolve_loss_config("cispo", {}), *args)[1][0] == pytest.approx(-capped * a)


def test_the_toy_policys_parameter_gradient_matches_finite_differences_for_every_loss():
    rng = np.random.default_rng(3)
    weights = rng.normal(size=(4, 4))
    sample = PolicySample.from_arrays([5, 6, 7, 8, 9], [6, 7, 8, 9, -100],
                                      logprobs=[-1.2, -1.5, -1.0, -1.4, 0.0],
                                      advantages=[0.7, -0.4, 0.9, -1.1, 0.0])
    totals = Totals(1, 4, 4)
    for loss in ("importance_sampling", "ppo", "cispo", "dro"):
        result = loss_and_grad(weights, [sample], vocab_size=64, loss_fn=loss, totals=totals,
                               loss_config=CONFIG[loss])
        if loss == "cispo":
            continue  # its gradient is by definition not the derivative of its value
        numeric = np.zeros_like(weights)
        for index in np.ndindex(weights.shape):
            step = np.zeros_like(weights)
            step[index] = 1e-6
            up = loss_and_grad(weights + step, [sample], vocab_size=64, loss_fn=loss, totals=totals,
                               loss_config=CONFIG[loss]).loss
            down = loss_and_grad(weights - step, [sample], vocab_size=64, loss_fn=loss, totals=totals,
                                 loss_config=CONFIG[loss]).loss
            numeric[index] = (up - down) / 2e-6
        np.testing.assert_allclose(result.grad, numeric, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize(("loss", "config", "named"), [
    ("gspo", {}, "gspo"),
    ("ppo", {"clip_ratio": 0.2}, "clip_low_threshold, clip_high_threshold"),
    ("importance_sampling", {"beta": 0.1}, "no keys"),
    ("ppo", {"clip_low_threshold": 1.3}, "clip_low_threshold <= clip_high_threshold"),
    ("dro", {"beta": "big"}, "finite number"),
])
def test_a_loss_or_config_the_twin_does_not_take_is_refused_with_what_it_takes(loss, config, named):
    with pytest.raises(LossConfigError, match=None) as refused:
        resolve_loss_config(loss, config)
    assert named in str(refused.value)
