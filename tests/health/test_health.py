"""The step's health diagnostics, the health rules, the collapse guard and the choice of the
last healthy checkpoint: pure functions checked against hand computations on small batches,
and the trainer's update refusing non-finite values before optim_step."""

from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pytrio.types import Datum, ModelInput, TensorData

from searchr1.core.types import SearchExample, Trajectory, Turn
from searchr1.core.datum import NonFiniteValues, TrainingDatum, build_training_datums
from searchr1.core.update import (
    TrainedTokens,
    UpdateConfig,
    apply_update,
    learner_tokens,
    non_finite_inputs,
    non_finite_outputs,
)
from searchr1.health.diagnostics import (
    clip_bounds,
    entropy_estimate,
    mismatch_metrics,
    nearest_rank_percentile,
    policy_diagnostics,
    repeated_turn_share,
)
from searchr1.health.rules import (
    DEFAULT_RULES,
    CollapseGuard,
    best_rolling_mean,
    check_health,
    configured_rules,
    last_healthy_checkpoint,
    parse_rule_override,
    reward_drop,
)

EXAMPLE = SearchExample("q", "Who?", ("x",), "nq")


def trajectory(*turns: tuple[list[int], list[float]]) -> Trajectory:
    t = Trajectory(EXAMPLE, 0, 0, [])
    t.turns = [Turn([1], list(tokens), list(logprobs), "") for tokens, logprobs in turns]
    return t


# --- rollout diagnostics ---------------------------------------------------------------------


def test_entropy_is_the_mean_negative_logprob_over_every_sampled_token():
    batch = [trajectory(([5, 6], [-0.5, -1.5])), trajectory(([7], [-1.0]), ([8, 9, 10], [0.0, -2.0, -1.0]))]
    # tokens: 0.5, 1.5, 1.0, 0.0, 2.0, 1.0 -> 6.0 / 6
    assert entropy_estimate(batch) == pytest.approx(1.0)
    assert entropy_estimate([]) == 0.0


def test_repeated_turns_count_verbatim_repeats_within_one_trajectory_only():
    a, b = ([1, 2], [0.0, 0.0]), ([3], [0.0])
    batch = [trajectory(a, b, a, a), trajectory(a)]  # 2 repeats among 5 turns; the second trajectory's a is new
    assert repeated_turn_share(batch) == pytest.approx(2 / 5)
    assert repeated_turn_share([trajectory(a, b)]) == 0.0


def test_action_tokens_per_trajectory_mean_and_nearest_rank_p95():
    batch = [trajectory(([0] * n, [0.0] * n)) for n in range(1, 21)]  # 1..20 tokens
    diagnostics = policy_diagnostics(batch)
    assert diagnostics["health/action_tokens_mean"] == pytest.approx(10.5)
    assert diagnostics["health/action_tokens_p95"] == 19  # ceil(0.95 * 20) = 19th smallest
    two_turns = trajectory(([1, 2, 3], [0.0] * 3), ([4, 5], [0.0] * 2))
    assert policy_diagnostics([two_turns])["health/action_tokens_mean"] == 5


@given(st.lists(st.integers(0, 1000), min_size=1, max_size=60), st.floats(1, 100))
def test_the_nearest_rank_percentile_is_a_value_with_at_least_that_share_at_or_below_it(values, percent):
    result = nearest_rank_percentile(values, percent)
    assert result in values
    assert sum(v <= result for v in values) >= percent / 100 * len(values)
    assert sum(v < result for v in values) < percent / 100 * len(values)


# --- sampler-learner mismatch ----------------------------------------------------------------


def tokens_by_hand() -> list[TrainedTokens]:
    # position 2 is an observation token (advantage 0): left out
    return [TrainedTokens.of_datum(sampled=[-1.0, -2.0, 0.0], learned=[-1.5, -1.0, -7.0], advantages=[1.0, -1.0, 0.0])]


def test_mismatch_k1_k3_and_the_largest_ratio_deviation_by_hand():
    metrics = mismatch_metrics(tokens_by_hand())
    r1, r2 = math.exp(-0.5), math.exp(1.0)  # exp(learned - sampled)
    assert metrics["health/mismatch_k1"] == pytest.approx((0.5 + -1.0) / 2)
    assert metrics["health/mismatch_k3"] == pytest.approx(((r1 - 1 + 0.5) + (r2 - 1 - 1.0)) / 2)
    assert metrics["health/ratio_max_deviation"] == pytest.approx(r2 - 1)
    assert "health/clipped_fraction" not in metrics  # importance_sampling does not clip


logprob_pairs = st.lists(st.tuples(st.floats(-20, 0), st.floats(-20, 0)), min_size=1, max_size=30)


@given(logprob_pairs)
def test_k3_is_never_negative_and_every_mismatch_vanishes_when_sampler_and_learner_agree(pairs):
    sampled, learned = [p[0] for p in pairs], [p[1] for p in pairs]
    metrics = mismatch_metrics([TrainedTokens.of_datum(sampled, learned, [1.0] * len(pairs))])
    assert metrics["health/mismatch_k3"] >= 0
    same = mismatch_metrics([TrainedTokens.of_datum(sampled, sampled, [1.0] * len(pairs))], loss_fn="ppo")
    assert same == {"health/mismatch_k1": 0.0, "health/mismatch_k3": 0.0, "health/ratio_max_deviation": 0.0,
                    "health/clipped_fraction": 0.0}


def test_clipped_fraction_follows_each_loss_and_its_configured_ratio_bounds():
    tokens = tokens_by_hand()  # ratios 0.61 (A > 0) and 2.72 (A < 0)
    # ppo clips a ratio only on the side its advantage pushes: neither token here
    assert mismatch_metrics(tokens, loss_fn="ppo")["health/clipped_fraction"] == 0.0
    # cispo clips the weight of every ratio outside [0.8, 1.2]: both
    assert mismatch_metrics(tokens, loss_fn="cispo")["health/clipped_fraction"] == 1.0
    wide = {"clip_low_threshold": 0.5, "clip_high_threshold": 2.0}
    assert mismatch_metrics(tokens, loss_fn="cispo", loss_fn_config=wide)["health/clipped_fraction"] == 0.5
    pushed = [TrainedTokens.of_datum([-1.0, -1.0], [-0.5, -1.5], [1.0, -1.0])]  # ratios 1.65 (A>0), 0.61 (A<0)
    assert mismatch_metrics(pushed, loss_fn="ppo")["health/clipped_fraction"] == 1.0
    assert clip_bounds("importance_sampling", wide) is None and clip_bounds("ppo", None) == (0.8, 1.2)


def test_no_trained_token_means_no_mismatch_metrics():
    assert mismatch_metrics([]) == {}
    assert mismatch_metrics([TrainedTokens.of_datum([0.0], [0.0], [0.0])]) == {}


def datum(logprobs, advantages, question=3, group=1) -> TrainingDatum:
    n = len(logprobs)
    built = Datum(model_input=ModelInput.from_ints(list(range(1, n + 1))), loss_fn_inputs={
        "target_tokens": TensorData.from_numpy(np.arange(2, n + 2, dtype=np.int64)),
        "logprobs": TensorData.from_numpy(np.asarray(logprobs, np.float32)),
        "advantages": TensorData.from_numpy(np.asarray(advantages, np.float32)),
    })
    return TrainingDatum(built, n, int(np.count_nonzero(advantages)), question, group)


def test_the_learners_logprobs_are_read_from_loss_fn_outputs_per_datum():
    sent = [datum([0.0, -1.0], [0.0, 1.0]), datum([-2.0, 0.0], [1.0, 0.0])]
    outputs = [{"logprobs": TensorData.from_numpy(np.asarray([-9.0, -1.25], np.float32))},
               {"logprobs": TensorData.from_numpy(np.asarray([-1.5, -9.0], np.float32))}]
    tokens = learner_tokens([d.datum for d in sent], outputs)
    assert [list(t.learned) for t in tokens] == [[-1.25], [-1.5]]
    assert mismatch_metrics(tokens)["health/mismatch_k1"] == pytest.approx((0.25 + -0.5) / 2)
    assert learner_tokens([d.datum for d in sent], [{}, {}]) == []  # a server that returns no logprobs


def test_non_finite_values_are_named_where_they_are():
    assert non_finite_inputs([datum([0.0, -1.0], [0.0, 1.0])]) is None
    found = non_finite_inputs([datum([0.0, -1.0], [0.0, 1.0]), datum([0.0, 0.0], [0.0, float("nan")], 4, 2)])
    assert found is not None and "q4/g2" in found and "advantages[1]" in found
    assert "loss_sum" in non_finite_outputs([{"loss_sum": float("inf"), "token_count": 3}], [])
    assert "logprobs[1]" in non_finite_outputs([{"loss_sum": 1.0}], [np.array([-1.0, np.nan])])
    assert non_finite_outputs([{"loss_sum": 1.0}], [np.array([-1.0])]) is None


def test_a_non_finite_sampler_logprob_is_named_only_where_it_would_be_trained():
    trained = trajectory(([5, 6], [-0.5, float("-inf")]))
    trained.group_index = 3
    trained.credit(0.5)
    with pytest.raises(NonFiniteValues, match="q0/g3 turn 0: the sampler's logprob of token 1") as caught:
        build_training_datums([trajectory(([1], [0.0])), trained])
    assert "nothing was sent to forward_backward" in str(caught.value)
    trained.credit(0.0)  # sends no datum: nothing to stop for
    assert build_training_datums([trained]) == []


class StubTrainingClient:
    """forward_backward answers with the given loss and learner logprobs; optim_step is counted."""

    def __init__(self, loss: float, learned: list[float]) -> None:
        self.loss, self.learned, self.optim_steps, self.loss_fns = loss, learned, 0, []

    async def forward_backward_async(self, data, loss_fn, **options):
        self.loss_fns.append((loss_fn, options))
        result = SimpleNamespace(metrics={"loss_sum": self.loss, "token_count": 1.0, "loss_mean": self.loss},
                                 loss_fn_outputs=[{"logprobs": TensorData.from_numpy(np.asarray(self.learned, np.float32))}])
        return asyncio.sleep(0, result)

    async def optim_step_async(self, adam):
        self.optim_steps += 1
        return asyncio.sleep(0, SimpleNamespace(metrics={"grad_norm": 1.0}))


def update(client: StubTrainingClient, config: UpdateConfig):
    return asyncio.run(apply_update(client, [[datum([0.0, -1.0], [0.0, 1.0])]], config))


ADAM = dict(learning_rate=4e-5, beta1=0.9, beta2=0.95)


def test_a_non_finite_loss_stops_the_update_before_optim_step():
    client = StubTrainingClient(float("nan"), [0.0, -1.0])
    with pytest.raises(NonFiniteValues, match="loss_mean = nan; optim_step was not called"):
        update(client, UpdateConfig(**ADAM))
    assert client.optim_steps == 0
    nan_logprob = StubTrainingClient(0.5, [0.0, float("inf")])
    with pytest.raises(NonFiniteValues, match="logprobs"):
        update(nan_logprob, UpdateConfig(**ADAM))
    assert nan_logprob.optim_steps == 0


def test_the_update_reports_mismatch_and_sends_the_configured_loss():
    client = StubTrainingClient(0.5, [-7.0, -0.5])
    result = update(client, UpdateConfig(**ADAM))
    assert client.optim_steps == 1 and result.calls == 1
    assert mismatch_metrics(result.tokens)["health/mismatch_k1"] == pytest.approx(-0.5)  # sampled -1.0, learned -0.5
    assert client.loss_fns == [("importance_sampling", {})]
    bounds = {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}
    client = StubTrainingClient(0.5, [-7.0, -0.5])
    result = update(client, UpdateConfig(**ADAM, loss_fn="cispo", loss_fn_config=bounds))
    assert client.loss_fns == [("cispo", {"loss_fn_config": bounds})]
    metrics = mismatch_metrics(result.tokens, loss_fn="cispo", loss_fn_config=bounds)
    assert metrics["health/clipped_fraction"] == 1.0  # ratio exp(0.5) = 1.65 > 1.1


# --- rules and the guard ---------------------------------------------------------------------


def test_each_rule_fires_on_its_side_of_the_threshold_and_names_rule_value_and_threshold():
    healthy = {"reward/format": 0.5, "rollout/termination/answer": 0.9, "health/entropy": 0.3,
               "health/mismatch_k3": 0.01, "health/repeated_turn_share": 0.0, "health/reward_drop": 0.1}
    assert check_health(healthy, DEFAULT_RULES) == []
    broken = {**healthy, "reward/format": 0.05, "health/mismatch_k3": 0.2}
    found = check_health(broken, DEFAULT_RULES)
    assert [v.rule.name for v in found] == ["format_valid_rate", "mismatch_k3"]
    assert found[0].describe() == "format_valid_rate 0.05 < 0.1 (reward/format)"
    assert found[1].describe() == "mismatch_k3 0.2 > 0.1 (health/mismatch_k3)"
    assert [v.rule.name for v in check_health({"health/entropy": float("nan")}, DEFAULT_RULES)] == ["entropy"]
    assert check_health({}, DEFAULT_RULES) == []  # nothing measured, nothing judged


def test_thresholds_can_be_changed_or_turned_off_by_name():
    assert parse_rule_override("entropy=0.05") == ("entropy", 0.05)
    assert parse_rule_override("mismatch_k3=off") == ("mismatch_k3", None)
    rules = {r.name: r for r in configured_rules({"entropy": 0.05, "mismatch_k3": None})}
    assert rules["entropy"].threshold == 0.05 and "mismatch_k3" not in rules
    for bad in ("entropy", "nope=1", "entropy=high", "entropy=nan"):
        with pytest.raises(ValueError, match="--health-rule"):
            parse_rule_override(bad)
    with pytest.raises(ValueError, match="unknown health rule"):
        configured_rules({"nope": 1.0})  # the training run checks its config's rules so


def test_reward_drop_is_measured_against_the_best_rolling_mean_of_earlier_steps():
    rewards = [0.0, 0.2, 0.4, 0.6, 0.8, 0.6, 0.4]
    # windows of 5: 0.4, 0.52, 0.56 -> best 0.56
    assert best_rolling_mean(rewards) == pytest.approx(0.56)
    assert reward_drop(rewards, -0.1) == pytest.approx(0.66)
    assert reward_drop(rewards[:4], -0.1) is None  # fewer steps than the window


def test_the_guard_counts_consecutive_unhealthy_steps_and_asks_to_stop_after_n():
    guard = CollapseGuard(DEFAULT_RULES, stop_after=2)
    bad, good = {"reward/format": 0.0}, {"reward/format": 0.9}
    assert [(v.streak, v.stop) for v in (guard.observe(dict(m)) for m in (bad, good, bad, bad))] == [
        (1, False), (0, False), (1, False), (2, True)]
    never = CollapseGuard(DEFAULT_RULES, stop_after=0)
    assert not any(never.observe(dict(bad)).stop for _ in range(5))
    resumed = CollapseGuard(DEFAULT_RULES, stop_after=2, history=[{"health/unhealthy": 1.0, "reward/mean": 0.1}])
    assert resumed.observe(dict(bad)).stop  # the streak carries over a resume


def test_the_guard_adds_the_reward_drop_once_it_has_a_window_of_history():
    guard = CollapseGuard(DEFAULT_RULES, history=[{"reward/mean": 0.8}] * 5)
    metrics = {"reward/mean": 0.1}
    verdict = guard.observe(metrics)
    assert metrics["health/reward_drop"] == pytest.approx(0.7)
    assert [v.rule.name for v in verdict.violations] == ["reward_drop"]


@given(steps=st.lists(st.tuples(st.floats(0.9, 1.0), st.floats(0.9, 1.0), st.floats(0.0, 9.9e-5)),
                      min_size=1, max_size=40))
def test_a_certain_policy_whose_reward_and_format_hold_is_never_unhealthy(steps):
    """Invariant: entropy below its threshold does not count on any step whose reward and format
    stay within FALL_MARGIN of their best rolling means (a converged run)."""
    guard = CollapseGuard(DEFAULT_RULES, stop_after=1)
    for reward, format_rate, entropy in steps:
        line = {"reward/mean": reward, "reward/format": format_rate, "rollout/termination/answer": 1.0,
                "health/entropy": entropy}
        verdict = guard.observe(line)
        assert not verdict.unhealthy and not verdict.stop, verdict.warnings()


def test_low_entropy_counts_once_the_reward_or_the_format_falls():
    converged = [{"reward/mean": 1.0, "reward/format": 1.0, "health/entropy": 5e-5}] * 5
    rules = configured_rules({"reward_drop": None})  # the entropy rule on its own
    falling_reward = CollapseGuard(rules, history=converged).observe(
        {"reward/mean": 0.8, "reward/format": 1.0, "health/entropy": 5e-5})
    assert [v.rule.name for v in falling_reward.violations] == ["entropy"]
    assert falling_reward.warnings() == ["entropy 5e-05 < 0.0001 (health/entropy) while reward or format falls"]
    falling_format = {"reward/mean": 1.0, "reward/format": 0.85, "health/entropy": 5e-5}
    verdict = CollapseGuard(rules, history=converged).observe(falling_format)
    assert falling_format["health/format_drop"] == pytest.approx(0.15)
    assert [v.rule.name for v in verdict.violations] == ["entropy"]
    holding = CollapseGuard(rules, history=converged).observe(
        {"reward/mean": 0.95, "reward/format": 0.95, "health/entropy": 5e-5})
    assert not holding.unhealthy  # 0.05 below the best: within FALL_MARGIN
    assert check_health({"health/entropy": float("nan")}, rules)  # a non-finite entropy counts on any step


def checkpoint(step: int) -> dict:
    return {"step": step, "name": f"c{step}", "state_path": f"trio://c{step}"}


def test_the_last_healthy_checkpoint_precedes_the_streak_and_sampled_a_healthy_batch():
    lines = [{"step": s, "health/unhealthy": float(s in (2, 5, 6))} for s in range(7)]
    checkpoints = [checkpoint(s) for s in range(1, 7)]
    # the streak starts at 5; checkpoint 4 sampled step 4 (healthy)
    assert last_healthy_checkpoint(checkpoints, lines, before_step=5)["step"] == 4
    # off-policy by 1: checkpoint K first samples step K + 1; 3 -> 4 healthy, 4 -> 5 not
    assert last_healthy_checkpoint(checkpoints, lines, before_step=5, max_steps_off_policy=1)["step"] == 3
    # checkpoint 2 sampled the unhealthy step 2 and is skipped
    assert last_healthy_checkpoint([checkpoint(1), checkpoint(2)], lines, before_step=5)["step"] == 1
    assert last_healthy_checkpoint([checkpoint(5)], lines, before_step=5) is None
