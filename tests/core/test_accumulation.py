"""Why one forward_backward call per step is exact, and when n_k/N reweighting is.

The proofs run on the toy policy, whose gradient is exact (checked against finite
differences first). Notation: a call over datums ``D`` with reduction ``r`` returns
``G(D) / den_r(D)`` where ``G`` is the summed per-token gradient and ``den`` is 1 (sum),
``|D|`` (per sample) or the active-token count (per token), taken over the WHOLE call.

* n_k/N under a per-sample mean: ``sum_k (n_k/N) * G(D_k)/n_k = G(D)/N``, the full-batch
  per-sample mean, for any packing.
* Under a per-token mean: ``sum_k (n_k/N) * G(D_k)/A_k`` is not ``G(D)/A`` unless every
  micro-batch has the same tokens per sample; a concrete counterexample is asserted.
* One call split by the SDK: every chunk carries the call's totals, so the chunks add up to
  the unsplit call whatever the split (checked through the real pytrio client against twins
  whose limits force the split, so pytrio's own planner and transport do the splitting).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pytrio.client.training_batch import plan_training_batch
from pytrio.model.limits import TrainingLimits
from pytrio.types import AdamParams
from training_strategies import VOCAB_SIZE, generated_trajectories
from twin_support import MODEL

from searchr1.core.datum import TrainingDatum, build_datums
from searchr1.training.packing import pack_micro_batches, weight_micro_batch_for_global_mean
from searchr1.tools.probe_loss import policy_datum
from searchr1.twin import OperationLimits, Strictness, TwinLimits, start_twin
from searchr1.twin.client import FAST_RETRIES
from searchr1.twin.optimizer import AdamState, adam_step
from searchr1.twin.policy import PolicySample, totals_of
from searchr1.twin.toy_policy import bucket_sizes, loss_and_grad, token_logprobs

pytestmark = pytest.mark.slow  # every test trains through the real client against a twin

K = 8
REDUCTIONS = ["per_token", "per_sample", "sum"]


def table(seed=0, k=K):
    return np.random.default_rng(seed).normal(0.0, 1.0, size=(k, k))


def samples_of(datums):
    return [PolicySample.from_datum(d.datum) for d in datums]


def grad(weights, datums, reduction):
    return loss_and_grad(
        weights, samples_of(datums), vocab_size=VOCAB_SIZE, reduction=reduction
    ).grad


def build_like(datum):
    """Wrap a hand-made Datum as a TrainingDatum."""
    advantages = datum.loss_fn_inputs["advantages"].to_numpy()
    return TrainingDatum(datum, len(datum.model_input), int(np.count_nonzero(advantages)), 0, 0)


datum_lists = st.lists(generated_trajectories(max_turns=3, max_len=8), min_size=1, max_size=8).map(
    lambda items: [build_datums(g.trajectory)[0] for g in items]
)


# --- the toy policy is a correct model with an exact gradient ----------------------------


@pytest.mark.parametrize("vocab", [5, 37, 64])
def test_toy_policy_is_a_distribution_over_the_whole_vocabulary(vocab):
    weights = table(k=5)
    for previous in range(vocab):
        logps = token_logprobs(weights, vocab, np.full(vocab, previous), np.arange(vocab))
        assert np.exp(logps).sum() == pytest.approx(1.0, abs=1e-12)
    assert bucket_sizes(5, vocab).sum() == vocab


@pytest.mark.parametrize("loss_fn", ["importance_sampling", "cross_entropy"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_toy_gradient_matches_finite_differences(loss_fn, reduction):
    rng = np.random.default_rng(1)
    vocab, k = 41, 4
    weights = rng.normal(size=(k, k))
    samples = []
    for length in (5, 9, 2):
        targets = rng.integers(0, vocab, size=length)
        targets[rng.random(length) < 0.3] = -100
        samples.append(
            PolicySample(
                inputs=rng.integers(0, vocab, size=length),
                targets=targets,
                old_logprobs=rng.normal(-3.0, 1.0, size=length),
                advantages=rng.normal(size=length) * (rng.random(length) < 0.7),
                weights=rng.random(length),
            )
        )

    def loss(w):
        return loss_and_grad(
            w, samples, vocab_size=vocab, loss_fn=loss_fn, reduction=reduction
        ).loss

    analytic = loss_and_grad(
        weights, samples, vocab_size=vocab, loss_fn=loss_fn, reduction=reduction
    ).grad
    numeric = np.zeros_like(weights)
    step = 1e-6
    for index in np.ndindex(weights.shape):
        bump = np.zeros_like(weights)
        bump[index] = step
        numeric[index] = (loss(weights + bump) - loss(weights - bump)) / (2 * step)
    assert np.abs(analytic).max() > 1e-3  # the check is not vacuous
    assert np.allclose(analytic, numeric, rtol=1e-6, atol=1e-8)


@given(datum_lists)
def test_per_token_denominator_counts_every_non_ignored_target(datums):
    totals = totals_of(samples_of(datums))
    assert totals.samples == len(datums)
    assert totals.active_tokens == sum(d.num_tokens for d in datums)  # no -100 in our datums
    assert totals.advantage_tokens == sum(d.loss_tokens for d in datums)


# --- n_k / N ------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(datum_lists, st.integers(1, 4), st.integers(0, 1000))
def test_manual_nk_over_n_accumulation_equals_the_full_batch_under_a_per_sample_mean(
    datums, max_items, seed
):
    weights = table(seed)
    full = grad(weights, datums, "per_sample")
    manual = np.zeros_like(full)
    for batch in pack_micro_batches(datums, max_items=max_items):
        weighted = weight_micro_batch_for_global_mean(batch, total_samples=len(datums))
        manual += grad(weights, weighted, "per_sample")  # one call, its own totals; summed
    assert np.allclose(manual, full, rtol=1e-5, atol=1e-7 * max(1.0, np.abs(full).max()))


def test_nk_over_n_is_not_exact_under_per_token_mean():
    """Two micro-batches with different tokens per sample. Per token, each call divides by its
    own active tokens A_k, so the manual path gives sum_k (n_k/N) G_k / A_k while the full
    batch gives (G_1 + G_2) / (A_1 + A_2): the short datum is over-weighted."""
    short = policy_datum([11, 12, 13], action_start=2)  # 2 active, 1 action
    long = policy_datum(list(range(100, 160)), action_start=50)  # 59 active, 10 actions
    weights = table(3)
    datums = [build_like(short), build_like(long)]
    batches = [[datums[0]], [datums[1]]]
    manual = sum(
        grad(weights, weight_micro_batch_for_global_mean(b, 2), "per_token") for b in batches
    )
    full = grad(weights, datums, "per_token")
    # the closed form of the manual path, from per-call sums
    sums = [grad(weights, b, "sum") for b in batches]
    assert np.allclose(manual, 0.5 * sums[0] / 2 + 0.5 * sums[1] / 59, rtol=1e-5)
    assert np.allclose(full, (sums[0] + sums[1]) / 61, rtol=1e-5)
    difference = np.linalg.norm(manual - full) / np.linalg.norm(full)
    assert difference > 0.1
    # ... whereas the same micro-batches are exact under a per-sample mean
    manual_ps = sum(
        grad(weights, weight_micro_batch_for_global_mean(b, 2), "per_sample") for b in batches
    )
    assert np.allclose(manual_ps, grad(weights, datums, "per_sample"), rtol=1e-5)


@settings(max_examples=40, deadline=None)
@given(datum_lists, st.data())
def test_chunks_reduced_with_global_totals_add_up_to_the_whole_call(datums, data):
    samples = samples_of(datums)
    totals = totals_of(samples)
    weights = table(data.draw(st.integers(0, 100)))
    cuts = sorted(
        data.draw(st.sets(st.integers(1, max(1, len(samples) - 1)), max_size=len(samples)))
    )
    pieces = [samples[a:b] for a, b in zip([0, *cuts], [*cuts, len(samples)]) if samples[a:b]]
    for reduction in REDUCTIONS:
        whole = loss_and_grad(weights, samples, vocab_size=VOCAB_SIZE, reduction=reduction)
        parts = [
            loss_and_grad(weights, p, vocab_size=VOCAB_SIZE, reduction=reduction, totals=totals)
            for p in pieces
        ]
        # Terms of either sum can be far larger than the result (importance ratios of e^17); the
        # order of additions then moves the result by rounding of the largest term, no more.
        largest = max(float(np.abs(p.grad).max()) for p in parts)
        assert np.allclose(sum(p.grad for p in parts), whole.grad, rtol=1e-10, atol=1e-14 + 1e-12 * largest)
        assert sum(p.loss for p in parts) == pytest.approx(whole.loss, rel=1e-10, abs=1e-14)


@pytest.fixture(scope="module")
def twins(tmp_path_factory, tokenizer):
    """Per reduction: a twin without limits, and twins whose training batches hold 1 to 3
    datums (the hypothesis datums were never sampled: the sampled-action rule is off)."""
    started = {}
    for reduction in REDUCTIONS:
        for size in (None, 1, 2, 3):
            twin = start_twin(home=tmp_path_factory.mktemp(f"{reduction}-{size}"), tokenizer=tokenizer,
                              policy="toy", reduction=reduction, strictness=Strictness(sampled_actions=False),
                              limits=TwinLimits(training=OperationLimits(max_batch_size=size)))
            started[reduction, size] = (twin, twin.service_client(sdk_options=FAST_RETRIES))
    yield started
    for twin, _ in started.values():
        twin.close()


def _update(twin, service, datums):
    """One forward_backward of every datum and one optim_step, through the real client."""
    trainer = service.create_lora_training_client(MODEL, rank=8)
    out = trainer.forward_backward([d.datum for d in datums], loss_fn="importance_sampling").result()
    run = twin.training_run(trainer.training_run_cuid)
    gradient = run.accumulated_gradient("sum")
    trainer.optim_step(AdamParams(learning_rate=0.01)).result()
    chunks = sum(1 for e in twin.event_log if e.run == run.cuid and e.type == "trainer.forward_backward")
    return gradient, run.params.copy(), out.metrics, chunks


@settings(max_examples=12, deadline=None)
@given(datum_lists, st.integers(1, 3), st.sampled_from(REDUCTIONS))
def test_a_call_split_into_chunks_by_the_servers_limits_updates_exactly_like_one_chunk(
    twins, datums, max_batch_size, reduction
):
    g_one, p_one, m_one, chunks_one = _update(*twins[reduction, None], datums)
    g_split, p_split, m_split, chunks_split = _update(*twins[reduction, max_batch_size], datums)
    plan = plan_training_batch([d.datum for d in datums], loss_fn="importance_sampling", auto_shift=False,
                               limits=TrainingLimits(max_batch_size, None, None), tokenizer_vocab_size=VOCAB_SIZE)
    assert chunks_one == 1 and chunks_split == len(plan.chunks) == -(-len(datums) // max_batch_size)
    assert np.allclose(g_split, g_one, rtol=1e-10, atol=1e-14)
    assert np.allclose(p_split, p_one, rtol=1e-10, atol=1e-14)
    assert m_split["token_count"] == m_one["token_count"] == sum(d.num_tokens for d in datums)
    assert m_split["loss_sum"] == pytest.approx(m_one["loss_sum"], rel=1e-10, abs=1e-14)


# --- AdamW ---------------------------------------------------------------------------------


@given(st.integers(0, 1000), st.floats(1e-4, 1.0))
def test_first_adam_step_moves_each_weight_by_lr_against_its_gradient_sign(seed, lr):
    rng = np.random.default_rng(seed)
    params, g = rng.normal(size=(3, 3)), rng.normal(size=(3, 3))
    update = adam_step(
        params, g, AdamState.zeros_like(params), AdamParams(learning_rate=lr, eps=1e-12)
    )
    # bias-corrected moments of one step are g and g^2
    assert np.allclose(update.params, params - lr * np.sign(g), rtol=0, atol=1e-7)
    assert update.state.step == 1
    assert update.grad_norm == pytest.approx(np.linalg.norm(g))


def test_adam_weight_decay_is_decoupled_and_clipping_bounds_the_gradient():
    params = np.ones((2, 2))
    decayed = adam_step(
        params,
        np.zeros((2, 2)),
        AdamState.zeros_like(params),
        AdamParams(learning_rate=0.1, weight_decay=0.5),
    )
    assert np.allclose(decayed.params, 1.0 - 0.1 * 0.5)
    g = np.full((2, 2), 3.0)  # norm 6
    clipped = adam_step(
        params, g, AdamState.zeros_like(params), AdamParams(grad_clip_norm=1.5, beta1=0.9)
    )
    assert clipped.grad_norm == pytest.approx(6.0)
    assert np.linalg.norm(clipped.state.m) / (1 - 0.9) == pytest.approx(1.5)
