"""The model's limits, configured on the twin, reach the real client through run creation and
the catalog: pytrio splits a training call into chunks by them, and rejects what exceeds them,
exactly as against the live service. A call split into chunks updates exactly like one chunk."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pytrio.client.training_batch import plan_training_batch
from pytrio.errors.actor import ActorAPIError
from pytrio.errors.base import ValidationError
from pytrio.model.limits import TrainingLimits
from pytrio.types import AdamParams
from training_strategies import VOCAB_SIZE, generated_trajectories
from twin_support import MODEL, PROMPT, datum_from, running_twin, sample_once

from searchr1.datum import build_datum
from searchr1.preflight import PreflightError, fit_trajectory_budget, read_server_limits
from searchr1.twin import OperationLimits, Strictness, TwinLimits, start_twin
from searchr1.twin.client import FAST_RETRIES

REDUCTIONS = ["per_token", "per_sample", "sum"]
SYNTHETIC = Strictness(sampled_actions=False)  # hypothesis datums were never sampled

datum_lists = st.lists(generated_trajectories(max_turns=3, max_len=8), min_size=2, max_size=8).map(
    lambda items: [build_datum(g.trajectory) for g in items]
)


@pytest.fixture(scope="module")
def twins(tmp_path_factory, tokenizer):
    """Per reduction: one twin without limits and one whose training batches hold 1 to 3 datums."""
    started = {}
    for reduction in REDUCTIONS:
        for size in (None, 1, 2, 3):
            limits = TwinLimits(training=OperationLimits(max_batch_size=size))
            twin = start_twin(home=tmp_path_factory.mktemp(f"{reduction}-{size}"), tokenizer=tokenizer,
                              policy="toy", limits=limits, reduction=reduction, strictness=SYNTHETIC)
            started[reduction, size] = (twin, twin.service_client(sdk_options=FAST_RETRIES))
    yield started
    for twin, _ in started.values():
        twin.close()


def update(twin, service, datums):
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
    g_one, p_one, m_one, chunks_one = update(*twins[reduction, None], datums)
    g_split, p_split, m_split, chunks_split = update(*twins[reduction, max_batch_size], datums)
    plan = plan_training_batch([d.datum for d in datums], loss_fn="importance_sampling", auto_shift=False,
                               limits=TrainingLimits(max_batch_size, None, None), tokenizer_vocab_size=VOCAB_SIZE)
    assert chunks_one == 1 and chunks_split == len(plan.chunks) == -(-len(datums) // max_batch_size)
    assert np.allclose(g_split, g_one, rtol=1e-10, atol=1e-14)
    assert np.allclose(p_split, p_one, rtol=1e-10, atol=1e-14)
    assert m_split["token_count"] == m_one["token_count"] == sum(d.num_tokens for d in datums)
    assert m_split["loss_sum"] == pytest.approx(m_one["loss_sum"], rel=1e-10, abs=1e-14)


def test_the_catalog_and_run_creation_report_the_configured_limits(tmp_path, tokenizer):
    limits = TwinLimits(training=OperationLimits(4, 4096, 2048), sampling=OperationLimits(8, 65536, 4096),
                        max_context_length=8192)
    with running_twin(tmp_path, tokenizer, limits=limits) as (_, service):
        (model,) = service.get_server_capabilities().supported_models
        trainer = service.create_lora_training_client(MODEL, rank=8)
    assert model.model_name == MODEL and model.max_context_length == 8192
    assert (model.training.max_batch_size, model.training.max_tokens_per_request, model.training.max_seq_len) \
        == (4, 4096, 2048)
    assert (model.sampling.max_batch_size, model.sampling.max_seq_len) == (8, 4096)
    assert trainer._limits.max_seq_len == 2048  # what pytrio enforces client-side for this run


def test_a_datum_longer_than_max_seq_len_is_refused_before_it_is_sent(tmp_path, tokenizer):
    limits = TwinLimits(training=OperationLimits(max_seq_len=16))
    with running_twin(tmp_path, tokenizer, limits=limits) as (twin, service):
        trainer = service.create_lora_training_client(MODEL, rank=8)
        sampler = trainer.save_weights_and_get_sampling_client()
        prompt = tokenizer.encode(PROMPT)
        sequence = sample_once(sampler, prompt).sequences[0]
        with pytest.raises(ValidationError) as refused:
            trainer.forward_backward([datum_from(prompt, list(sequence.tokens), list(sequence.logprobs))],
                                     loss_fn="importance_sampling")
        sent = [e.type for e in twin.event_log]
    assert refused.value.code == "validation.training_sample_too_long"
    assert "trainer.forward_backward" not in sent


def test_a_sampling_request_beyond_max_seq_len_is_refused_by_the_server_and_nothing_is_sampled(tmp_path, tokenizer):
    prompt = tokenizer.encode(PROMPT)
    limits = TwinLimits(sampling=OperationLimits(max_seq_len=len(prompt) + 4))
    with running_twin(tmp_path, tokenizer, limits=limits) as (twin, service):
        sampler = service.create_sampling_client(base_model=MODEL)
        assert len(sample_once(sampler, prompt, max_tokens=4).sequences[0].tokens) == 4
        with pytest.raises(ActorAPIError) as refused:
            sample_once(sampler, prompt, max_tokens=5)
        served = len(twin.sample_log)
    assert refused.value.status_code == 400 and refused.value.code == "sampling.sequence_too_long"
    assert served == 1


def test_the_preflight_refuses_a_trajectory_budget_the_twin_would_reject_before_anything_is_sampled(
    tmp_path, tokenizer
):
    limits = TwinLimits(training=OperationLimits(max_seq_len=4096), sampling=OperationLimits(max_seq_len=6144))
    with running_twin(tmp_path, tokenizer, limits=limits) as (twin, service):
        server = read_server_limits(service, MODEL)
        with pytest.raises(PreflightError, match="exceeds the server's training max_seq_len .4096."):
            fit_trajectory_budget(server, 8192, clamp=False, group_size=8)
        assert fit_trajectory_budget(server, 8192, clamp=True, group_size=8).max_trajectory_tokens == 4096
        assert twin.sample_log == [] and twin.event_log == []
