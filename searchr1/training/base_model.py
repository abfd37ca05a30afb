"""The base model's logprobs for the KL penalty (``--kl-coef``, :mod:`searchr1.core.kl`): a sampler
of the *base* weights, made on first use (once per run and per resume), asked for the prompt
logprobs of every datum a step sends."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import numpy as np

from searchr1.training.config import TrainConfig
from searchr1.core.datum import TrainingDatum
from searchr1.core.kl import aligned_base_logprobs, base_prompt, penalize
from searchr1.core.types import SamplingClient, ServiceClient
from searchr1.run.usage import MeteredSampler, Usage


async def base_logprobs_async(base_sampler: SamplingClient, datums: Sequence[TrainingDatum],
                              slots: asyncio.Semaphore | None = None) -> list[np.ndarray]:
    """One prompt-logprob request per datum to the base sampler, concurrently (``slots`` caps
    how many are in flight)."""
    from pytrio.types import ModelInput, SamplingParams

    params = SamplingParams(max_tokens=1, temperature=1.0)

    async def one(item: TrainingDatum) -> np.ndarray:
        request = {"prompt": ModelInput.from_ints(base_prompt(item)), "num_samples": 1, "sampling_params": params,
                   "include_prompt_logprobs": True}
        if slots is None:
            response = await base_sampler.sample_async(**request)
        else:
            async with slots:
                response = await base_sampler.sample_async(**request)
        return aligned_base_logprobs(list(response.prompt_logprobs), item.num_tokens)

    return list(await asyncio.gather(*(one(item) for item in datums)))


class BaseModelPenalty:
    """The KL penalty of a run: a sampler of the *base* weights, made on first use (once per run
    and per resume), asked for the prompt logprobs of every datum a step sends."""

    def __init__(self, service: ServiceClient, config: TrainConfig) -> None:
        self.service = service
        self.config = config
        self._sampler: SamplingClient | None = None
        self._slots: asyncio.Semaphore | None = None
        self._usage = Usage()  # the base model's requests since the last take_usage

    def take_usage(self) -> Usage:
        """The base model's prompt-logprob requests since the last call (:mod:`searchr1.run.usage`)."""
        usage, self._usage = self._usage, Usage()
        return usage

    async def apply(self, datums: list[TrainingDatum]) -> tuple[list[TrainingDatum], dict[str, float]]:
        """The datums with the penalty in their advantages, and the step's kl/ metrics."""
        started = time.perf_counter()
        if self._sampler is None:
            self._sampler = await self.service.create_sampling_client_async(base_model=self.config.base_model)
            self._slots = asyncio.Semaphore(self.config.rollout.sampling_concurrency)
        base = await base_logprobs_async(MeteredSampler(self._sampler, self._usage, kl=True), datums, self._slots)
        datums, metrics = penalize(datums, base, coef=self.config.kl_coef, estimator=self.config.kl_estimator)
        return datums, {**metrics, "kl/base_requests": float(len(base)),
                        "time/kl_seconds": time.perf_counter() - started}
