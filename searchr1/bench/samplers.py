"""Sampling clients the benchmarks wrap around pytrio's: one that counts its requests (and keeps
their answers when given a table), one that answers from such a table without pytrio or HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, TypeAlias

from searchr1.core.types import SamplingClient

if TYPE_CHECKING:
    from pytrio.types import ModelInput, SampleResponse, SamplingParams

# A request as the table knows it: (prompt tokens, samples, seed, max_tokens).
AnswerKey: TypeAlias = "tuple[tuple[int, ...], int, int | None, int | None]"
# One sequence of an answer: (tokens, logprobs, text, stop reason).
Answer: TypeAlias = "tuple[list[int], list[float], str | None, str]"
Answers: TypeAlias = "dict[AnswerKey, list[Answer]]"


def answer_key(prompt: ModelInput | Sequence[int], num_samples: int, params: SamplingParams | None) -> AnswerKey:
    tokens = prompt.to_ints() if hasattr(prompt, "to_ints") else list(prompt)
    return (tuple(tokens), int(num_samples), getattr(params, "seed", None), getattr(params, "max_tokens", None))


class CountingSampler:
    """A sampling client that counts its requests and, when asked, keeps their answers."""

    def __init__(self, inner: SamplingClient, answers: Answers | None = None) -> None:
        self.inner = inner
        self.answers = answers
        self.requests = 0

    async def sample_async(self, prompt: ModelInput, num_samples: int = 1,
                           sampling_params: SamplingParams | None = None, include_prompt_logprobs: bool = False,
                           return_text: bool = True) -> SampleResponse:
        """The inner client's answer (the defaults are pytrio's own)."""
        self.requests += 1
        response = await self.inner.sample_async(prompt=prompt, num_samples=num_samples,
                                                 sampling_params=sampling_params,
                                                 include_prompt_logprobs=include_prompt_logprobs,
                                                 return_text=return_text)
        if self.answers is not None:
            self.answers[answer_key(prompt, num_samples, sampling_params)] = [
                (list(s.tokens), list(s.logprobs), s.text, s.stop_reason) for s in response.sequences
            ]
        return response

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


class InMemorySampler:
    """Answers each request from a table of the wire run's answers: no pytrio, no HTTP."""

    def __init__(self, answers: Answers) -> None:
        self.answers = answers
        self.requests = 0

    async def sample_async(self, prompt: ModelInput, num_samples: int = 1,
                           sampling_params: SamplingParams | None = None, include_prompt_logprobs: bool = False,
                           return_text: bool = True) -> SimpleNamespace:
        self.requests += 1
        await asyncio.sleep(0)  # an answer never arrives within the call that asks for it
        key = answer_key(prompt, num_samples, sampling_params)
        if key not in self.answers:
            raise LookupError(f"the in-memory sampler has no answer for a {len(key[0])}-token prompt "
                              f"(seed {key[2]}): the runs of figure 5 diverged")
        return SimpleNamespace(sequences=[
            SimpleNamespace(tokens=tokens, logprobs=logprobs, text=text, stop_reason=stop)
            for tokens, logprobs, text, stop in self.answers[key]
        ])
