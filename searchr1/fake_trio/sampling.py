"""Sampling clients of the fake.

:class:`FakeSamplingClient` is what the fake service hands out. It validates every request
exactly as pytrio's ``SamplingClient`` does (non-empty prompt, ``max_tokens`` set and > 0,
``num_samples >= 1``, ``topk_prompt_logprobs >= 0``: pytrio's own request builder runs) and
then delegates to a *backend* sampler built by the service's ``sampler_factory``. That is
where a scripted sampler (replaying assistant texts from a scenario) plugs in; the default
backend is :class:`ToySampler`, which samples honestly from the toy policy stored in the
checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from pydantic import ValidationError as PydanticValidationError
from pytrio.client.builders.sampling import build_sample_request
from pytrio.errors.actor import ActorAPIError
from pytrio.errors.base import ValidationError
from pytrio.types import (
    APIFuture,
    ModelInput,
    SampleResponse,
    SampleSequence,
    SamplingParams,
)

from ..toy_policy import sample_next_token, token_logprobs
from ..trio_types import DEFAULT_SAMPLING_PARAMS, FutureLike, SamplerLike
from .futures import completed, failed


def validate_sample_request(
    prompt: ModelInput,
    num_samples: int,
    sampling_params: SamplingParams,
    include_prompt_logprobs: bool,
    topk_prompt_logprobs: int,
    return_text: bool,
) -> None:
    """pytrio 0.2.9's client-side checks, in its order, with its error codes."""
    if prompt.is_empty:
        raise ValidationError("prompt cannot be empty", code="validation.empty_prompt")
    if prompt.has_images and (include_prompt_logprobs or topk_prompt_logprobs > 0):
        raise ValidationError(
            "prompt logprobs do not support image chunks",
            code="validation.image_logprobs_unsupported",
        )
    if sampling_params.max_tokens is None or sampling_params.max_tokens <= 0:
        raise ValidationError(
            "sampling_params.max_tokens must be greater than 0",
            code="validation.invalid_sampling_request",
        )
    try:
        build_sample_request(
            prompt,
            sampling_params=sampling_params,
            num_samples=num_samples,
            include_prompt_logprobs=include_prompt_logprobs,
            topk_prompt_logprobs=topk_prompt_logprobs,
            return_text=return_text,
            return_token_logprobs=True,
        )
    except PydanticValidationError as error:
        raise ValidationError(
            "invalid sampling request",
            code="validation.invalid_sampling_request",
            details={"errors": error.errors()},
        ) from None


class FakeSamplingClient:
    """Validating front of a backend sampler; satisfies ``SamplerLike``."""

    def __init__(
        self,
        backend: SamplerLike,
        *,
        model_id: str,
        model_path: str | None,
        sampling_run_cuid: str,
        tokenizer: Any,
        next_sample_call: Callable[[], bool],
    ) -> None:
        self.backend = backend
        self.model_id = model_id
        self.model_path = model_path
        self.sampling_run_cuid = sampling_run_cuid
        self._tokenizer = tokenizer
        self._next_sample_call = next_sample_call  # True when this call must fail

    def _injected_failure(self) -> ActorAPIError:
        return ActorAPIError(
            "injected sampling failure (FakeFaults.fail_sample_calls)",
            code="actor.request_failed",
            retryable=True,
        )

    def sample(
        self,
        prompt: ModelInput,
        num_samples: int = 1,
        sampling_params: SamplingParams = DEFAULT_SAMPLING_PARAMS,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        return_text: bool = True,
    ) -> FutureLike[SampleResponse]:
        validate_sample_request(
            prompt,
            num_samples,
            sampling_params,
            include_prompt_logprobs,
            topk_prompt_logprobs,
            return_text,
        )
        if self._next_sample_call():
            return failed(self._injected_failure())
        return self.backend.sample(
            prompt,
            num_samples=num_samples,
            sampling_params=sampling_params,
            include_prompt_logprobs=include_prompt_logprobs,
            topk_prompt_logprobs=topk_prompt_logprobs,
            return_text=return_text,
        )

    async def sample_async(
        self,
        prompt: ModelInput,
        num_samples: int = 1,
        sampling_params: SamplingParams = DEFAULT_SAMPLING_PARAMS,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        return_text: bool = True,
    ) -> SampleResponse:
        validate_sample_request(
            prompt,
            num_samples,
            sampling_params,
            include_prompt_logprobs,
            topk_prompt_logprobs,
            return_text,
        )
        if self._next_sample_call():
            raise self._injected_failure()
        return await self.backend.sample_async(
            prompt,
            num_samples=num_samples,
            sampling_params=sampling_params,
            include_prompt_logprobs=include_prompt_logprobs,
            topk_prompt_logprobs=topk_prompt_logprobs,
            return_text=return_text,
        )

    def compute_logprobs(self, prompt: ModelInput) -> FutureLike[list[float | None]]:
        if prompt.is_empty:
            raise ValidationError("prompt cannot be empty", code="validation.empty_prompt")
        if self._next_sample_call():
            return failed(self._injected_failure())
        return self.backend.compute_logprobs(prompt)

    async def compute_logprobs_async(self, prompt: ModelInput) -> list[float | None]:
        if prompt.is_empty:
            raise ValidationError("prompt cannot be empty", code="validation.empty_prompt")
        if self._next_sample_call():
            raise self._injected_failure()
        return await self.backend.compute_logprobs_async(prompt)

    def get_tokenizer(self) -> Any:
        return self._tokenizer


def _stop_rules(stop: object) -> tuple[set[int], list[str]]:
    """pytrio sends a string or strings as ``stop`` and a list of ints as ``stop_token_ids``."""
    if stop is None:
        return set(), []
    if isinstance(stop, str):
        return set(), [stop]
    items = list(stop)  # type: ignore[call-overload]
    return {i for i in items if isinstance(i, int)}, [i for i in items if isinstance(i, str)]


class ToySampler:
    """Samples from a toy-policy weight table (the default backend).

    Invented behaviour, documented: ``stop_reason`` is ``"stop"`` when a stop token id or
    stop string ended the sequence (the stop token is included in ``tokens``) and
    ``"length"`` at ``max_tokens``; logprobs are those of the distribution actually sampled
    (tempered when ``temperature != 1``); ``top_k``/``top_p`` are ignored. Randomness comes
    from ``sampling_params.seed`` (0 when unset) and a per-client call counter, so a run is
    reproducible.
    """

    def __init__(
        self, weights: np.ndarray, *, vocab_size: int, tokenizer: Any, model_id: str
    ) -> None:
        self.weights = weights
        self.vocab_size = vocab_size
        self.tokenizer = tokenizer
        self.model_id = model_id
        self._calls = 0

    def _prompt_logprobs(self, tokens: list[int]) -> list[float | None]:
        values = token_logprobs(
            self.weights, self.vocab_size, np.array(tokens[:-1]), np.array(tokens[1:])
        )
        return [None, *(float(v) for v in values)]

    def _generate(
        self, prompt: list[int], rng: np.random.Generator, params: SamplingParams, return_text: bool
    ) -> SampleSequence:
        stop_ids, stop_texts = _stop_rules(params.stop)
        tokens: list[int] = []
        logprobs: list[float] = []
        previous = prompt[-1]
        stop_reason = "length"
        for _ in range(int(params.max_tokens or 0)):
            token, logprob = sample_next_token(
                self.weights, self.vocab_size, previous, rng, temperature=params.temperature
            )
            tokens.append(token)
            logprobs.append(logprob)
            previous = token
            if token in stop_ids or (
                stop_texts and any(s in self.tokenizer.decode(tokens) for s in stop_texts)
            ):
                stop_reason = "stop"
                break
        text = self.tokenizer.decode(tokens) if return_text else None
        return SampleSequence(stop_reason=stop_reason, tokens=tokens, text=text, logprobs=logprobs)

    def _respond(
        self,
        prompt: ModelInput,
        num_samples: int,
        params: SamplingParams,
        include_prompt_logprobs: bool,
        return_text: bool,
    ) -> SampleResponse:
        self._calls += 1
        rng = np.random.default_rng([(params.seed or 0) % 2**63, self._calls])
        tokens = prompt.to_ints()
        sequences = [self._generate(tokens, rng, params, return_text) for _ in range(num_samples)]
        return SampleResponse(
            sequences=sequences,
            prompt_logprobs=self._prompt_logprobs(tokens) if include_prompt_logprobs else [],
            input_tokens=len(tokens),
            output_tokens=sum(len(s.tokens) for s in sequences),
        )

    def sample(
        self,
        prompt: ModelInput,
        num_samples: int = 1,
        sampling_params: SamplingParams = DEFAULT_SAMPLING_PARAMS,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        return_text: bool = True,
    ) -> APIFuture[SampleResponse]:
        return completed(
            self._respond(
                prompt, num_samples, sampling_params, include_prompt_logprobs, return_text
            )
        )

    async def sample_async(
        self,
        prompt: ModelInput,
        num_samples: int = 1,
        sampling_params: SamplingParams = DEFAULT_SAMPLING_PARAMS,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        return_text: bool = True,
    ) -> SampleResponse:
        return self._respond(
            prompt, num_samples, sampling_params, include_prompt_logprobs, return_text
        )

    def compute_logprobs(self, prompt: ModelInput) -> APIFuture[list[float | None]]:
        return completed(self._prompt_logprobs(prompt.to_ints()))

    async def compute_logprobs_async(self, prompt: ModelInput) -> list[float | None]:
        return self._prompt_logprobs(prompt.to_ints())

    def get_tokenizer(self) -> Any:
        return self.tokenizer
