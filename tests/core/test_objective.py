"""The objective (every loss's per-token term and gradient) against an independent reference.

The reference restates Tinker's documented objectives (tinker-docs.thinkingmachines.ai, loss
pages) token by token, as plain scalar Python: values directly, gradients by central finite
differences of the value (ppo, dro, importance_sampling), or by the documented stop-gradient
rule (cispo, whose gradient is not the derivative of its value). A second property holds every
analytic gradient to a finite difference of the module's own term, for any bounds and beta.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from searchr1.core import update
from searchr1.core.objective import (
    LOSS_CONFIG_DEFAULTS,
    POLICY_LOSS_FNS,
    LossConfigError,
    loss_terms,
    resolve_loss_config,
)

LOW, HIGH, BETA = 0.8, 1.2, 0.3
LOSSES = ("importance_sampling", "ppo", "cispo", "dro", "cross_entropy")


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


@pytest.mark.parametrize("loss", POLICY_LOSS_FNS)
@settings(max_examples=150, deadline=None)
@given(q=logprobs, log_ratio=log_ratios, a=advantages)
@example(q=-1.0, log_ratio=0.5, a=1.0)  # ppo: above hi with A > 0, clipped and frozen
@example(q=-1.0, log_ratio=-0.5, a=-1.0)  # ppo: below lo with A < 0, clipped and frozen
@example(q=-1.0, log_ratio=0.5, a=-1.0)  # ppo: above hi with A < 0, unclipped wins
def test_each_loss_value_and_gradient_equal_the_documented_formula_for_any_ratio_and_advantage_sign(
        loss, q, log_ratio, a):
    logp = q + log_ratio
    r = math.exp(log_ratio)
    assume(min(abs(r - LOW), abs(r - HIGH)) > 1e-4)  # finite differences need to stay off the kinks
    config = resolve_loss_config(loss, CONFIG[loss])
    terms, slopes = loss_terms(loss, config, np.array([logp]), np.array([q]), np.array([a]), np.ones(1))
    assert terms[0] == pytest.approx(reference_value(loss, logp, q, a), rel=1e-9, abs=1e-12)
    assert slopes[0] == pytest.approx(reference_gradient(loss, logp, q, a), rel=1e-5, abs=1e-7)


positions = st.lists(st.tuples(st.floats(-20.0, 0.0), st.floats(-3.0, 3.0), st.floats(-5.0, 5.0),
                               st.floats(0.0, 3.0)), min_size=1, max_size=8)


@pytest.mark.parametrize("loss", LOSSES)
@settings(max_examples=100, deadline=None)
@given(rows=positions, low=st.floats(0.0, 1.5), width=st.floats(0.0, 1.5), beta=st.floats(0.0, 2.0))
def test_every_analytic_gradient_is_the_finite_difference_of_its_own_term_for_any_bounds_and_beta(
        loss, rows, low, width, beta):
    """``d term / d logp`` at every position, for any aligned arrays and any valid configuration.
    cispo's clipped ratio is a stop-gradient weight: its gradient is the difference with the
    ratio held, i.e. with ``logp`` and ``q`` moved together."""
    q, log_ratio, a, w = (np.array(column) for column in zip(*rows))
    logp = q + log_ratio
    given_config = {"importance_sampling": {}, "cross_entropy": {}, "dro": {"beta": beta}}.get(
        loss, {"clip_low_threshold": low, "clip_high_threshold": low + width})
    config = resolve_loss_config(loss, given_config)
    if loss == "ppo":  # finite differences need to stay off its kinks
        assume(np.min(np.abs(np.exp(log_ratio)[:, None] - [low, low + width])) > 1e-4)
    h = 1e-6
    shift = h if loss == "cispo" else 0.0
    terms, slopes = loss_terms(loss, config, logp, q, a, w)
    up = loss_terms(loss, config, logp + h, q + shift, a, w)[0]
    down = loss_terms(loss, config, logp - h, q - shift, a, w)[0]
    assert terms.shape == slopes.shape == logp.shape
    np.testing.assert_allclose(slopes, (up - down) / (2 * h), rtol=1e-5, atol=1e-5)


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


def test_the_defaults_are_the_documented_ones_and_every_policy_loss_has_them():
    """Tinker's ratio bounds for ppo and cispo, its example's beta for dro; the names the settings
    offer (also importable from ``searchr1.core.update``) are all defined here."""
    assert update.POLICY_LOSS_FNS is POLICY_LOSS_FNS and update.DEFAULT_LOSS_FN in POLICY_LOSS_FNS
    assert set(POLICY_LOSS_FNS) | {"cross_entropy"} == set(LOSS_CONFIG_DEFAULTS)
    for loss in ("ppo", "cispo"):
        assert resolve_loss_config(loss, None) == {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    assert resolve_loss_config(" DRO ", {}) == {"beta": 0.05}
    assert resolve_loss_config("ppo", {"clip_high_threshold": 2}) == {"clip_low_threshold": 0.8,
                                                                      "clip_high_threshold": 2.0}


def test_without_strict_an_unknown_key_is_ignored_but_a_known_one_still_applies_and_is_checked():
    lenient = resolve_loss_config("ppo", {"clip_ratio": 0.2, "clip_low_threshold": 0.5}, strict=False)
    assert lenient == {"clip_low_threshold": 0.5, "clip_high_threshold": 1.2}
    with pytest.raises(LossConfigError, match="finite number"):
        resolve_loss_config("dro", {"junk": 1, "beta": math.inf}, strict=False)


@pytest.mark.parametrize(("loss", "config", "named"), [
    ("gspo", {}, "gspo"),
    ("ppo", {"clip_ratio": 0.2}, "clip_low_threshold, clip_high_threshold"),
    ("importance_sampling", {"beta": 0.1}, "no keys"),
    ("ppo", {"clip_low_threshold": 1.3}, "clip_low_threshold <= clip_high_threshold"),
    ("cispo", {"clip_low_threshold": -0.1}, "0 <= clip_low_threshold"),
    ("dro", {"beta": "big"}, "finite number"),
    ("dro", {"beta": True}, "finite number"),
    ("dro", {"beta": -0.1}, "beta >= 0"),
])
def test_a_loss_or_config_the_objective_does_not_define_is_refused_with_what_it_takes(loss, config, named):
    with pytest.raises(LossConfigError) as refused:
        resolve_loss_config(loss, config)
    assert named in str(refused.value)


def test_loss_terms_refuses_a_loss_it_does_not_define():
    with pytest.raises(LossConfigError, match="gspo"):
        loss_terms("gspo", {}, np.zeros(1), np.zeros(1), np.ones(1), np.ones(1))
