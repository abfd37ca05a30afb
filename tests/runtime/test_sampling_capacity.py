"""A rollout's ``sampling_concurrency`` is what the pytrio client does: pytrio keeps 16 requests of
a sampling client in flight unless told otherwise, so every client we create is told."""

from __future__ import annotations

import asyncio
import time

import pytest
from pytrio.types import ModelInput, SamplingParams

from searchr1.runtime.connect import sampling_capacity
from searchr1.wiring.services import SAMPLING_CONCURRENCY, offline_service
from searchr1.twin.config import Latencies

LATENCY = 1.0  # seconds the twin takes for every sampling request: long beside the client's own work,
# which on a loaded machine took half a second for 64 requests


def test_the_options_name_pytrios_own_settings():
    from pytrio.config.config import Configuration

    options = sampling_capacity(200)
    assert set(options) <= set(Configuration.model_fields)
    assert options["sampling_request_max_in_flight"] == 200 and options["sampling_request_queue_capacity"] >= 200
    assert Configuration().sampling_request_max_in_flight < SAMPLING_CONCURRENCY  # why the options exist


@pytest.mark.slow  # a twin that takes 1 s a request
@pytest.mark.parametrize("concurrency", [SAMPLING_CONCURRENCY, 48])
def test_that_many_requests_are_in_flight_at_once(tmp_path, tokenizer, concurrency):
    service = offline_service(tmp_path, tokenizer, policy="toy", sampling_concurrency=concurrency,
                              latencies=Latencies(sample_request=LATENCY))
    sampler = service.create_sampling_client(base_model="Qwen/Qwen3.5-4B")
    prompt = ModelInput.from_ints(tokenizer.encode("Question: where is Paris?", add_special_tokens=False))

    async def one(seed: int) -> None:
        await sampler.sample_async(prompt=prompt, num_samples=1,
                                   sampling_params=SamplingParams(max_tokens=4, seed=seed))

    async def all_at_once() -> float:
        started = time.perf_counter()
        await asyncio.gather(*(one(seed) for seed in range(concurrency)))
        return time.perf_counter() - started

    # pytrio's default (16 in flight) would need three rounds of LATENCY or more
    assert asyncio.run(all_at_once()) < 2 * LATENCY
