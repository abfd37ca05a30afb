"""The served model: one turn for a client's conversation, or the whole agent for a question.

:class:`ChatModel` holds what ``serve`` started: a ``pytrio.SamplingClient`` (a trained run's
weights, live or on the offline twin), the tokenizer, the rollout settings, and the search and
tool backends. :meth:`ChatModel.turn` renders the client's messages and tools with the official
Qwen3.5 chat template (thinking off, as in training), samples one assistant turn (with the
rollout's ``sample_timeout`` and ``sample_retries``) and reads its calls against the client's
schemas; for a request without tools, sampling stops where a call would begin and the reply holds
the text before it. :meth:`ChatModel.agent` runs the training engine's rollout
(:func:`~searchr1.core.rollout.rollout_batch_async`, one trajectory) with the server's declared
tools, and answers with the final reply and every turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from searchr1.core.protocol import stop_sequences
from searchr1.core.rollout import RolloutConfig, is_retryable, read_sequence, rollout_batch_async
from searchr1.core.tools import ToolBackend
from searchr1.runtime.tokenizer import Qwen35Tokenizer
from searchr1.search.tool import SearchBackend, with_search
from searchr1.core.types import SamplingClient, SearchExample, Trajectory
from searchr1.serve.chat_api import CALL_MARKUP, ChatRequest, Reply, read_reply, without_call_markup

if TYPE_CHECKING:
    from pytrio.types import ModelInput, SampleResponse, SamplingParams

MAX_CONCURRENT_COMPLETIONS = 16  # completions sampled at once; later requests wait their turn


@dataclass
class ChatModel:
    """What answers requests; ``policy`` names what produces the answers (offline: the twin's
    policy, never the model), and every answer carries it."""

    sampler: SamplingClient
    tokenizer: Qwen35Tokenizer
    rollout: RolloutConfig
    search: SearchBackend
    tools: Mapping[str, ToolBackend]
    name: str
    policy: str
    check_question: Callable[[str], None] | None = None  # refuses a question the policy cannot answer
    max_concurrent: int = MAX_CONCURRENT_COMPLETIONS

    def __post_init__(self) -> None:
        self._slots: asyncio.Semaphore | None = None

    @property
    def slots(self) -> asyncio.Semaphore:
        if self._slots is None:  # made on the server's event loop
            self._slots = asyncio.Semaphore(self.max_concurrent)
        return self._slots

    def prompt_tokens(self, request: ChatRequest) -> list[int]:
        text = str(self.tokenizer.apply_chat_template(
            request.messages, tools=[tool.schema() for tool in request.tools] or None, tokenize=False,
            add_generation_prompt=True, enable_thinking=False))
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    async def turn(self, request: ChatRequest) -> Reply:
        """One assistant turn for the client's conversation."""
        import pytrio as trio

        prompt = self.prompt_tokens(request)
        stop = stop_sequences(self.tokenizer) + ([] if request.tools else [CALL_MARKUP[0]])
        params = trio.SamplingParams(
            max_tokens=request.max_tokens or self.rollout.max_assistant_tokens,
            seed=self.rollout.seed if request.seed is None else request.seed,
            stop=stop or None,
            temperature=self.rollout.temperature if request.temperature is None else request.temperature,
            top_p=self.rollout.top_p if request.top_p is None else request.top_p)
        async with self.slots:
            response = await self.sample(trio.ModelInput.from_ints(prompt), params)
        tokens, _, text, stop_reason = read_sequence(response.sequences[0], self.tokenizer)
        content, calls = read_reply(text, request.tools)
        finish = "tool_calls" if calls else "length" if stop_reason == "length" else "stop"
        return Reply(content, calls, finish, len(prompt), len(tokens), {"policy": self.policy})

    async def sample(self, prompt: ModelInput, params: SamplingParams) -> SampleResponse:
        """One sample of ``prompt``, abandoned after the rollout's ``sample_timeout`` and tried
        again ``sample_retries`` times on a retryable failure, as the rollout samples."""
        attempt = 0
        while True:
            try:
                async with asyncio.timeout(self.rollout.sample_timeout):
                    return await self.sampler.sample_async(prompt=prompt, num_samples=1, sampling_params=params,
                                                           return_text=True)
            except Exception as error:  # noqa: BLE001 - retried or raised, never swallowed
                if attempt >= self.rollout.sample_retries or not is_retryable(error):
                    raise
                attempt += 1
                await asyncio.sleep(self.rollout.sample_retry_backoff * 2 ** (attempt - 1))

    async def agent(self, request: ChatRequest) -> Reply:
        """The agent's final reply to the request's question, its turns attached."""
        rollout = self.rollout
        config = replace(rollout, group_size=1,
                         temperature=rollout.temperature if request.temperature is None else request.temperature,
                         top_p=rollout.top_p if request.top_p is None else request.top_p,
                         seed=rollout.seed if request.seed is None else request.seed)
        if request.max_tokens is not None:
            config = replace(config, max_assistant_tokens=min(request.max_tokens, config.max_assistant_tokens))
        example = SearchExample(id="serve", question=request.question.strip(), answers=(), data_source="serve")
        async with self.slots:
            (trajectory,) = await rollout_batch_async(self.sampler, self.tokenizer, with_search(self.search, self.tools),
                                                      [example], config)
        return agent_reply(trajectory, self.policy)


def agent_reply(trajectory: Trajectory, policy: str) -> Reply:
    """A finished trajectory as an answer: its last assistant text (without the call markup of a
    trajectory that ended on a call: a refused one, or one past its budget), every message after
    the system prompt as ``turns``, and how it ended."""
    prompt = sum(len(turn.prompt_tokens) for turn in trajectory.turns[:1])
    completion = sum(len(turn.completion_tokens) for turn in trajectory.turns)
    turns = [message for message in trajectory.messages if message.get("role") != "system"]
    return Reply(without_call_markup(trajectory.final_text or ""), (), "stop", prompt, completion,
                 {"policy": policy, "turns": turns, "termination": str(trajectory.termination),
                  "tool_calls_made": len(trajectory.calls)})
