"""Faults at the wire, each injected on one numbered call: pytrio's own retries, capacity
polling and error classes handle them exactly as they would a live service's."""

from __future__ import annotations

import time

import pytest
from pytrio.errors.actor import ActorAPIError
from pytrio.errors.base import PyTrioError
from pytrio.errors.event import EventFailedError
from pytrio.types import AdamParams
from twin_support import MODEL, PROMPT, running_twin, sample_once, sampled_datum

from searchr1.twin import TwinFaults
from searchr1.twin.client import FAST_RETRIES

LR = AdamParams(learning_rate=0.05)


def step(trainer, tokenizer, seed=1):
    sampler = trainer.save_weights_and_get_sampling_client()
    datum = sampled_datum(sampler, tokenizer.encode(PROMPT), seed=seed)
    trainer.forward_backward([datum], loss_fn="importance_sampling").result()
    return trainer.optim_step(LR).result()


def test_a_full_server_answers_429_until_a_slot_frees_up(tmp_path, tokenizer):
    with running_twin(tmp_path, tokenizer, faults=TwinFaults(capacity_full=2)) as (twin, service):
        trainer = service.create_lora_training_client(MODEL, rank=8)
        step(trainer, tokenizer)
        assert twin.calls("training_run_create") == 3  # two 429 actor_capacity_exceeded, then a run


def test_5xx_answers_are_retried_by_the_sdk(tmp_path, tokenizer):
    faults = TwinFaults(http_errors={"training_run_create": {1: 503}, "event_submit": {2: 502},
                                     "sample": {1: 500}, "event_get": {1: 504}})
    with running_twin(tmp_path, tokenizer, faults=faults) as (twin, service):
        trainer = service.create_lora_training_client(MODEL, rank=8)
        step(trainer, tokenizer)
        assert twin.calls("training_run_create") == 2 and twin.calls("sample") == 2
        assert len(twin.sample_log) == 1  # the failed attempt never reached the policy


def test_a_dropped_sampling_answer_is_asked_again(tmp_path, tokenizer):
    with running_twin(tmp_path, tokenizer, faults=TwinFaults(dropped_connections={"sample": {1}})) as (twin, service):
        trainer = service.create_lora_training_client(MODEL, rank=8)
        sampler = trainer.save_weights_and_get_sampling_client()
        response = sample_once(sampler, tokenizer.encode(PROMPT))
        assert len(response.sequences) == 1
        assert len(twin.sample_log) == 2  # served twice, the first answer lost on the way


def test_a_failed_event_fails_only_that_call(tmp_path, tokenizer):
    faults = TwinFaults(failed_events={"forward_backward": {1: "twin.out_of_memory"}})
    with running_twin(tmp_path, tokenizer, faults=faults) as (twin, service):
        trainer = service.create_lora_training_client(MODEL, rank=8)
        sampler = trainer.save_weights_and_get_sampling_client()
        datum = sampled_datum(sampler, tokenizer.encode(PROMPT))
        with pytest.raises(EventFailedError) as failed:
            trainer.forward_backward([datum], loss_fn="importance_sampling").result()
        assert failed.value.code == "twin.out_of_memory"
        run = twin.training_run(trainer.training_run_cuid)
        assert run.pending == {}  # nothing of the failed call was accumulated
        trainer.forward_backward([datum], loss_fn="importance_sampling").result()
        assert trainer.optim_step(LR).result().metrics["grad_norm"] > 0


def test_a_broken_run_refuses_every_later_event_and_recovers_from_its_checkpoint(tmp_path, tokenizer):
    faults = TwinFaults(broken_runs={"forward_backward": {2}})
    with running_twin(tmp_path, tokenizer, faults=faults) as (twin, service):
        trainer = service.create_lora_training_client(MODEL, rank=8)
        step(trainer, tokenizer, seed=1)
        saved = trainer.save_state("before-break").result()
        params = twin.training_run(trainer.training_run_cuid).params.copy()
        with pytest.raises(EventFailedError):
            step(trainer, tokenizer, seed=2)
        with pytest.raises(PyTrioError) as refused:
            trainer.optim_step(LR).result()
        assert refused.value.code == "training.run_broken"
        resumed = service.create_training_client_from_state_with_optimizer(saved.path)
        step(resumed, tokenizer, seed=3)
        run = twin.training_run(resumed.training_run_cuid)
        assert run.optimizer_steps == 1 and run.adam.step == 2  # the optimiser state came back
        assert not (run.params == params).all()


def test_slow_events_are_long_polled_until_they_finish(tmp_path, tokenizer):
    with running_twin(tmp_path, tokenizer, faults=TwinFaults(slow_events=0.15)) as (twin, service):
        trainer = service.create_lora_training_client(MODEL, rank=8)
        started = time.perf_counter()
        trainer.save_state("slow").result()
        elapsed = time.perf_counter() - started
        assert elapsed >= 0.3  # init_run then save_state, each running 0.15 s
        assert twin.calls("event_get") >= 2


def test_a_sampler_that_sends_nothing_times_out_on_the_client(tmp_path, tokenizer):
    faults = TwinFaults(sample_timeouts={1}, sample_timeout_hold=2.0)
    with running_twin(tmp_path, tokenizer, faults=faults) as (twin, _):
        service = twin.service_client(sdk_options={**FAST_RETRIES, "sampling_first_chunk_timeout_seconds": 0.2})
        sampler = service.create_sampling_client(base_model=MODEL)
        with pytest.raises(ActorAPIError) as timed_out:
            sample_once(sampler, tokenizer.encode(PROMPT))
        assert timed_out.value.code == "actor.sampling.first_chunk_timeout"
        assert timed_out.value.retryable is False
        assert len(sample_once(sampler, tokenizer.encode(PROMPT)).sequences) == 1  # the next call is served


def test_a_4xx_sampling_failure_is_not_retried(tmp_path, tokenizer):
    with running_twin(tmp_path, tokenizer, faults=TwinFaults(http_errors={"sample": {1: 400}})) as (twin, service):
        sampler = service.create_sampling_client(base_model=MODEL)
        with pytest.raises(ActorAPIError) as failed:
            sample_once(sampler, tokenizer.encode(PROMPT))
        assert failed.value.status_code == 400 and twin.calls("sample") == 1
