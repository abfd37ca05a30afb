"""The update (:mod:`searchr1.core.update`): what is sent to ``forward_backward`` and
``optim_step``, what comes back, and the refusal of non-finite values before the optimiser."""

from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pytrio.types import Datum, ModelInput, TensorData

from searchr1.core.datum import NonFiniteValues, TrainingDatum
from searchr1.core.update import (TrainedTokens, UpdateConfig, apply_substeps, apply_update, learner_tokens,
                                  non_finite_inputs, non_finite_outputs)


def datum(advantages, logprobs=None, question=0, group=0) -> TrainingDatum:
    n = len(advantages)
    logprobs = [-1.0 - i for i in range(n)] if logprobs is None else logprobs
    built = Datum(model_input=ModelInput.from_ints(list(range(1, n + 1))), loss_fn_inputs={
        "target_tokens": TensorData.from_numpy(np.arange(2, n + 2, dtype=np.int64)),
        "logprobs": TensorData.from_numpy(np.asarray(logprobs, np.float32)),
        "advantages": TensorData.from_numpy(np.asarray(advantages, np.float32)),
    })
    return TrainingDatum(built, n, int(np.count_nonzero(advantages)), question, group)


class Client:
    """A training client that records its calls; ``learned`` maps a datum's first advantage to
    the logprobs it returns (default: the sampler's), ``metrics`` are each call's."""

    def __init__(self, metrics=None, learned=None):
        self.calls: list[tuple] = []
        self.metrics = metrics or (lambda call: {"loss:sum": float(call)})
        self.learned = learned or {}

    async def forward_backward_async(self, data, loss_fn, **options):
        self.calls.append(("forward_backward", [d.loss_fn_inputs["advantages"].data[0] for d in data], loss_fn,
                           options))
        outputs = [{"logprobs": self.learned.get(d.loss_fn_inputs["advantages"].data[0], d.loss_fn_inputs["logprobs"])}
                   for d in data]
        metrics = self.metrics(sum(call[0] == "forward_backward" for call in self.calls))
        return asyncio.sleep(0, SimpleNamespace(metrics=metrics, loss_fn_outputs=outputs))

    async def optim_step_async(self, adam):
        self.calls.append(("optim_step", adam.learning_rate, adam.beta1, adam.beta2))
        return asyncio.sleep(0, SimpleNamespace(metrics={"grad_norm": 2, "lr": 0.5}))


CONFIG = UpdateConfig(learning_rate=0.01, beta1=0.8, beta2=0.9)


@given(st.lists(st.tuples(st.floats(-5, 0), st.floats(-5, 0), st.sampled_from([0.0, 1.0, -0.5, 2.0])), max_size=20))
def test_trained_tokens_are_exactly_the_positions_with_an_advantage(rows):
    sampled, learned, advantages = ([row[i] for row in rows] for i in range(3))
    tokens = TrainedTokens.of_datum(sampled, learned, advantages)
    kept = [row for row in rows if row[2] != 0.0]
    assert tokens.sampled.tolist() == [row[0] for row in kept] and tokens.learned.tolist() == [row[1] for row in kept]
    assert tokens.advantages.tolist() == [row[2] for row in kept]
    assert tokens.sampled.dtype == tokens.learned.dtype == tokens.advantages.dtype == np.float64


def test_trained_tokens_hold_double_precision_whatever_they_were_given():
    tokens = TrainedTokens.of_datum(np.array([-1.1], np.float32), np.array([-2.2], np.float32), np.array([1.5], np.float32))
    assert tokens.sampled.dtype == tokens.learned.dtype == tokens.advantages.dtype == np.float64


def test_trained_tokens_refuse_arrays_of_different_shapes():
    with pytest.raises(ValueError, match=r"^logprob and advantage arrays differ in shape: \(3,\), \(2,\), \(3,\)$"):
        TrainedTokens.of_datum([0.0] * 3, [0.0] * 2, [1.0] * 3)
    with pytest.raises(ValueError, match=r"differ in shape: \(2,\), \(2,\), \(1,\)$"):
        TrainedTokens.of_datum([0.0] * 2, [0.0] * 2, [1.0])


def test_learner_tokens_pair_each_sent_datum_with_the_logprobs_the_learner_returned():
    data = [datum([0.0, 1.0, 2.0]).datum, datum([3.0, 0.0]).datum, datum([4.0]).datum, datum([5.0, 5.0]).datum]
    data = [datum([9.0]).datum, *data]
    outputs = [{"loss": 1.0},  # no logprobs: left out
               {"logprobs": TensorData.from_numpy(np.array([-9.0, -8.0, -7.0]))},  # pytrio's TensorData
               {"logprobs": [-6.0, -5.0]},  # a plain list
               {"loss": 1.0},
               {"logprobs": [-1.0]}]  # of another length: left out
    tokens = learner_tokens(data, outputs)
    assert [t.learned.tolist() for t in tokens] == [[-8.0, -7.0], [-6.0]]
    assert [t.sampled.tolist() for t in tokens] == [[-2.0, -3.0], [-1.0]]
    assert [t.advantages.tolist() for t in tokens] == [[1.0, 2.0], [3.0]]
    assert learner_tokens(data, None) == [] and learner_tokens(data, [None, "text"]) == []
    assert len(learner_tokens(data[:2], outputs)) == 1  # one per datum sent


def test_a_non_finite_advantage_is_named_by_trajectory_and_position():
    assert non_finite_inputs([datum([1.0, 2.0]), datum([0.5])]) is None
    assert non_finite_inputs([datum([1.0]), datum([1.0, 2.0, math.nan], question=4, group=2)]) == \
        "trajectory q4/g2: advantages[2] is nan"
    assert non_finite_inputs([datum([-math.inf, math.nan], question=1, group=0)]) == \
        "trajectory q1/g0: advantages[0] is -inf"


def test_a_non_finite_result_is_named_by_call_metric_and_position():
    assert non_finite_outputs([{"loss": 1.0, "name": "x"}], [[-1.0, -2.0], None]) is None
    assert non_finite_outputs([{"loss": 1.0}, {"z": math.inf, "a": math.nan}], []) == \
        "forward_backward call 2 returned a = nan"
    assert non_finite_outputs([{"loss": 1.0}], [None, [-1.0, math.inf, math.nan]]) == \
        "forward_backward returned logprobs[1] = inf for datum 1"
    assert non_finite_outputs([{"n": 3}], [np.array([-math.inf])]) == \
        "forward_backward returned logprobs[0] = -inf for datum 0"


def test_an_update_sends_the_loss_its_options_and_the_optimiser_settings():
    client = Client()
    config = UpdateConfig(learning_rate=0.01, beta1=0.8, beta2=0.9, loss_fn="ppo",
                          loss_fn_config={"clip_low_threshold": 0.7})
    result = asyncio.run(apply_update(client, [[datum([1.0, 0.0])], [datum([2.0]), datum([3.0])]], config))
    assert client.calls == [("forward_backward", [1.0], "ppo", {"loss_fn_config": {"clip_low_threshold": 0.7}}),
                            ("forward_backward", [2.0, 3.0], "ppo", {"loss_fn_config": {"clip_low_threshold": 0.7}}),
                            ("optim_step", 0.01, 0.8, 0.9)]
    assert result.outputs == [{"loss:sum": 1.0}, {"loss:sum": 2.0}] and result.calls == 2
    assert result.optim_metrics == {"optim/grad_norm": 2.0, "optim/lr": 0.5}
    assert all(type(v) is float for v in result.optim_metrics.values())
    assert [t.advantages.tolist() for t in result.tokens] == [[1.0], [2.0], [3.0]]
    assert [[d.datum for d in call] for call in result.sent] == [[c.datum for c in call] for call in
                                                                  [[datum([1.0, 0.0])], [datum([2.0]), datum([3.0])]]]
    plain = Client()
    asyncio.run(apply_update(plain, [[datum([1.0])]], CONFIG))
    assert plain.calls[0] == ("forward_backward", [1.0], "importance_sampling", {})  # no empty loss_fn_config


class WithoutOutputs(Client):
    """A server that answers forward_backward with metrics only."""

    async def forward_backward_async(self, data, loss_fn, **options):
        await (await super().forward_backward_async(data, loss_fn, **options))
        return asyncio.sleep(0, SimpleNamespace(metrics={"loss:sum": 1.0}))


def test_an_update_without_the_learners_logprobs_reports_no_trained_tokens():
    result = asyncio.run(apply_update(WithoutOutputs(), [[datum([1.0])]], CONFIG))
    assert result.tokens == [] and result.outputs == [{"loss:sum": 1.0}]


def test_an_update_refuses_non_finite_values_before_the_optimiser_sees_them():
    client = Client()
    with pytest.raises(NonFiniteValues, match=r"^trajectory q0/g0: advantages\[0\] is nan \(nothing was sent"):
        asyncio.run(apply_update(client, [[datum([math.nan])]], CONFIG))
    assert client.calls == []
    client = Client(metrics=lambda call: {"loss:sum": math.nan if call == 2 else 1.0})
    with pytest.raises(NonFiniteValues, match=r"^forward_backward call 2 returned loss:sum = nan; optim_step was not "
                                              r"called, so the weights are unchanged$"):
        asyncio.run(apply_update(client, [[datum([1.0])], [datum([2.0])]], CONFIG))
    assert [call[0] for call in client.calls] == ["forward_backward"] * 2
    client = Client(learned={2.0: [math.inf]})
    with pytest.raises(NonFiniteValues, match=r"logprobs\[0\] = inf for datum 1"):
        asyncio.run(apply_update(client, [[datum([1.0]), datum([2.0])]], CONFIG))


def test_substeps_report_each_mini_batchs_tokens_and_where_a_non_finite_value_stopped_them():
    datums = [datum([float(i + 1)]) for i in range(6)]
    result = asyncio.run(apply_substeps(Client(), datums, None, CONFIG, num_substeps=3, seed=1, step=2))
    assert [len(tokens) for tokens in result.substep_tokens] == [2, 2, 2]
    assert [t for tokens in result.substep_tokens for t in tokens] == result.tokens
    assert sorted(t.advantages[0] for t in result.tokens) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    two = asyncio.run(apply_substeps(Client(), datums, None, CONFIG, num_substeps=2, seed=1, step=2))
    assert [len(tokens) for tokens in two.substep_tokens] == [3, 3]
    one = asyncio.run(apply_substeps(Client(), datums, None, CONFIG, num_substeps=1, seed=1, step=2))
    assert one.substep_tokens == [] and len(one.tokens) == 6
    assert asyncio.run(apply_substeps(Client(), [], None, CONFIG, num_substeps=2, seed=1, step=2)).outputs == []

    late = Client(metrics=lambda call: {"loss:sum": math.nan if call == 2 else 1.0})
    with pytest.raises(NonFiniteValues, match=r"\(in mini-batch 2 of 3; the weights hold the updates of the first 1\)$"):
        asyncio.run(apply_substeps(late, datums, None, CONFIG, num_substeps=3, seed=1, step=2))
    first = Client(metrics=lambda call: {"loss:sum": math.nan})
    with pytest.raises(NonFiniteValues, match=r"weights are unchanged$"):
        asyncio.run(apply_substeps(first, datums, None, CONFIG, num_substeps=3, seed=1, step=2))
    cut = asyncio.run(apply_substeps(Client(), datums, lambda part: [part[:1], part[1:]], CONFIG, num_substeps=2,
                                     seed=1, step=2))
    assert [len(call) for call in cut.sent] == [1, 2, 1, 2] and cut.calls == 4
