"""The loss-reduction probe identifies every reduction of the twin, with few calls, through
the real pytrio client."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from pytrio.errors.auth import AuthError
from twin_support import running_twin

from searchr1.cli import main
from searchr1.tools.probe_loss import (
    PROBE_ANSWER_TOKENS,
    PROBE_PROMPT,
    ProbeReport,
    classify_accumulation,
    classify_reduction,
    find_grad_norm_key,
    probe_loss,
    read_loss_probe,
)


@pytest.mark.slow  # a twin and a probe run per reduction (seconds in all)
@pytest.mark.parametrize("reduction", ["per_token", "per_sample", "sum"])
@pytest.mark.parametrize("accumulation", ["sum", "mean"])
def test_the_probe_identifies_each_twin_reduction(tmp_path, tokenizer, reduction, accumulation):
    with running_twin(tmp_path, tokenizer, reduction=reduction, accumulation=accumulation) as (twin, service):
        report = probe_loss(service, tokenizer=tokenizer)
        events = Counter(e.type.removeprefix("trainer.") for e in twin.event_log)
        samples = twin.sample_log
    assert (report.reduction, report.accumulation) == (reduction, accumulation)
    assert report.nk_over_n_exact == (reduction == "per_sample" and accumulation == "sum")
    answer = samples[0].output_tokens[0]
    assert answer == PROBE_ANSWER_TOKENS
    assert report.token_count_full == len(tokenizer.encode(PROBE_PROMPT)) + answer - 1
    assert report.token_count_masked == answer
    assert report.masked_targets_ignored
    # the minimum: one training run, one sampler for the action tokens, a handful of tiny calls
    assert events["init_run"] == 1 and events["save_weights"] == 1 and len(samples) == 1
    assert events["forward"] == 2
    assert events["forward_backward"] == (4 if reduction == "sum" else 5)
    assert events["optimize_step"] == (3 if reduction == "sum" else 4)


def test_without_a_gradient_norm_the_probe_stops_undetermined(tmp_path, tokenizer):
    with running_twin(tmp_path, tokenizer, reduction="per_sample", report_grad_norm=False) as (twin, service):
        report = probe_loss(service, tokenizer=tokenizer)
        events = Counter(e.type.removeprefix("trainer.") for e in twin.event_log)
    assert report.reduction == report.accumulation == "undetermined"
    assert report.nk_over_n_exact is None and report.grad_norm_key is None
    assert events["forward_backward"] == 1 and events["optimize_step"] == 1
    assert "no usable gradient norm" in report.render()


@given(st.floats(0.96, 1.04), st.floats(0.05, 0.4))
def test_classification_of_a_mean(ratio_double, per_token_ratio):
    assert classify_reduction(ratio_double, 0.5, per_token_ratio) == "per_sample"
    assert classify_reduction(ratio_double, per_token_ratio, per_token_ratio) == "per_token"
    assert classify_reduction(ratio_double, 1.0, per_token_ratio) == "per_advantage_token"
    assert classify_reduction(ratio_double, 0.75, per_token_ratio) == "undetermined"


@given(st.floats(1.91, 2.09))
def test_classification_of_a_sum(ratio):
    assert classify_reduction(ratio, None, 0.25) == "sum"
    assert classify_accumulation(ratio) == "sum"


def test_ambiguous_or_odd_ratios_are_undetermined():
    assert classify_reduction(1.5, None, 0.25) == "undetermined"
    assert classify_reduction(1.0, 0.5, 0.5) == "undetermined"  # per token looks like per sample
    assert classify_accumulation(1.0) == "mean"
    assert classify_accumulation(3.0) == "undetermined"


def test_grad_norm_key_detection():
    assert find_grad_norm_key({"lr": 1.0, "optim/grad_norm": 2.0}) == "optim/grad_norm"
    assert find_grad_norm_key({"gradNorm": 1.0}) == "gradNorm"
    assert find_grad_norm_key({"loss": 1.0}) is None


def test_report_renders_every_conclusion():
    report = ProbeReport(
        base_model="m",
        token_count_full=10,
        token_count_masked=3,
        masked_targets_ignored=True,
        grad_norm_key="grad_norm",
        norms={"[d]": 1.0},
        reduction="per_sample",
        accumulation="sum",
    )
    text = report.render()
    assert "per_sample" in text and "n_k/N reweighting exact:      yes" in text
    assert "-100 targets are ignored" in text


# --- the command ----------------------------------------------------------------------------


def test_offline_command_reports_the_twins_reduction_and_its_losses_as_documented(tokenizer):
    result = CliRunner().invoke(main, ["probe-loss", "--offline", "--twin-reduction", "per_sample"])
    assert result.exit_code == 0, result.output
    assert "reduction within a call:      per_sample" in result.output
    assert "n_k/N reweighting exact:      yes" in result.output
    assert "ppo   upper clip at r=1.5, A=+1: 1.2 (documented 1.2: as documented)" in result.output
    assert "cispo |grad| of the same tokens" in result.output and "DIFFERS" not in result.output
    assert "dro   beta of the quadratic term: 0.05" in result.output


def test_the_loss_probe_reads_other_bounds_and_beta_through_a_normalised_loss_sum():
    """A service that clips at [0.7, 1.28], uses beta 0.1, divides loss_sum by 10 and gives
    clipped ppo tokens a gradient: the probe reads each value back and says what differs."""
    n, logp_sum, scale = 4, -6.0, 0.1
    sums = {"is_high": scale * -1.5 * n, "ppo_high": scale * -1.28 * n, "ppo_low": scale * 0.7 * n,
            "cispo_high": scale * -1.28 * logp_sum, "dro": scale * 0.5 * 0.1 * n * math.log(1.5) ** 2}
    found = read_loss_probe(sums, action_logprob_sum=logp_sum, action_tokens=n,
                            grad_norms={"ppo": 0.3, "cispo": 0.2})
    assert (found.ppo_high, found.ppo_low, found.cispo_high) == pytest.approx((1.28, 0.7, 1.28))
    assert found.dro_beta == pytest.approx(0.1)
    assert found.agreements() == {"ppo_high": False, "ppo_low": False, "cispo_high": False,
                                  "ppo_clipped_no_gradient": False, "cispo_clipped_keeps_gradient": True}
    assert "DIFFERS" in found.render() and "normalised sum" in found.render()


def test_the_loss_probe_without_gradient_norms_leaves_the_gradient_questions_open():
    found = read_loss_probe({"is_high": -6.0, "ppo_high": -4.8}, action_logprob_sum=-3.0, action_tokens=4,
                            grad_norms={"ppo": None, "cispo": None})
    assert found.ppo_high == pytest.approx(1.2) and found.agreements()["ppo_clipped_no_gradient"] is None
    assert found.cispo_high is None and "not observed" in found.render()


def test_live_command_without_a_key_is_one_clear_line(monkeypatch, tmp_path):
    monkeypatch.delenv("PYTRIO_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.pytrio profile either
    result = CliRunner().invoke(main, ["probe-loss"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        "Error: no PyTRIO API key: set PYTRIO_API_KEY or run `trio login` "
        "(or use --offline to run against the offline twin)"
    ]


def test_live_command_asks_before_spending_and_never_prints_the_key(monkeypatch):
    import pytrio

    secret = "sk-test-very-secret-123"
    monkeypatch.setenv("PYTRIO_API_KEY", secret)
    constructed = []

    def refuse(api_key=None):
        constructed.append(api_key)
        raise AuthError(f"Login failed for key {api_key}", code="auth.login_failed")

    monkeypatch.setattr(pytrio, "ServiceClient", refuse)
    declined = CliRunner().invoke(main, ["probe-loss"], input="n\n")
    assert declined.exit_code == 1 and constructed == []
    result = CliRunner().invoke(main, ["probe-loss", "--yes"])
    assert constructed == [None]  # the SDK reads the key itself; we never pass it around
    assert result.exit_code == 1
    assert secret not in result.output and "Traceback" not in result.output
    assert result.output.strip().splitlines() == [
        "connecting to PyTRIO at https://pytrio.com...",
        "Error: cannot connect to PyTRIO at https://pytrio.com (auth.login_failed); check the key and the network",
    ]
