"""The seed's rollout scheduling, rebuilt as a benchmark baseline: lock-step rounds.

Round 1 sends one request per question with ``num_samples = group_size``. Every later round
sends one request for every unfinished trajectory, waits for ALL of them, then runs every
pending search of the batch in a pool ``search_concurrency`` wide and waits for ALL of those,
before the next round may start. So each round lasts as long as its slowest sample plus its
slowest search (head-of-line blocking, ``seed-system.md`` §2.4 and §15 item 2).

Only the scheduling is the seed's. Everything a trajectory decides (parsing, budgets, the
observation fitting, token stitching, seeds, scoring, advantages) is the real code of
:mod:`searchr1.core.rollout` and :mod:`searchr1.core.protocol`, so for the same scenario both schedulers
produce the same trajectories token for token; the benchmark asserts that before it compares
their timings. (The seed's other differences, such as its seeds and its ``tool_overflow="end"``
behaviour, are deliberately not reproduced: they would change the trajectories, not the
schedule.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from searchr1.core.types import AssistantTurn, SearchBackend, SearchExample, Trajectory
from searchr1.core.protocol import (
    initial_messages,
    stop_sequences,
    template_boundaries,
)
from searchr1.core.rollout import (
    MalformedSampleError,
    PendingSearch,
    RolloutConfig,
    SampleRequest,
    consume_assistant,
    finish_search,
    make_request,
    read_sequence,
    sampling_seed,
)

DEFAULT_SEARCH_CONCURRENCY = 16  # the seed's RolloutConfig.search_concurrency


@dataclass
class LockstepStats:
    rounds: int = 0
    sample_requests: int = 0
    searches: int = 0


class LockstepRollout:
    """One batch rolled out in lock-step rounds (see the module docstring)."""

    def __init__(self, sampling_client: Any, tokenizer: Any, search_backend: SearchBackend,
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

    async def _sample(self, request: SampleRequest) -> list[Any]:
        """One request, no retry, no semaphore (as the seed)."""
        import pytrio as trio

        params = trio.SamplingParams(
            max_tokens=request.max_tokens, seed=request.seed, stop=self.stop or None,
            temperature=self.config.temperature, top_p=self.config.top_p,
        )
        response = await self.sampler.sample_async(
            prompt=trio.ModelInput.from_ints(request.prompt_tokens), num_samples=request.num_samples,
            sampling_params=params, return_text=True,
        )
        sequences = list(response.sequences)
        if len(sequences) != request.num_samples:
            raise MalformedSampleError(
                f"sampler returned {len(sequences)} sequences for num_samples={request.num_samples}"
            )
        self.stats.sample_requests += 1
        return sequences

    def _consume(self, trajectory: Trajectory, prompt: list[int], sequence: Any) -> PendingSearch | None:
        """Record one assistant turn; end the trajectory or return its pending search (the
        engine's own ``consume_assistant``: only the scheduling differs)."""
        tokens, logprobs, text, stop_reason = read_sequence(sequence, self.tokenizer)
        return consume_assistant(trajectory, AssistantTurn(prompt, tokens, logprobs, text, stop_reason),
                                 self.tokenizer, self.config)

    async def _resolve(self, pending: list[PendingSearch]) -> None:
        """All pending searches in a pool ``search_concurrency`` wide; the round waits for all."""
        if not pending:
            return
        pool = asyncio.Semaphore(min(self.search_concurrency, len(pending)))

        async def one(query: str) -> Any:
            async with pool:
                return await self.search.search(query)

        results = await asyncio.gather(*(one(p.query) for p in pending))
        self.stats.searches += len(pending)
        for item, result in zip(pending, results):
            finish_search(item, result, self.tokenizer, self.config)

    async def run(self, examples: Sequence[SearchExample]) -> list[Trajectory]:
        config = self.config
        template_boundaries(self.tokenizer)
        budget = config.max_search_calls if config.state_search_budget else None
        groups: list[list[Trajectory]] = []
        first: list[tuple[list[Trajectory], SampleRequest]] = []
        for index, example in enumerate(examples):
            messages = initial_messages(example.question, max_search_calls=budget)
            branches = [Trajectory(example, index, g, [dict(m) for m in messages])
                        for g in range(config.group_size)]
            groups.append(branches)
            seed = sampling_seed(config.seed, self.step, index, 0, 0)
            request = make_request(self.tokenizer, branches[0], config.group_size, seed, config)
            if request is None:
                for branch in branches[1:]:
                    branch.finish(branches[0].termination or "prompt_too_long")
                continue
            first.append((branches, request))
        # Round 1: one request per question, num_samples = group_size.
        self.stats.rounds += 1
        responses = await asyncio.gather(*(self._sample(request) for _, request in first))
        pending = [
            self._consume(branch, request.prompt_tokens, sequence)
            for (branches, request), sequences in zip(first, responses)
            for branch, sequence in zip(branches, sequences)
        ]
        await self._resolve([p for p in pending if p is not None])
        trajectories = [t for group in groups for t in group]
        # Later rounds: every unfinished trajectory samples once; wait for all; search; wait for all.
        while True:
            requests: list[tuple[Trajectory, SampleRequest]] = []
            for trajectory in trajectories:
                if trajectory.done:
                    continue
                seed = sampling_seed(config.seed, self.step, trajectory.question_index,
                                     trajectory.group_index, len(trajectory.turns))
                request = make_request(self.tokenizer, trajectory, 1, seed, config)
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


async def lockstep_rollout_async(sampling_client: Any, tokenizer: Any, search_backend: SearchBackend,
                                 examples: Sequence[SearchExample], config: RolloutConfig, *,
                                 step: int = 0,
                                 search_concurrency: int = DEFAULT_SEARCH_CONCURRENCY) -> list[Trajectory]:
    """Roll out ``examples`` in lock-step rounds; same return shape as ``rollout_batch_async``."""
    engine = LockstepRollout(sampling_client, tokenizer, search_backend, config, step=step,
                             search_concurrency=search_concurrency)
    return await engine.run(examples)
