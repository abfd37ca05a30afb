"""The rollout engine: every trajectory is its own small state machine, four phases in a loop.
Each phase has one handler, the only code that ends a trajectory in that phase:

    REQUEST  make_request               the prompt, and how many tokens are left to generate
             ends on: prompt_too_long, token_budget
    SAMPLE   BatchRollout.sample_turns  the sampler's turn (timeouts and retries are the runtime's)
             ends on: sampler_error
    TURN     record_turn                the turn parsed, its call checked against the declared tools
                                        and the budgets
             ends on: answer, no_answer, invalid, search_budget, turn_budget, token_budget
    CALL     add_observation            the tool's result (or why the call was refused) fitted into
                                        the room left (or a folded context), tokens stitched
             ends on: search_error, tool_overflow
    ... then REQUEST again.

The first turn of a question is one sampling request with ``num_samples = group_size`` on the
shared prompt. From then on each trajectory runs as its own asyncio task, strictly
sequential inside itself and concurrent with all others, under one global sampling
semaphore (the search backend applies its own caps). Nobody waits for the slowest sample or
the slowest search of a "round": there are no rounds.

Trajectories keep exactly the tokens the sampler returned; the chat template is used only
for the environment's tokens (see :mod:`searchr1.core.protocol`). Given the same scenario,
cassettes and seed, the result does not depend on the order in which requests complete:
every sampling seed is derived from (step, question, sample, turn), never from a counter.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from searchr1.core.protocol import (
    TurnKind,
    assistant_message,
    build_prompt,
    observation_tokens,
    parse_assistant,
    stop_sequences,
    system_prompt,
    template_boundaries,
    tool_message,
)
from searchr1.core.budgets import InvalidCallPolicy, RolloutBudgets, declared_tools, tool_schemas
from searchr1.core.context import ContextPolicy, fold_messages, leaves_room
from searchr1.core.observation.fit import FittedCalls, fit_calls, observation_room
from searchr1.core.reward import extract_answer
from searchr1.core.settings import check_settings, setting
from searchr1.core.tools import CallError, ParsedCall, ToolBackend, ToolCall, shown_call, without_ids
from searchr1.core.types import (
    CallRecord,
    Message,
    SampledSequence,
    SamplingClient,
    SearchExample,
    SearchResult,
    Termination,
    Tokenizer,
    Trajectory,
    Turn,
)

log = logging.getLogger("searchr1.core.rollout")
T = TypeVar("T")
# partial rollouts: the sampler (and its version) of a trajectory's turn, by the trajectory and turn index
TurnSampler = Callable[[Trajectory, int], Awaitable[tuple[SamplingClient, int]]]


@dataclass(frozen=True)
class SamplingRuntime:
    """How the sampling service is driven: requests in flight, timeouts, retries (not in the lab port).
    None of it changes what a trajectory is, only how long it takes and whether a failing service
    ends it. Declared as :class:`~searchr1.core.budgets.RolloutBudgets` is."""

    sampling_concurrency: int = setting(64, at_least=1, at_most=4096, help="Sampling requests in flight at once.")
    sample_timeout: float | None = setting(
        900.0, above=0.0, help="Seconds before one sampling request is abandoned (then retried).")
    sample_retries: int = setting(2, at_least=0, at_most=100, help="Retries of a retryable sampling failure.")
    sample_retry_backoff: float = setting(1.0, at_least=0.0, cli=False)
    max_sampler_failure_fraction: float = setting(0.25, at_least=0.0, at_most=1.0, cli=False)

    def __post_init__(self) -> None:
        check_settings(self)


@dataclass(frozen=True)
class RolloutConfig(SamplingRuntime, RolloutBudgets):
    """A rollout's settings as the commands and ``config.json`` hold them, in one flat object: the
    algorithm's budgets (:class:`~searchr1.core.budgets.RolloutBudgets`) and the sampling runtime
    (:class:`SamplingRuntime`). The rollout's steps take the part they need."""

    def __post_init__(self) -> None:
        RolloutBudgets.__post_init__(self)  # the tool list as names, then every setting's rule


def effective_system_prompt(budgets: RolloutBudgets) -> str:
    """The system message every trajectory of ``budgets`` starts with."""
    return system_prompt(budgets.max_search_calls if budgets.state_search_budget else None, budgets.system_prompt,
                         budgets.tools, budgets.max_calls_per_turn)


class SamplerFailureError(RuntimeError):
    """Too large a share of the batch could not be sampled."""


@dataclass(frozen=True)
class SampleRequest:
    prompt_tokens: list[int]
    num_samples: int
    max_tokens: int
    seed: int


def sampling_seed(base: int, step: int, question_index: int, group_index: int, turn: int) -> int:
    """A 31-bit seed that differs for every step, question, sample and turn: a hash of all five,
    so no two samples share their noise, within a step or across steps."""
    material = f"{base}/{step}/{question_index}/{group_index}/{turn}".encode()
    return int.from_bytes(hashlib.blake2b(material, digest_size=4).digest(), "big") & 0x7FFFFFFF


def make_request(tokenizer: Tokenizer, group: Sequence[Trajectory], seed: int,
                 budgets: RolloutBudgets) -> SampleRequest | None:
    """REQUEST: the next sampling request of ``group``, one sample per trajectory (one trajectory,
    or a question's whole group on their shared first prompt). ``None`` when not even one token
    could be generated: every one of them ends, on ``token_budget`` (``prompt_too_long`` before
    its first turn)."""
    first = group[0]
    if first.next_prompt_tokens is not None:
        prompt = first.next_prompt_tokens
    else:
        prompt = build_prompt(tokenizer, first.messages, tools=tool_schemas(budgets), thinking=budgets.thinking)
        for trajectory in group:
            trajectory.whole_tokens = len(prompt)
    # the turn's cap, what the context's window leaves, what the whole trajectory's budget leaves
    max_tokens = min(budgets.max_assistant_tokens, budgets.window - len(prompt),
                     budgets.max_trajectory_tokens - first.whole_tokens)
    if max_tokens <= 0:
        for trajectory in group:
            trajectory.finish(Termination.TOKEN_BUDGET if trajectory.turns else Termination.PROMPT_TOO_LONG)
        return None
    return SampleRequest(list(prompt), len(group), max_tokens, seed)


def start_group(tokenizer: Tokenizer, example: SearchExample, question_index: int, step: int,
                budgets: RolloutBudgets) -> tuple[list[Trajectory], SampleRequest | None]:
    """The ``group_size`` trajectories of one question and their shared first request
    (``num_samples = group_size``; ``None`` when the prompt alone is over the budget)."""
    messages: list[Message] = [{"role": "system", "content": effective_system_prompt(budgets)},
                               {"role": "user", "content": example.question}]
    group = [Trajectory(example, question_index, g, [m.copy() for m in messages]) for g in range(budgets.group_size)]
    return group, make_request(tokenizer, group, sampling_seed(budgets.seed, step, question_index, 0, 0), budgets)


def next_request(tokenizer: Tokenizer, trajectory: Trajectory, step: int,
                 budgets: RolloutBudgets) -> SampleRequest | None:
    """The request of the trajectory's next turn (seeded by step, question, sample and turn)."""
    seed = sampling_seed(budgets.seed, step, trajectory.question_index, trajectory.group_index, len(trajectory.turns))
    return make_request(tokenizer, [trajectory], seed, budgets)


class MalformedSampleError(ValueError):
    """The sampler answered, but not with what was asked for."""


async def send_request(sampler: SamplingClient, request: SampleRequest, budgets: RolloutBudgets,
                       stop: list[str]) -> list[SampledSequence]:
    """One sampling call; exactly ``num_samples`` sequences, or :class:`MalformedSampleError`."""
    import pytrio as trio

    params = trio.SamplingParams(max_tokens=request.max_tokens, seed=request.seed, stop=stop or None,
                                 temperature=budgets.temperature, top_p=budgets.top_p)
    response = await sampler.sample_async(prompt=trio.ModelInput.from_ints(request.prompt_tokens),
                                          num_samples=request.num_samples, sampling_params=params, return_text=True)
    sequences = list(response.sequences)
    if len(sequences) != request.num_samples:
        raise MalformedSampleError(f"sampler returned {len(sequences)} sequences for num_samples={request.num_samples}")
    return sequences


def read_sequence(sequence: SampledSequence, tokenizer: Tokenizer) -> tuple[list[int], list[float], str, str]:
    """Tokens, logprobs, text and stop reason of one sampled sequence."""
    tokens = [int(t) for t in sequence.tokens]
    logprobs = [float(x) for x in sequence.logprobs]
    if len(tokens) != len(logprobs):
        raise MalformedSampleError(f"sampler returned {len(tokens)} tokens but {len(logprobs)} logprobs")
    text = sequence.text if sequence.text is not None else tokenizer.decode(tokens, skip_special_tokens=True)
    return tokens, logprobs, text, str(getattr(sequence, "stop_reason", "") or "")


def is_sampler_failure(error: BaseException) -> bool:
    """A failure of the sampling service (the trajectory ends as ``sampler_error``).

    Anything else (a bug, a scenario that does not match, a missing cassette entry) is not the
    service's fault and propagates.
    """
    from pytrio import PyTrioError

    return isinstance(error, (PyTrioError, TimeoutError, ConnectionError, OSError, MalformedSampleError))


def is_retryable(error: BaseException) -> bool:
    """Worth another sampling attempt: timeouts, dropped connections, and SDK errors that say so."""
    if isinstance(error, (asyncio.TimeoutError, TimeoutError, ConnectionError)):
        return True
    return getattr(error, "retryable", False) is True


@dataclass(frozen=True)
class PendingCall:
    """The calls of one turn within their budgets, waiting for their results, in call order: calls
    to run, and refused ones whose reason the model will read (``invalid_calls=observe``)."""

    trajectory: Trajectory
    messages_before_assistant: list[Message]
    assistant: Message  # the turn as the template shows it: its text (and reasoning, thinking on)
    prompt_tokens: list[int]
    completion_tokens: list[int]
    call_ids: tuple[str, ...]
    calls: tuple[ParsedCall, ...]


def record_turn(trajectory: Trajectory, turn: Turn, tokenizer: Tokenizer,
                budgets: RolloutBudgets) -> PendingCall | None:
    """TURN: record one assistant turn; end the trajectory (an answer, a refused call, a budget
    spent) or return the calls it makes."""
    trajectory.turns.append(turn)
    tokens, prompt = turn.completion_tokens, turn.prompt_tokens
    tools = declared_tools(budgets)
    parsed = parse_assistant(turn.text, tools, budgets.max_calls_per_turn, thinking=budgets.thinking)
    text = parsed.text  # the one place that decides what the turn said (no stop string, no reasoning)
    messages_before = list(trajectory.messages)
    assistant = assistant_message(text, parsed.reasoning)
    trajectory.messages.append(assistant)
    if parsed.kind == TurnKind.ANSWER:  # a reply without a tool call: an answer only if it can be scored
        trajectory.finish(Termination.ANSWER if extract_answer(text) is not None else Termination.NO_ANSWER, text)
        return None
    if parsed.kind == TurnKind.INVALID and budgets.invalid_calls == InvalidCallPolicy.END:
        trajectory.finish(Termination.INVALID, text)
        return None
    calls = parsed.calls
    if len(calls) > budgets.max_calls_per_turn:  # too many calls: the model reads why, and none runs
        calls = calls[-1:]
    made = Counter(call.name for call in calls if isinstance(call, ToolCall))  # refused calls count for none
    if any(tool.budget is not None and trajectory.calls_of(tool.name) + made[tool.name] > tool.budget
           for tool in tools):
        trajectory.finish(Termination.SEARCH_BUDGET, text)
        return None
    if len(trajectory.turns) >= budgets.max_assistant_turns:
        trajectory.finish(Termination.TURN_BUDGET, text)
        return None
    least = observation_tokens(tokenizer, ["x"] * len(calls), thinking=budgets.thinking)
    room = observation_room(tokenizer, prompt, tokens, budgets, whole=trajectory.whole_tokens,
                            foldable=budgets.context == ContextPolicy.FOLD)  # a fold makes room in the window
    if len(least) > room:
        trajectory.finish(Termination.TOKEN_BUDGET, text)  # not even a one-letter observation fits: no call
        return None
    ids = tuple(f"{call.name if isinstance(call, ToolCall) else 'call'}-{trajectory.question_index}-"
                f"{trajectory.group_index}-{len(trajectory.calls) + number}" for number, call in enumerate(calls, 1))
    return PendingCall(trajectory, messages_before, assistant, list(prompt), list(tokens), ids, calls)


def record_call(trajectory: Trajectory, call: ParsedCall, result: SearchResult, *, ok: bool, observation: str,
                error: str | None, truncated: bool = False) -> None:
    """The environment's record of one call, kept with the turn that made it."""
    trajectory.turns[-1].calls.append(CallRecord(shown_call(call), ok, observation, len(result.items), error, result.cached,
                                                 truncated, tool=call.name, refused=isinstance(call, CallError)))


def add_observation(pending: PendingCall, results: Sequence[SearchResult], tokenizer: Tokenizer,
                    budgets: RolloutBudgets) -> None:
    """CALL: fit the results (or the reasons calls were refused) into the trajectory, in call
    order, and stitch its next prompt, or end it.

    A result is outside text: if turning the results into an observation raises anything at
    all, the trajectory ends as ``search_error`` (an environment failure: its group is left out
    like one with a failed search) and the run goes on.
    """
    trajectory = pending.trajectory
    answered = [(call_id, call.name, result) for call_id, call, result in zip(pending.call_ids, pending.calls, results)]
    try:
        before, base, fitted = fit_or_fold(pending, answered, tokenizer, budgets)
    except Exception as error:  # noqa: BLE001 - one bad tool result must not end the run
        reason = f"the {pending.calls[0].name or 'tool'} result could not become an observation ({type(error).__name__})"
        shown = shown_call(pending.calls[0])[:80]
        log.warning("query %r: %s; the trajectory ends as a search failure", shown, reason)
        for call, result in zip(pending.calls, results):
            record_call(trajectory, call, result, ok=False, observation="", error=reason)
        trajectory.finish(Termination.SEARCH_ERROR, pending.assistant["content"])
        return
    if fitted is None:
        trajectory.finish(Termination.TOOL_OVERFLOW, pending.assistant["content"])
        return
    if base is not pending.prompt_tokens:  # the context folded: the conversation goes on from its stubs
        trajectory.folds += 1
        trajectory.messages = before + [pending.assistant]
    trajectory.whole_tokens += len(fitted.next_prompt) - len(base)  # completion, closing, observation
    for (call_id, tool, result), call, content, cut in zip(answered, pending.calls, fitted.contents,
                                                            fitted.truncated):
        trajectory.messages.append(tool_message(call_id, content, tool))
        record_call(trajectory, call, result, ok=result.ok, observation=content, error=result.error, truncated=cut)
    trajectory.next_prompt_tokens = fitted.next_prompt


def fit_or_fold(pending: PendingCall, answered: Sequence[tuple[str, str, SearchResult]], tokenizer: Tokenizer,
                budgets: RolloutBudgets) -> tuple[list[Message], list[int], FittedCalls | None]:
    """The results fitted into the trajectory's context; with ``--context fold``, when that leaves
    the next turn less than its generation cap in the window, fitted again into a folded context
    (earlier tool results as stubs, rendered afresh: :mod:`searchr1.core.context`) if they fit
    there. Returns the messages before the turn and the prompt the next one extends, and the fit."""
    trajectory = pending.trajectory
    before, base = pending.messages_before_assistant, pending.prompt_tokens
    fitted = fit_calls(tokenizer, before, pending.assistant, base, pending.completion_tokens, answered, budgets,
                       whole=trajectory.whole_tokens)
    if budgets.context != ContextPolicy.FOLD or (
            fitted is not None and leaves_room(len(fitted.next_prompt), budgets.window, budgets.max_assistant_tokens)):
        return before, base, fitted
    folded = fold_messages(before, trajectory.calls)
    prompt = build_prompt(tokenizer, folded, tools=tool_schemas(budgets), thinking=budgets.thinking)
    refitted = fit_calls(tokenizer, folded, pending.assistant, prompt, pending.completion_tokens, answered, budgets,
                         whole=trajectory.whole_tokens)
    return (folded, prompt, refitted) if refitted is not None else (before, base, fitted)


async def run_all(coroutines: Iterable[Coroutine[object, object, T]]) -> list[T]:
    """Run concurrently; if one fails, cancel the rest and raise that error itself."""
    try:
        async with asyncio.TaskGroup() as task_group:
            tasks: list[asyncio.Task[T]] = [task_group.create_task(c) for c in coroutines]
    except BaseExceptionGroup as failure:
        first = failure.exceptions[0]
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None
    return [task.result() for task in tasks]


class BatchRollout:
    """One batch being rolled out: what its trajectories share (the sampler and its slots, the
    backend of each declared tool, the budgets), one task per question and then per trajectory."""

    def __init__(self, sampling_client: SamplingClient, tokenizer: Tokenizer, tools: Mapping[str, ToolBackend],
                 budgets: RolloutBudgets, runtime: SamplingRuntime, step: int,
                 progress: Callable[[int], None] | None, sampling_slots: asyncio.Semaphore | None = None,
                 sampler_version: int = 0, turn_sampler: TurnSampler | None = None) -> None:
        self.sampler = sampling_client
        self.sampler_version = sampler_version  # recorded on every turn it samples
        self.turn_sampler = turn_sampler  # partial rollouts: each turn's own sampler instead
        self.tokenizer = tokenizer
        self.tools = dict(tools)
        self.budgets = budgets
        self.runtime = runtime
        self.step = step
        self.progress = progress
        self.sampling_slots = sampling_slots or asyncio.Semaphore(runtime.sampling_concurrency)
        self.stop_sequences = stop_sequences(tokenizer)
        self.first_failure: str | None = None
        # a passage id is shown only where a declared tool takes one
        self.shows_ids = any(tool.takes_ids for tool in declared_tools(budgets))

    async def send_with_retries(self, request: SampleRequest, sampler: SamplingClient) -> list[SampledSequence]:
        """One request with retries; returns exactly ``num_samples`` sequences or raises."""
        attempt = 0
        while True:
            try:
                # asyncio.timeout, not wait_for: no extra task per request
                async with self.sampling_slots, asyncio.timeout(self.runtime.sample_timeout):
                    return await send_request(sampler, request, self.budgets, self.stop_sequences)
            except Exception as error:  # noqa: BLE001 - classified below, never swallowed silently
                if attempt >= self.runtime.sample_retries or not is_retryable(error):
                    raise
                attempt += 1
                log.warning("sampling failed (%s), retry %d/%d", type(error).__name__,
                            attempt, self.runtime.sample_retries)
                await asyncio.sleep(self.runtime.sample_retry_backoff * 2 ** (attempt - 1))

    async def sample_turns(self, group: list[Trajectory], request: SampleRequest) -> list[Turn | None]:
        """SAMPLE: one turn per trajectory of ``group``, or ``None`` for each that ends as
        ``sampler_error`` (the service failed after its retries, or returned a malformed sequence)."""
        sampler, version = self.sampler, self.sampler_version
        if self.turn_sampler is not None:
            sampler, version = await self.turn_sampler(group[0], len(group[0].turns))
        try:
            sequences = await self.send_with_retries(request, sampler)
        except Exception as error:  # noqa: BLE001
            if not is_sampler_failure(error):
                raise
            return self.sampler_failed(group, error)
        turns: list[Turn | None] = []
        for trajectory, sequence in zip(group, sequences):
            try:
                turns.append(Turn(request.prompt_tokens, *read_sequence(sequence, self.tokenizer),
                                  sampler=version, context=trajectory.folds))
            except MalformedSampleError as error:
                turns += self.sampler_failed([trajectory], error)
        return turns

    def sampler_failed(self, trajectories: list[Trajectory], error: BaseException) -> list[Turn | None]:
        """End ``trajectories`` as ``sampler_error``; ``None`` in place of each one's turn."""
        summary = f"{type(error).__name__}: {str(error)[:200]}"
        self.first_failure = self.first_failure or summary
        log.warning("sampling failed for good (%s)", summary)
        for trajectory in trajectories:
            trajectory.finish(Termination.SAMPLER_ERROR)
        return [None] * len(trajectories)

    async def run_call(self, call: ParsedCall) -> SearchResult:
        """The result of one call from its tool's backend, or (for a refused call, no request made)
        the reason it was refused."""
        if isinstance(call, CallError):
            return SearchResult(ok=False, error=call.reason)
        result = await self.tools[call.name].call(call)
        return result if self.shows_ids else without_ids(result)

    async def run_calls(self, pending: PendingCall) -> list[SearchResult]:
        """The results of a turn's calls, in call order; several calls run at once."""
        if len(pending.calls) == 1:
            return [await self.run_call(pending.calls[0])]
        return await run_all(self.run_call(call) for call in pending.calls)

    async def run_question(self, question_index: int, example: SearchExample) -> list[Trajectory]:
        """One question: its group's shared first request, then one task per trajectory."""
        group, request = start_group(self.tokenizer, example, question_index, self.step, self.budgets)
        if request is None:
            log.warning("question %s: the prompt alone exceeds max_trajectory_tokens", example.id)
        turns = await self.sample_turns(group, request) if request is not None else [None] * len(group)
        await run_all(self.run_trajectory(trajectory, turn) for trajectory, turn in zip(group, turns))
        return group

    async def run_trajectory(self, trajectory: Trajectory, turn: Turn | None) -> None:
        """From the first sampled turn: TURN, CALL, REQUEST, SAMPLE, TURN, ... until a phase ends it."""
        while turn is not None:
            pending = record_turn(trajectory, turn, self.tokenizer, self.budgets)
            if pending is None:
                break
            add_observation(pending, await self.run_calls(pending), self.tokenizer, self.budgets)
            request = None if trajectory.done else next_request(self.tokenizer, trajectory, self.step, self.budgets)
            turn = None if request is None else (await self.sample_turns([trajectory], request))[0]
        if self.progress is not None:  # one more trajectory has ended
            self.progress(1)


async def rollout_batch_async(
    sampling_client: SamplingClient,
    tokenizer: Tokenizer,
    tools: Mapping[str, ToolBackend],
    examples: Sequence[SearchExample],
    config: RolloutConfig,
    progress_callback: Callable[[int], None] | None = None,
    *,
    step: int = 0,
    sampling_slots: asyncio.Semaphore | None = None,
    first_question_index: int = 0,
    sampler_version: int = 0,
    turn_sampler: TurnSampler | None = None,
) -> list[Trajectory]:
    """``group_size`` trajectories per example, ordered by question, then sample; unscored (the
    step scores them next). ``tools`` runs each declared tool by name, search among them.
    ``sampling_slots``: a cap on sampling requests shared by batches rolling out at once (the
    off-policy pipeline; by default the batch has ``sampling_concurrency`` of its own).
    ``first_question_index``: where question numbers (which group and seed) start; dynamic
    sampling's extra draws of a step use fresh ones. ``sampler_version``: the training steps
    finished before the weights ``sampling_client`` serves, recorded on every turn; ``turn_sampler``
    (partial rollouts) gives each turn its own sampler and version instead. Raises
    :class:`SamplerFailureError` when more than ``max_sampler_failure_fraction`` could not be
    sampled (a smaller share ends as ``sampler_error`` and is left out of the update)."""
    template_boundaries(tokenizer, thinking=config.thinking)  # learn the template's boundaries once, before any task
    missing = [name for name in config.tools if name not in tools]
    if missing:
        raise ValueError(f"no backend runs the declared tool {missing[0]!r}")
    batch = BatchRollout(sampling_client, tokenizer, tools, budgets=config, runtime=config, step=step,
                         progress=progress_callback, sampling_slots=sampling_slots, sampler_version=sampler_version,
                         turn_sampler=turn_sampler)
    groups = await run_all(
        batch.run_question(index, example) for index, example in enumerate(examples, first_question_index)
    )
    trajectories = [t for group in groups for t in group]
    failed = sum(t.sampler_error for t in trajectories)
    if trajectories and failed / len(trajectories) > config.max_sampler_failure_fraction:
        raise SamplerFailureError(
            f"{failed} of {len(trajectories)} trajectories could not be sampled (more than "
            f"max_sampler_failure_fraction={config.max_sampler_failure_fraction}); "
            f"the sampling service looks unhealthy (first failure: {batch.first_failure})"
        )
    return trajectories
