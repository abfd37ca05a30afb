"""One Search-R1 step as plainly as possible: sample, parse, search, stitch, score, advantage,
datum, update. Synchronous, one trajectory after another, no metrics, no retries, the seed's
recipe only (mean-centred advantages, exact match, env-failure groups left out, one
``forward_backward``, no KL). The production engine (:mod:`~searchr1.core.rollout` and
:mod:`~searchr1.core.trainer`) is held to it by a property test: same sampler, search and seeds,
same trajectories and datums. ``# ALGORITHM`` marks a decision of Search-R1; ``# PLUMBING`` what
only moves data."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from searchr1.core.observation.fit import truncate_to_fit
from searchr1.core.observation.text import observation_candidates
from searchr1.core.observation.tokens import plain_tokens
from searchr1.core.protocol import (TurnKind, assistant_message, build_next_prompt, build_prompt, initial_messages,
                                    missing_closing, observation_tokens, parse_assistant, stop_sequences, tool_message)
from searchr1.core.reward import extract_answer, score_answer
from searchr1.core.rollout import RolloutConfig, read_sequence, sampling_seed
from searchr1.core.types import (NOT_ANSWERED, AssistantTurn, Exclusion, SearchExample, SearchRecord, SearchResult,
                                 Termination, Tokenizer, Trajectory)

if TYPE_CHECKING:  # pytrio is loaded when first used, as everywhere in the core
    from pytrio import SamplingClient, TrainingClient
    from pytrio.types import Datum

Search = Callable[[str], SearchResult]  # one query in, one result out (synchronous)


def sample(sampler: SamplingClient, tokenizer: Tokenizer, prompt: list[int], n: int, seed: int,
           config: RolloutConfig) -> list[AssistantTurn] | None:
    """``n`` completions of ``prompt``, or None when the trajectory has no room left to generate."""
    from pytrio import ModelInput, SamplingParams
    max_tokens = min(config.max_assistant_tokens, config.max_trajectory_tokens - len(prompt))  # ALGORITHM: budgets
    if max_tokens <= 0:
        return None
    params = SamplingParams(max_tokens=max_tokens, seed=seed, stop=stop_sequences(tokenizer) or None,
                            temperature=config.temperature, top_p=config.top_p)
    response = sampler.sample(prompt=ModelInput.from_ints(prompt), num_samples=n, sampling_params=params,
                              return_text=True).result()
    return [AssistantTurn(list(prompt), *read_sequence(s, tokenizer)) for s in response.sequences]  # PLUMBING


def step_trajectory(t: Trajectory, turn: AssistantTurn, tokenizer: Tokenizer, search: Search, config: RolloutConfig) -> None:
    """Record one assistant turn; end the trajectory or search and stitch its next prompt."""
    t.turns.append(turn)
    parsed = parse_assistant(turn.text)  # ALGORITHM: exactly one well-formed search call, or an answer
    before = list(t.messages)
    t.messages.append(assistant_message(parsed.text))
    if parsed.kind == TurnKind.ANSWER:  # ALGORITHM: an answer (scored later) only with a scorable Answer: line
        return t.finish(Termination.ANSWER if extract_answer(parsed.text) is not None else Termination.NO_ANSWER, parsed.text)
    if parsed.kind != TurnKind.TOOL:  # a malformed call (format penalty)
        return t.finish(Termination.INVALID, parsed.text)
    if len(t.searches) >= config.max_search_calls:  # ALGORITHM: a tool call over budget ends the trajectory
        return t.finish(Termination.SEARCH_BUDGET, parsed.text)
    if len(t.turns) >= config.max_assistant_turns:
        return t.finish(Termination.TURN_BUDGET, parsed.text)
    # ALGORITHM: the next prompt is this prompt + the sampled tokens as they are + the closing the
    # sampler did not return + the observation; there must be room for one more generated token.
    base = len(turn.prompt_tokens) + len(turn.completion_tokens) + len(missing_closing(tokenizer, turn.completion_tokens))
    if base + len(observation_tokens(tokenizer, "x")) + 1 > config.max_trajectory_tokens:
        return t.finish(Termination.TOKEN_BUDGET, parsed.text)  # not even an empty observation fits
    assert parsed.query is not None  # a tool turn always carries its query
    result, room = search(parsed.query), config.max_trajectory_tokens - 1 - base
    candidates = observation_candidates(result)  # the items, numbered, in rank order (or the error)

    def fits(content: str) -> bool:
        return (len(plain_tokens(tokenizer, content)) <= config.max_tool_response_tokens
                and len(observation_tokens(tokenizer, content)) <= room)

    count = 0  # ALGORITHM: as many whole items as fit; if not even the first does, cut it (marked) or stop
    while count < len(candidates) and fits("\n\n".join(candidates[: count + 1])):
        count += 1
    content = "\n\n".join(candidates[:count]) if count else None
    truncated = content is None and config.tool_overflow == "truncate"
    if truncated:
        content = truncate_to_fit(tokenizer, candidates[0], fits, config.max_tool_response_tokens)
    if content is None:
        return t.finish(Termination.TOOL_OVERFLOW, parsed.text)
    call_id = f"search-{t.question_index}-{t.group_index}-{len(t.searches) + 1}"
    t.next_prompt_tokens = build_next_prompt(tokenizer, before, parsed.text, turn.prompt_tokens,
                                             turn.completion_tokens, tool_message(call_id, content), tools=config.tools)
    t.messages.append(tool_message(call_id, content))
    t.searches.append(SearchRecord(parsed.query, result.ok, content, len(result.items), result.error,
                                   result.cached, truncated))


def reference_rollout(sampler: SamplingClient, tokenizer: Tokenizer, search: Search, examples: Sequence[SearchExample],
                      config: RolloutConfig, *, step: int = 0) -> list[Trajectory]:
    """``group_size`` trajectories per question, in question then sample order."""
    trajectories = []
    for q, example in enumerate(examples):
        budget = config.max_search_calls if config.state_search_budget else None
        messages = initial_messages(example.question, max_search_calls=budget, system_template=config.system_prompt)
        group = [Trajectory(example, q, g, [dict(m) for m in messages]) for g in range(config.group_size)]
        trajectories += group
        # ALGORITHM: the first turn is ONE request with num_samples = group_size on the shared prompt;
        # every seed is a hash of (step, question, sample, turn), never a counter.
        prompt = build_prompt(tokenizer, messages, tools=config.tools)
        first = sample(sampler, tokenizer, prompt, config.group_size, sampling_seed(config.seed, step, q, 0, 0), config)
        for t, turn in zip(group, first or [None] * len(group)):
            while turn is not None:  # one turn, then the next on the stitched prompt
                step_trajectory(t, turn, tokenizer, search, config)
                if t.done:
                    break
                assert t.next_prompt_tokens is not None  # a search stitched the next prompt
                seed = sampling_seed(config.seed, step, q, t.group_index, len(t.turns))
                turn = (sample(sampler, tokenizer, t.next_prompt_tokens, 1, seed, config) or [None])[0]
            if not t.done:  # no room left to generate
                t.finish(Termination.TOKEN_BUDGET if t.turns else Termination.PROMPT_TOO_LONG)
    return trajectories


def score_and_rank(trajectories: list[Trajectory]) -> None:
    """ALGORITHM: reward (exact match of an ``answer`` ending, else -0.1), then advantage = reward minus
    the group mean; a group whose rewards are all equal, or with a failed search, trains on nothing."""
    for t in trajectories:
        t.score = score_answer(t.final_text, t.example.answers) if t.termination == Termination.ANSWER else NOT_ANSWERED
    for q in dict.fromkeys(t.question_index for t in trajectories):
        group = [t for t in trajectories if t.question_index == q]
        rewards = [t.reward for t in group]
        excluded = (Exclusion.ENV_FAILURE_GROUP if any(t.env_error for t in group) else
                    Exclusion.DEGENERATE_GROUP if len(set(rewards)) == 1 else None)
        for t in group:
            t.excluded = excluded
            t.advantage = 0.0 if excluded else t.reward - math.fsum(rewards) / len(rewards)


def reference_datums(trajectories: list[Trajectory], vocab_size: int) -> list[Datum]:
    """ALGORITHM: one datum per trajectory with a signal: the whole token sequence once, shifted by
    one; the loss sees the policy's own tokens only (their advantage and sampler logprob; prompt and
    observation tokens carry 0)."""
    from pytrio.types import Datum, ModelInput, TensorData
    datums = []
    for t in trajectories:
        if t.excluded or t.advantage == 0.0 or not any(turn.completion_tokens for turn in t.turns):
            continue
        tokens, logprobs, advantages = [], [], []
        for turn in t.turns:
            assert turn.prompt_tokens[: len(tokens)] == tokens  # each prompt extends the sequence so far
            delta = turn.prompt_tokens[len(tokens):]
            tokens += delta + turn.completion_tokens
            logprobs += [0.0] * len(delta) + turn.logprobs
            advantages += [0.0] * len(delta) + [t.advantage] * len(turn.completion_tokens)
        if max(tokens) >= vocab_size:  # PLUMBING: PyTRIO refuses ids outside the tokenizer
            continue
        datums.append(Datum(model_input=ModelInput.from_ints(tokens[:-1]), loss_fn_inputs={
            "target_tokens": TensorData.from_numpy(np.asarray(tokens[1:], dtype=np.int64)),
            "logprobs": TensorData.from_numpy(np.asarray(logprobs[1:], dtype=np.float32)),
            "advantages": TensorData.from_numpy(np.asarray(advantages[1:], dtype=np.float32))}))
    return datums


def reference_step(sampler: SamplingClient, training_client: TrainingClient, tokenizer: Tokenizer, search: Search,
                   examples: Sequence[SearchExample], config: RolloutConfig, *, step: int, learning_rate: float,
                   betas: tuple[float, float] = (0.9, 0.95)) -> tuple[list[Trajectory], list[Datum], dict[str, float] | None]:
    """One whole step: its trajectories, datums and loss metrics (None when nothing was sent)."""
    from pytrio import AdamParams
    trajectories = reference_rollout(sampler, tokenizer, search, examples, config, step=step)
    score_and_rank(trajectories)
    datums = reference_datums(trajectories, len(tokenizer))
    if not datums:
        return trajectories, datums, None
    output = training_client.forward_backward(datums, loss_fn="importance_sampling").result()  # ALGORITHM
    training_client.optim_step(AdamParams(learning_rate=learning_rate, beta1=betas[0], beta2=betas[1])).result()
    return trajectories, datums, dict(output.metrics)
