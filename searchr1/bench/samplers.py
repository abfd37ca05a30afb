"""Sampling clients the benchmarks wrap around pytrio's: one that counts its requests (and keeps
their answers when given a table), one that answers from such a table without pytrio or HTTP."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any


def answer_key(prompt: Any, num_samples: int, params: Any) -> tuple[Any, ...]:
    tokens = prompt.to_ints() if hasattr(prompt, "to_ints") else list(prompt)
    return (tuple(tokens), int(num_samples), getattr(params, "seed", None), getattr(params, "max_tokens", None))


class CountingSampler:
    """A sampling client that counts its requests and, when asked, keeps their answers."""

    def __init__(self, inner: Any, answers: dict[tuple[Any, ...], list[tuple[Any, ...]]] | None = None) -> None:
        self.inner = inner
        self.answers = answers
        self.requests = 0

    async def sample_async(self, prompt: Any, num_samples: int = 1, sampling_params: Any = None,
                           **kwargs: Any) -> Any:
        self.requests += 1
        response = await self.inner.sample_async(prompt=prompt, num_samples=num_samples,
                                                 sampling_params=sampling_params, **kwargs)
        if self.answers is not None:
            self.answers[answer_key(prompt, num_samples, sampling_params)] = [
                (list(s.tokens), list(s.logprobs), s.text, s.stop_reason) for s in response.sequences
            ]
        return response

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class InMemorySampler:
    """Answers each request from a table of the wire run's answers: no pytrio, no HTTP."""

    def __init__(self, answers: dict[tuple[Any, ...], list[tuple[Any, ...]]]) -> None:
        self.answers = answers
        self.requests = 0

    async def sample_async(self, prompt: Any, num_samples: int = 1, sampling_params: Any = None,
                           **kwargs: Any) -> Any:
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
