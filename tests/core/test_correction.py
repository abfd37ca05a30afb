"""Off-policy correction (core/correction.py): the corrected advantages and logprobs against their
definitions, as properties over any ratios, and the engine against the reference step on a twin
whose sampler differs from its learner (the mismatch fault)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twin_support import MODEL

from searchr1.core.correction import Correction, CorrectionConfig, apply_correction, correct, correct_tokens
from searchr1.core.datum import NonFiniteValues, TrainingDatum, build_training_datums, drop_out_of_vocab
from searchr1.core.reference import reference_correction
from searchr1.core.rollout import RolloutConfig, rollout_batch_async
from searchr1.core.advantage import assign_group_advantages
from searchr1.core.reward import score_trajectories
from searchr1.search.tool import with_search
from searchr1.twin import Strictness, TwinFaults, start_twin
from searchr1.twin.client import FAST_RETRIES
from searchr1.twin.offline_world import load_world, passages_by_query
from searchr1.twin.scripted_search import ScriptedSearch
from searchr1.core.types import SearchExample, SearchItem, SearchResult

CORRECTIONS = tuple(Correction)
finite = st.floats(min_value=-8.0, max_value=0.0, allow_nan=False, width=32)
advantage = st.one_of(st.just(0.0), st.floats(min_value=-2.0, max_value=2.0, allow_nan=False, width=32))


@st.composite
def tokens(draw, *, same: bool = False):
    """Aligned sampler logprobs, learner logprobs and advantages of one datum (``same``: ratio 1)."""
    n = draw(st.integers(1, 30))
    sampled = np.asarray(draw(st.lists(finite, min_size=n, max_size=n)))
    learned = sampled.copy() if same else np.asarray(draw(st.lists(finite, min_size=n, max_size=n)))
    return sampled, learned, np.asarray(draw(st.lists(advantage, min_size=n, max_size=n)))


configs = st.builds(CorrectionConfig, st.sampled_from(CORRECTIONS), st.floats(1.0, 10.0),
                    st.floats(0.05, 1.0), st.floats(1.0, 10.0))


@given(configs, tokens(same=True))
def test_with_a_ratio_of_one_everywhere_every_correction_sends_what_none_sends(config, arrays):
    sampled, learned, advantages = arrays
    out, logprobs, capped, masked = correct_tokens(config, sampled, learned, advantages)
    assert np.array_equal(out, advantages) and np.array_equal(logprobs, sampled)
    assert not capped.any() and not masked.any()


@given(configs, tokens())
def test_a_capped_weight_never_exceeds_its_cap(config, arrays):
    """The weight a trained token gets at the learner's weights before the update: tis's
    ``A' / A * r`` (the service's loss multiplies by r), decoupled's ``A' / A``."""
    sampled, learned, advantages = arrays
    out, _, capped, _ = correct_tokens(config, sampled, learned, advantages)
    trained = advantages != 0.0
    ratio = np.exp(learned - sampled)
    if config.correction == Correction.TIS:
        weight = out[trained] / advantages[trained] * ratio[trained]
    elif config.correction == Correction.DECOUPLED:
        weight = out[trained] / advantages[trained]
    else:
        return
    assert np.all(weight <= config.tis_cap * (1 + 1e-12))
    assert np.allclose(weight, np.minimum(ratio[trained], config.tis_cap), rtol=1e-12)
    assert np.array_equal(capped, trained & (ratio > config.tis_cap))


@given(configs, tokens())
def test_mis_keeps_no_token_outside_its_bounds_and_every_token_inside(config, arrays):
    sampled, learned, advantages = arrays
    config = CorrectionConfig(Correction.MIS, config.tis_cap, config.mis_low, config.mis_high)
    out, logprobs, _, masked = correct_tokens(config, sampled, learned, advantages)
    ratio = np.exp(learned - sampled)
    inside = (ratio >= config.mis_low) & (ratio <= config.mis_high)
    assert np.array_equal(out, np.where(inside, advantages, 0.0))
    assert np.array_equal(masked, (advantages != 0.0) & ~inside) and np.array_equal(logprobs, sampled)


@given(configs, tokens())
def test_a_position_without_advantage_keeps_its_values_and_only_decoupled_moves_logprobs(config, arrays):
    sampled, learned, advantages = arrays
    out, logprobs, _, _ = correct_tokens(config, sampled, learned, advantages)
    untrained = advantages == 0.0
    assert np.all(out[untrained] == 0.0) and np.array_equal(logprobs[untrained], sampled[untrained])
    expected = np.where(~untrained, learned, sampled) if config.correction == Correction.DECOUPLED else sampled
    assert np.array_equal(logprobs, expected)


def datum(sampled, advantages) -> TrainingDatum:
    from pytrio.types import Datum, ModelInput, TensorData
    n = len(sampled)
    inputs = {"target_tokens": TensorData.from_numpy(np.arange(1, n + 1, dtype=np.int64)),
              "logprobs": TensorData.from_numpy(np.asarray(sampled, np.float32)),
              "advantages": TensorData.from_numpy(np.asarray(advantages, np.float32))}
    return TrainingDatum(Datum(model_input=ModelInput.from_ints(list(range(n))), loss_fn_inputs=inputs),
                         n, int(np.count_nonzero(advantages)), 0, 0)


def test_the_metrics_count_capped_and_masked_shares_among_trained_tokens():
    sampled = np.log([0.5, 0.5, 0.5, 0.5])
    learned = [np.log([0.5, 0.1, 0.95, 0.9])]  # ratios 1, 0.2, 1.9, 1.8; the last untrained
    item = datum(sampled, [1.0, -1.0, 1.0, 0.0])
    _, tis = apply_correction(CorrectionConfig(Correction.TIS, tis_cap=1.5), [item], learned)
    _, mis = apply_correction(CorrectionConfig(Correction.MIS), [item], learned)
    assert tis["correction/capped_share"] == pytest.approx(1 / 3) and "correction/masked_share" not in tis
    assert mis["correction/masked_share"] == pytest.approx(1 / 3) and "correction/capped_share" not in mis
    assert tis["correction/forward_calls"] == 1.0 and tis["correction/mismatch_k3"] > 0


def test_none_sends_no_forward_call_and_returns_the_datums_unchanged():
    class NoCalls:
        async def forward_async(self, *args, **kwargs):
            raise AssertionError("none must not call forward")

    datums = [datum([-0.5, -0.5], [1.0, 1.0])]
    assert asyncio.run(correct(NoCalls(), CorrectionConfig(), datums, loss_fn="ppo", loss_fn_config={})) == (datums, {})


def test_a_non_finite_learner_logprob_at_a_trained_position_stops_the_step():
    from searchr1.core.correction import learner_logprobs
    from pytrio.types import TensorData
    outputs = [{"logprobs": TensorData.from_numpy(np.asarray([float("nan"), -1.0], np.float32))}]
    assert learner_logprobs([datum([-0.5, -0.5], [0.0, 1.0])], outputs)[0][1] == -1.0  # untrained: not read
    with pytest.raises(NonFiniteValues, match=r"logprobs\[0\]"):
        learner_logprobs([datum([-0.5, -0.5], [1.0, 1.0])], outputs)


# ---------------------------------------------------------------- engine against the reference

@pytest.fixture(scope="module")
def mismatched(tmp_path_factory, tokenizer):
    """A learning twin whose sampler differs from its learner (the mismatch fault), strict."""
    twin = start_twin(home=tmp_path_factory.mktemp("mismatch"), tokenizer=tokenizer, policy="learning",
                      faults=TwinFaults(sampler_noise=0.5), strictness=Strictness())
    yield twin
    twin.close()


def production_datums(twin, tokenizer):
    questions = [q for q in load_world() if q.split == "train"][:4]
    examples = [SearchExample(q.id, q.question, q.answers, q.data_source) for q in questions]
    results = {query: SearchResult(True, (SearchItem(hop.title, hop.text, "Wikipedia"),))
               for query, hop in passages_by_query(questions).items()}
    sampler = twin.service_client(sdk_options=FAST_RETRIES).create_sampling_client(base_model=MODEL)
    config = RolloutConfig(group_size=4, seed=3)
    trajectories = asyncio.run(rollout_batch_async(
        sampler, tokenizer, with_search(ScriptedSearch(results, default=SearchResult(True, ()))), examples, config))
    score_trajectories(trajectories)
    assign_group_advantages(trajectories)
    return drop_out_of_vocab(build_training_datums(trajectories, max_tokens=config.max_trajectory_tokens),
                             len(tokenizer))[0]


@pytest.mark.slow  # a rollout and forward calls through a twin
@pytest.mark.parametrize("correction", [c for c in Correction if c != Correction.NONE])
def test_the_engine_corrects_the_datums_as_the_reference_does(mismatched, tokenizer, correction):
    """Invariant: on a sampler that differs from its learner, the engine's corrected advantages and
    logprobs are the reference's (two training clients of one seed give the same forward), and the
    twin's strict mode accepts what each sends to forward_backward."""
    datums = production_datums(mismatched, tokenizer)
    assert datums, "the batch carries a signal"
    service = mismatched.service_client(sdk_options=FAST_RETRIES)
    ours, theirs = (service.create_lora_training_client(base_model=MODEL, rank=8, seed=5) for _ in range(2))
    config = CorrectionConfig(correction, tis_cap=1.05, mis_low=0.95, mis_high=1.05)  # tight: bounds bite
    corrected, metrics = asyncio.run(correct(ours, config, list(datums), loss_fn="importance_sampling",
                                             loss_fn_config={}))
    expected = reference_correction(theirs, [d.datum for d in datums], correction.value, 1.05, (0.95, 1.05))
    assert metrics["correction/mismatch_k3"] > 0  # the fault made the learner differ from the sampler
    share = metrics.get("correction/capped_share", metrics.get("correction/masked_share"))
    assert share is not None and share > 0  # the tight bounds acted on some tokens
    for ours_datum, reference in zip(corrected, expected, strict=True):
        for key in ("logprobs", "advantages"):
            np.testing.assert_allclose(ours_datum.datum.loss_fn_inputs[key].data, reference.loss_fn_inputs[key].data,
                                       rtol=1e-6, atol=0)
    asyncio.run(ours.forward_backward_async([d.datum for d in corrected], loss_fn="ppo")).result()
