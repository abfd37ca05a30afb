"""The model's limits, configured on the twin, reach the real client through run creation and
the catalog: pytrio splits a training call into chunks by them (that a split call updates
exactly like one chunk is proved in ``test_accumulation.py``) and rejects what exceeds them,
exactly as against the live service."""

from __future__ import annotations

import pytest
from pytrio.errors.actor import ActorAPIError
from pytrio.errors.base import ValidationError
from twin_support import MODEL, PROMPT, datum_from, running_twin, sample_once

from searchr1.runtime.preflight import PreflightError, fit_trajectory_budget, read_server_limits
from searchr1.twin import OperationLimits, TwinLimits

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


def test_with_context_fold_the_preflight_fits_the_window_and_leaves_the_whole_length(tmp_path, tokenizer):
    """A folded trajectory is trained one context (one datum) at a time: the service's limits bind
    the window, and the whole trajectory may be longer."""
    from searchr1.commands.train import _fit_server_limits
    from searchr1.core.rollout import RolloutConfig
    from searchr1.training.config import TrainConfig

    limits = TwinLimits(training=OperationLimits(max_seq_len=4096), sampling=OperationLimits(max_seq_len=6144))
    rollout = RolloutConfig(context="fold", context_window=6000, max_trajectory_tokens=16384)
    config = TrainConfig(max_steps=1, offline=True, data="unused.jsonl", rollout=rollout)
    with running_twin(tmp_path, tokenizer, limits=limits) as (_, service):
        with pytest.raises(PreflightError, match="--context-window 6000 exceeds the server's training max_seq_len"):
            _fit_server_limits(service, config, clamp=False, resuming=False)
        fitted = _fit_server_limits(service, config, clamp=True, resuming=False).rollout
    assert (fitted.context_window, fitted.max_trajectory_tokens) == (4096, 16384)
