"""The lab port's rollout scheduling, rebuilt as a benchmark baseline: lock-step rounds.

Round 1 sends one request per question with ``num_samples = group_size``. Every later round
sends one request for every unfinished trajectory, waits for ALL of them, then runs every
pending search of the batch in a pool ``search_concurrency`` wide and waits for ALL of those,
before the next round may start. So each round lasts as long as its slowest sample plus its
slowest search (head-of-line blocking, the lab port's rollout loop).

Only the scheduling is the lab port's. Everything else is the engine's own pieces of
:mod:`searchr1.core.rollout`: the group and its first request (``start_group``), each later
request and its seed (``next_request``), the sampling call (``send_request``), the turn's
parsing and budgets (``record_turn``) and the observation fitting and token stitching
(``add_observation``), so for the same scenario both schedulers produce the same trajectories
token for token; the benchmark asserts that before it compares
their timings. (The lab port's other differences, such as its sampling seeds and its ``tool_overflow="end"``
behaviour, are deliberately not reproduced: they would change the trajectories, not the
schedule.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from searchr1.core.types import (
    SampledSequence,
    SamplingClient,
    SearchExample,
    SearchResult,
    Tokenizer,
    Trajectory,
    Turn,
)
from searchr1.search.tool import SearchBackend
from searchr1.core.protocol import stop_sequences, template_boundaries
from searchr1.core.tools import shown_call
from searchr1.core.rollout import (
    PendingCall,
    RolloutConfig,
    SampleRequest,
    add_observation,
    next_request,
    read_sequence,
    record_turn,
    send_request,
    start_group,
)

DEFAULT_SEARCH_CONCURRENCY = 16  # the lab port's RolloutConfig.search_concurrency


@dataclass
class LockstepStats:
    rounds: int = 0
    sample_requests: int = 0
    searches: int = 0


class LockstepRollout:
    """One batch rolled out in lock-step rounds (see the module docstring)."""

    def __init__(self, sampling_client: SamplingClient, tokenizer: Tokenizer, search_backend: SearchBackend,
                 config: RolloutConfig, *, step: int = 0,
                 search_concurrency: int = DEFAULT_SEARCH_CONCURRENCY) -> None:
        if search_concurrency < 1:
            raise ValueError(f"search_concurrency must be >= 1, got {search_concurrency}")
        self.sampler = sampling_client
        self.tokenizer = tokenizer
        self.search = search_backend
        self.config = config
        self.step = step
        self.search_concurrency = search_concurrency
        self.stop = stop_sequences(tokenizer)
        self.stats = LockstepStats()

    async def _sample(self, request: SampleRequest) -> list[SampledSequence]:
        """One request, no retry, no semaphore (as the lab port)."""
        sequences = await send_request(self.sampler, request, self.config, self.stop)
        self.stats.sample_requests += 1
        return sequences

    def _consume(self, trajectory: Trajectory, prompt: list[int], sequence: SampledSequence) -> PendingCall | None:
        """Record one assistant turn; end the trajectory or return its pending search (the
        engine's own ``record_turn``: only the scheduling differs)."""
        tokens, logprobs, text, stop_reason = read_sequence(sequence, self.tokenizer)
        return record_turn(trajectory, Turn(prompt, tokens, logprobs, text, stop_reason),
                                 self.tokenizer, self.config)

    async def _resolve(self, pending: list[PendingCall]) -> None:
        """All pending searches in a pool ``search_concurrency`` wide; the round waits for all."""
        if not pending:
            return
        pool = asyncio.Semaphore(min(self.search_concurrency, len(pending)))

        async def one(query: str) -> SearchResult:
            async with pool:
                return await self.search.search(query)

        results = await asyncio.gather(*(one(shown_call(p.calls[0])) for p in pending))
        self.stats.searches += len(pending)
        for item, result in zip(pending, results):
            add_observation(item, [result], self.tokenizer, self.config)

    async def run(self, examples: Sequence[SearchExample]) -> list[Trajectory]:
        config = self.config
        template_boundaries(self.tokenizer)
        groups: list[list[Trajectory]] = []
        first: list[tuple[list[Trajectory], SampleRequest]] = []
        for index, example in enumerate(examples):
            group, request = start_group(self.tokenizer, example, index, self.step, config)
            groups.append(group)
            if request is not None:
                first.append((group, request))
        # Round 1: one request per question, num_samples = group_size.
        self.stats.rounds += 1
        responses = await asyncio.gather(*(self._sample(request) for _, request in first))
        pending = [
            self._consume(trajectory, request.prompt_tokens, sequence)
            for (group, request), sequences in zip(first, responses)
            for trajectory, sequence in zip(group, sequences)
        ]
        await self._resolve([p for p in pending if p is not None])
        trajectories = [t for group in groups for t in group]
        # Later rounds: every unfinished trajectory samples once; wait for all; search; wait for all.
        while True:
            requests: list[tuple[Trajectory, SampleRequest]] = []
            for trajectory in trajectories:
                if trajectory.done:
                    continue
                request = next_request(self.tokenizer, trajectory, self.step, config)
                if request is not None:
                    requests.append((trajectory, request))
            if not requests:
                break
            self.stats.rounds += 1
            responses = await asyncio.gather(*(self._sample(request) for _, request in requests))
            pending = [
                self._consume(trajectory, request.prompt_tokens, sequences[0])
                for (trajectory, request), sequences in zip(requests, responses)
            ]
            await self._resolve([p for p in pending if p is not None])
        return trajectories


async def lockstep_rollout_async(sampling_client: SamplingClient, tokenizer: Tokenizer, search_backend: SearchBackend,
                                 examples: Sequence[SearchExample], config: RolloutConfig, *,
                                 step: int = 0,
                                 search_concurrency: int = DEFAULT_SEARCH_CONCURRENCY) -> list[Trajectory]:
    """Roll out ``examples`` in lock-step rounds; same return shape as ``rollout_batch_async``."""
    engine = LockstepRollout(sampling_client, tokenizer, search_backend, config, step=step,
                             search_concurrency=search_concurrency)
    return await engine.run(examples)
