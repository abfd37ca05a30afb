"""The algorithm options: --loss-fn-config parsing, the KL penalty's arithmetic, dynamic
sampling's group selection, and the flags refused in one line (the learning runs with each
option are in test_algorithm_runs.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from pytrio.types import Datum, ModelInput, TensorData
from training_strategies import plain_trajectory

from searchr1.core.advantage import assign_group_advantages
from searchr1.core.types import Exclusion
from searchr1.cli import main
from searchr1.core.datum import TrainingDatum
from searchr1.training.dynamic_sampling import signal_groups, surplus_groups
from searchr1.core.kl import aligned_base_logprobs, base_prompt, kl_estimate, penalize
from searchr1.run.algorithm import parse_loss_fn_config

# --- --loss-fn-config ----------------------------------------------------------------------


def test_loss_fn_config_values_are_parsed_as_numbers_booleans_or_text():
    parsed = parse_loss_fn_config(["clip_low_threshold=0.8", "steps=3", "flag=true", "mode=token-mean"])
    assert parsed == {"clip_low_threshold": 0.8, "steps": 3, "flag": True, "mode": "token-mean"}
    assert isinstance(parsed["steps"], int) and isinstance(parsed["clip_low_threshold"], float)


@pytest.mark.parametrize(("items", "message"), [
    (["clip"], "expected KEY=VALUE"), (["=1"], "expected KEY=VALUE"), (["a=1", "a=2"], "given twice"),
    (["beta=nan"], "not a finite number"),
])
def test_a_malformed_loss_fn_config_names_the_item(items, message):
    with pytest.raises(ValueError, match=message):
        parse_loss_fn_config(items)


# --- KL penalty ----------------------------------------------------------------------------


def datum(advantages, logprobs) -> TrainingDatum:
    n = len(advantages)
    return TrainingDatum(
        datum=Datum(model_input=ModelInput.from_ints(list(range(10, 10 + n))), loss_fn_inputs={
            "target_tokens": TensorData.from_numpy(np.arange(11, 11 + n, dtype=np.int64)),
            "logprobs": TensorData.from_numpy(np.asarray(logprobs, np.float32)),
            "advantages": TensorData.from_numpy(np.asarray(advantages, np.float32)),
        }),
        num_tokens=n, loss_tokens=int(np.count_nonzero(advantages)), question_index=0, group_index=0)


@given(st.floats(-5, 5), st.floats(-5, 5))
def test_k3_is_never_negative_and_both_estimators_are_zero_when_policy_and_base_agree(logp, base):
    k3 = kl_estimate(np.array([logp]), np.array([base]), "k3")[0]
    assert k3 >= 0.0
    assert k3 == pytest.approx(math.exp(base - logp) - (base - logp) - 1, abs=1e-9)
    assert kl_estimate(np.array([logp]), np.array([base]), "k1")[0] == pytest.approx(logp - base)
    assert kl_estimate(np.array([logp]), np.array([logp]), "k3")[0] == 0.0


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(-2, 2).filter(lambda a: abs(a) > 0.01), st.floats(-3, 0), st.floats(-3, 0)),
                min_size=2, max_size=12), st.floats(0.0, 1.0), st.sampled_from(["k1", "k3"]))
def test_the_penalty_is_centred_touches_only_action_tokens_and_vanishes_with_beta_zero(rows, coef, estimator):
    advantages = [0.0] + [a for a, _, _ in rows] + [0.0]  # a prompt and an observation position
    sampler = [0.0] + [s for _, s, _ in rows] + [0.0]
    base = np.asarray([-1.0] + [b for _, _, b in rows] + [-2.0])
    item = datum(advantages, sampler)
    (out,), metrics = penalize([item], [base], coef=coef, estimator=estimator)
    new = out.datum.loss_fn_inputs["advantages"].to_numpy().astype(np.float64)
    old = item.datum.loss_fn_inputs["advantages"].to_numpy().astype(np.float64)
    assert new[0] == 0.0 and new[-1] == 0.0
    kl = kl_estimate(np.asarray(sampler, np.float32)[1:-1], base[1:-1], estimator)
    assert metrics["kl/policy_base"] == pytest.approx(kl.mean(), abs=1e-9)
    expected = old[1:-1] - coef * (kl - kl.mean())
    np.testing.assert_allclose(new[1:-1], expected, rtol=1e-5, atol=1e-5)
    assert math.fsum(new[1:-1] - old[1:-1]) == pytest.approx(0.0, abs=1e-4)  # centred
    if coef == 0.0:
        assert np.array_equal(new, old)


def test_the_penalty_over_several_datums_is_centred_on_the_steps_mean_and_its_metrics_add_up():
    """Worked by hand: two datums, three action tokens, k1 with d = (0.5, -0.5, 1.0); the mean
    is 1/3, the penalties 0.2 * (d - 1/3)."""
    first = TrainingDatum(**{**vars(datum([0.0, 1.0, -2.0], [0.0, -0.5, -1.5])), "question_index": 3,
                             "group_index": 1})
    second = datum([1.0, 0.0], [-1.0, -9.0])
    base = [np.array([-7.0, -1.0, -1.0]), np.array([-2.0, -9.0])]
    (one, two), metrics = penalize([first, second], base, coef=0.2, estimator="k1")
    d = np.array([0.5, -0.5, 1.0])
    penalty = 0.2 * (d - d.mean())
    np.testing.assert_allclose(one.datum.loss_fn_inputs["advantages"].to_numpy(),
                               [0.0, 1.0 - penalty[0], -2.0 - penalty[1]], rtol=1e-6)
    np.testing.assert_allclose(two.datum.loss_fn_inputs["advantages"].to_numpy(), [1.0 - penalty[2], 0.0], rtol=1e-6)
    k3 = np.expm1(-d) + d
    assert metrics == pytest.approx({"kl/policy_base": d.mean(), "kl/policy_base_k1": d.mean(),
                                     "kl/policy_base_k3": k3.mean(), "kl/action_tokens": 3.0,
                                     "kl/penalty_share": np.abs(penalty).sum() / 4.0})
    assert penalize([first, second], base, coef=0.2, estimator="k3")[1]["kl/policy_base"] == pytest.approx(k3.mean())
    assert (one.question_index, one.group_index, one.num_tokens, one.loss_tokens) == (3, 1, 3, 2)
    assert two.loss_tokens == 1 and two.datum.model_input.to_ints() == second.datum.model_input.to_ints()
    assert one.datum.loss_fn_inputs["target_tokens"].data == first.datum.loss_fn_inputs["target_tokens"].data
    assert one.datum.loss_fn_inputs["advantages"].dtype == "float32"


def test_the_penalty_refuses_misaligned_inputs_and_leaves_datums_without_action_tokens_alone():
    item = datum([0.0, 1.0], [0.0, -1.0])
    with pytest.raises(ValueError, match=r"^1 datums but 2 base logprob arrays$"):
        penalize([item], [np.zeros(2), np.zeros(2)], coef=0.1, estimator="k1")
    with pytest.raises(ValueError, match=r"^datum q0/g0: 3 base logprobs for 2 positions$"):
        penalize([item], [np.zeros(3)], coef=0.1, estimator="k1")
    cancelled, _ = penalize([datum([0.5, 1.0], [-0.5, -1.5])], [np.array([-1.0, -1.0])], coef=1.0, estimator="k1")
    assert cancelled[0].loss_tokens == 1  # d = (0.5, -0.5): the first advantage is cancelled exactly
    silent = datum([0.0, 0.0], [0.0, -1.0])
    assert penalize([silent], [np.zeros(2)], coef=0.5, estimator="k3") == ([silent], {})
    with pytest.raises(ValueError, match="unknown KL estimator 'k2'"):
        penalize([item], [np.zeros(2)], coef=0.1, estimator="k2")


def test_base_logprobs_are_read_one_position_later_than_the_datum_position():
    item = datum([0.0, 1.0, 1.0], [0.0, -0.5, -0.7])
    assert base_prompt(item) == [10, 11, 12, 13]
    aligned = aligned_base_logprobs([None, -1.0, None, -3.0], 3)
    assert aligned.tolist() == [-1.0, 0.0, -3.0]
    assert aligned_base_logprobs([None, -1.0, -2.0, -3.0, -4.0], 2).tolist() == [-1.0, -2.0]  # only what it needs
    with pytest.raises(ValueError, match="3 prompt logprobs for a sequence of 4 tokens"):
        aligned_base_logprobs([None, -1.0, -2.0], 3)


# --- dynamic sampling ------------------------------------------------------------------------


def trajectories(groups):
    return [plain_trajectory(q, g, reward) for q, rewards in enumerate(groups) for g, reward in enumerate(rewards)]


@given(st.lists(st.sampled_from([(1.0, 1.0), (0.0, 0.0), (1.0, 0.0), (0.0, 1.0), (-0.1, 1.0)]),
                min_size=1, max_size=12), st.integers(1, 8))
def test_dynamic_sampling_trains_on_the_first_groups_with_signal_and_no_others(groups, wanted):
    drawn = trajectories(groups)
    surplus, counters = surplus_groups(drawn, wanted)
    assign_group_advantages(drawn, surplus=surplus)  # as the step does with its batch's surplus
    signal = [q for q, rewards in enumerate(groups) if len(set(rewards)) > 1]
    kept = {t.question_index for t in drawn if t.excluded is None and t.advantage != 0.0}
    assert kept == set(signal[:wanted])
    assert all(t.excluded == Exclusion.SURPLUS_GROUP and t.advantage == 0.0 for t in drawn
               if t.question_index in signal[wanted:])
    assert all(t.excluded == Exclusion.DEGENERATE_GROUP for t in drawn if t.question_index not in signal)
    assert counters["dynamic/groups_kept"] + counters["dynamic/groups_dropped"] + \
        counters["dynamic/groups_surplus"] == counters["dynamic/questions_drawn"] == len(groups)
    assert signal_groups(drawn) == len(signal)  # counted on the rewards, before the selection


# --- flags refused in one line -------------------------------------------------------------


@pytest.mark.parametrize(("args", "message"), [
    (["--loss-fn", "ppo", "--loss-fn-config", "clip_ratio=0.2"], "'clip_ratio' is not one 'ppo' takes"),
    (["--loss-fn-config", "beta"], "expected KEY=VALUE"),
    (["--dynamic-sampling", "--max-steps-off-policy", "1"], "--dynamic-sampling needs --max-steps-off-policy 0"),
])
def test_algorithm_flags_that_cannot_run_are_refused_in_one_line_before_anything_runs(tmp_path, args, message):
    result = CliRunner().invoke(main, ["train", "--offline", "--quiet", "--run-dir", str(tmp_path / "run"), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not (tmp_path / "run").exists()


def test_a_run_config_written_before_the_options_existed_reads_as_the_lab_ports_recipe():
    from searchr1.run.algorithm import algorithm_of, describe_algorithm

    assert describe_algorithm(algorithm_of({"max_steps": 3})) == "importance_sampling, advantage mean, reward em"
    changed = algorithm_of({"loss_fn": "ppo", "loss_fn_config": {"clip_high_threshold": 1.28}, "kl_coef": 0.05,
                            "reward": "f1", "dynamic_sampling": True})
    assert describe_algorithm(changed) == ("ppo (clip_high_threshold=1.28), advantage mean, reward f1, "
                                           "KL 0.05 (k3), dynamic sampling")


def test_the_penalised_advantages_are_sent_as_float32():
    item = datum([0.0, 1.0, -1.0], [0.0, -0.5, -1.5])
    (out,), _ = penalize([item], [np.asarray([-1.0, -0.7, -0.1])], coef=0.3, estimator="k3")
    advantages = out.datum.loss_fn_inputs["advantages"]
    assert advantages.dtype == "float32"
    assert all(value == float(np.float32(value)) for value in advantages.data)
