"""One Search-R1 step as plainly as possible: sample, parse, call the tools, stitch, score,
advantage, datum, update. Synchronous, one trajectory after another, no metrics, no retries, the
lab port's recipe only (exact match, mean-centred advantages, env-failure groups left out, one
``forward_backward``, no KL; an off-policy correction on request), with the tools, calls a turn and
refused-call policy the budgets declare.

The production engine (:mod:`~searchr1.core.rollout` and :mod:`~searchr1.core.trainer`) is held to
it by a property test: same sampler, tools and seeds, same trajectories and datums. It uses none of
the engine's helpers: its prompts, parser, stitching, observations, truncation, seeds, reward,
advantages and datums are its own code (the text the model reads and writes is in
:mod:`~searchr1.core.reference_text`), so a bug in one of the engine's shows as a difference.
Shared with the engine: the tokenizer and its chat template, the data types
(:mod:`~searchr1.core.types`), the budgets (``RolloutBudgets``), the declared tools as data
(``DECLARED``: schemas, budgets and what the model reads of each), the system prompt's wording,
numpy and pytrio. Search
results holding special-token strings are outside it (the engine keeps those plain text).

A tool is a function from a call's arguments, as the model wrote them, to its result; ``search``
gets ``{"query": ...}`` and searches the query stripped (the caller's search does the stripping).
``# ALGORITHM`` marks a decision of Search-R1; ``# PLUMBING`` what only moves data."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from searchr1.core.budgets import RolloutBudgets
from searchr1.core.reference_text import (SEARCH, TRUNCATION_MARKER, Call, answer_line,
                                          call_as_shown, fit_observation, normalise_answer,
                                          observation_items, parse_turn, render_text,
                                          render_tokens, sample_turns, system_message)
from searchr1.core.tools import DECLARED
from searchr1.core.types import (NOT_ANSWERED, CallRecord, Exclusion, JsonValue, Message,
                                 RewardResult, SearchExample, SearchResult, Termination, Tokenizer,
                                 Trajectory, Turn)

if TYPE_CHECKING:  # pytrio is loaded when first used, as everywhere in the core
    from pytrio import SamplingClient, TrainingClient
    from pytrio.types import Datum

Tool = Callable[[dict[str, JsonValue]], SearchResult]  # a call's arguments in, its result out
Tools = Mapping[str, Tool]  # every offered tool by name, search among them


def reference_step(sampler: SamplingClient, training_client: TrainingClient, tokenizer: Tokenizer,
                   tools: Tools, examples: Sequence[SearchExample], budgets: RolloutBudgets, *,
                   step: int, learning_rate: float, betas: tuple[float, float] = (0.9, 0.95),
                   correction: str = "none", cap: float = 2.0,
                   bounds: tuple[float, float] = (0.5, 2.0),
                   ) -> tuple[list[Trajectory], list[Datum], dict[str, float] | None]:
    """One whole step: its trajectories, datums and loss metrics (None when nothing was sent)."""
    from pytrio import AdamParams
    trajectories = reference_rollout(sampler, tokenizer, tools, examples, budgets, step=step)
    reference_rewards_and_advantages(trajectories)
    datums = reference_datums(trajectories, len(tokenizer))
    datums = reference_correction(training_client, datums, correction, cap, bounds)
    if not datums:
        return trajectories, datums, None
    # ALGORITHM: one forward_backward of the importance-sampling loss, one optimiser step
    output = training_client.forward_backward(datums, loss_fn="importance_sampling").result()
    adam = AdamParams(learning_rate=learning_rate, beta1=betas[0], beta2=betas[1])
    training_client.optim_step(adam).result()
    return trajectories, datums, dict(output.metrics)


# ---------------------------------------------------------------- rollout

def reference_rollout(sampler: SamplingClient, tokenizer: Tokenizer, tools: Tools,
                      examples: Sequence[SearchExample], budgets: RolloutBudgets, *,
                      step: int = 0) -> list[Trajectory]:
    """``group_size`` trajectories per question, in question then sample order."""
    trajectories = []
    for q, example in enumerate(examples):
        question: Message = {"role": "user", "content": example.question}
        messages = [system_message(budgets), question]
        group = [Trajectory(example, q, g, [m.copy() for m in messages])
                 for g in range(budgets.group_size)]
        trajectories += group
        prompt = render_tokens(tokenizer, messages, budgets, generate=True)
        for t in group:  # ALGORITHM: one context only grows: its length is the trajectory's
            t.whole_tokens = len(prompt)
        # PLUMBING: the template's closing of an assistant turn, what an empty reply adds
        empty_reply: Message = {"role": "assistant", "content": ""}
        replied = render_tokens(tokenizer, messages + [empty_reply], budgets, generate=False)
        closing = replied[len(prompt):]
        # ALGORITHM: the first turn is ONE request, num_samples = group_size, on the shared prompt
        seed = sampling_seed(budgets, step, q, 0, 0)
        first = sample_turns(sampler, tokenizer, prompt, len(group), seed, budgets)
        firsts: list[Turn | None] = list(first) if first else [None] * len(group)
        for t, turn in zip(group, firsts):
            while turn is not None:  # one turn, then the next on the stitched prompt
                take_turn(t, turn, tokenizer, tools, budgets, closing)
                if t.done:
                    break
                assert t.next_prompt_tokens is not None  # the calls stitched the next prompt
                seed = sampling_seed(budgets, step, q, t.group_index, len(t.turns))
                following = sample_turns(sampler, tokenizer, t.next_prompt_tokens, 1, seed, budgets)
                turn = following[0] if following else None
            if not t.done:  # no room left to generate
                t.finish(Termination.TOKEN_BUDGET if t.turns else Termination.PROMPT_TOO_LONG)
    return trajectories


def sampling_seed(budgets: RolloutBudgets, step: int, question: int, sample: int, turn: int) -> int:
    """ALGORITHM: every sampling seed is a hash of (seed, step, question, sample, turn), never a
    counter: the first 4 bytes of its BLAKE2b digest, big-endian, below 2**31."""
    key = f"{budgets.seed}/{step}/{question}/{sample}/{turn}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=4).digest(), "big") % 2**31


def take_turn(t: Trajectory, turn: Turn, tokenizer: Tokenizer, tools: Tools,
              budgets: RolloutBudgets, closing: list[int]) -> None:
    """Record one assistant turn; end the trajectory, or run its calls and stitch its next
    prompt."""
    t.turns.append(turn)
    text, kind, calls = parse_turn(turn.text, budgets)
    t.messages.append({"role": "assistant", "content": text})
    if kind == "answer":  # ALGORITHM: an answer (scored later) only with a scorable Answer: line
        answered = answer_line(text) is not None
        return t.finish(Termination.ANSWER if answered else Termination.NO_ANSWER, text)
    if kind == "invalid" and budgets.invalid_calls == "end":  # a refused call (format penalty)
        return t.finish(Termination.INVALID, text)
    calls = calls[-1:] if len(calls) > budgets.max_calls_per_turn else calls  # the model reads why
    if over_a_tool_budget(t, calls, budgets):
        return t.finish(Termination.SEARCH_BUDGET, text)
    if len(t.turns) >= budgets.max_assistant_turns:
        return t.finish(Termination.TURN_BUDGET, text)
    call_tools_and_stitch(t, turn, text, calls, tokenizer, tools, budgets, closing)


def over_a_tool_budget(t: Trajectory, calls: list[Call], budgets: RolloutBudgets) -> bool:
    """ALGORITHM: whether this turn's calls take a tool past its budget for the trajectory (search:
    ``max_search_calls``; another tool: its declared budget); a refused call counts for none."""
    for name in {name for name, arguments in calls if isinstance(arguments, dict)}:
        made = sum(name == r.tool and not r.refused for turn in t.turns for r in turn.calls)
        budget = budgets.max_search_calls if name == SEARCH else DECLARED[name].budget
        if budget is not None and made + sum(n == name for n, _ in calls) > budget:
            return True
    return False


def call_tools_and_stitch(t: Trajectory, turn: Turn, text: str, calls: list[Call],
                          tokenizer: Tokenizer, tools: Tools, budgets: RolloutBudgets,
                          closing: list[int]) -> None:
    """Run the turn's calls, fit their results into the room left, and stitch the next prompt; or
    end the trajectory where they do not fit."""
    # ALGORITHM: the next prompt is this prompt + the sampled tokens as they are + the part of the
    # template's closing the sampler did not return + the observation (what the template puts
    # between that closing and the next generation prompt: one tool response per call, in call
    # order); one token must stay free to generate.
    completion = turn.completion_tokens
    said = max((k for k in range(1, len(closing) + 1) if completion[-k:] == closing[:k]), default=0)
    stitched = turn.prompt_tokens + completion + closing[said:]
    made = sum(len(earlier.calls) for earlier in t.turns)
    ids = [f"{name if isinstance(arguments, dict) else 'call'}-{t.question_index}-{t.group_index}-"
           f"{made + k}" for k, (name, arguments) in enumerate(calls, 1)]
    conversation = list(t.messages)
    ended = render_text(tokenizer, conversation, budgets, generate=False)

    def tool_message(k: int, content: str) -> Message:  # the k-th call's response
        return {"role": "tool", "tool_call_id": ids[k], "name": calls[k][0], "content": content}

    def observation_tokens(contents: list[str]) -> list[int]:  # PLUMBING: what the template adds
        responses = [tool_message(k, content) for k, content in enumerate(contents)]
        full = render_text(tokenizer, conversation + responses, budgets, generate=True)
        return tokenizer.encode(full[len(ended):], add_special_tokens=False)

    room = budgets.max_trajectory_tokens - 1 - len(stitched)
    if len(observation_tokens(["x"] * len(calls))) > room:  # not even one-letter ones fit: no call
        return t.finish(Termination.TOKEN_BUDGET, text)
    results = [SearchResult(False, error=arguments) if isinstance(arguments, str)
               else tools[name](arguments) for name, arguments in calls]
    # ALGORITHM: the calls share the room in call order, each leaving the least the later ones show
    least = "x" + TRUNCATION_MARKER if budgets.tool_overflow == "truncate" else "x"
    ids_shown = any(DECLARED[name].takes_ids for name in budgets.tools)
    contents: list[str] = []
    cuts: list[bool] = []
    for k, ((name, _), result) in enumerate(zip(calls, results)):
        later = [least] * (len(calls) - k - 1)
        items = observation_items(result, name, ids_shown)
        content, truncated = fit_observation(
            tokenizer, items, lambda c: observation_tokens(contents + [c] + later), room, budgets)
        if content is None:
            return t.finish(Termination.TOOL_OVERFLOW, text)
        contents, cuts = contents + [content], cuts + [truncated]
    for k, ((name, arguments), result) in enumerate(zip(calls, results)):
        t.messages.append(tool_message(k, contents[k]))
        turn.calls.append(CallRecord(call_as_shown(name, arguments), result.ok, contents[k],
                                     len(result.items), result.error, result.cached, cuts[k],
                                     tool=name, refused=isinstance(arguments, str)))
    t.next_prompt_tokens = stitched + observation_tokens(contents)
    t.whole_tokens = len(t.next_prompt_tokens)


# ---------------------------------------------------------------- score and advantage

def reference_rewards_and_advantages(trajectories: list[Trajectory]) -> None:
    """ALGORITHM: reward (exact match of an ``answer`` ending, else -0.1), then advantage = reward
    minus the group mean; a group whose rewards are all equal, or where a tool failed, trains on
    nothing (a refused call is the policy's own mistake)."""
    for t in trajectories:
        answer = answer_line(t.final_text) if t.termination == Termination.ANSWER else None
        answers = {normalise_answer(a) for a in t.example.answers}
        right = answer is not None and normalise_answer(answer) in answers
        t.reward_result = (NOT_ANSWERED if answer is None else
                           RewardResult(1.0 if right else 0.0, True, right, answer))
    groups: dict[int, list[Trajectory]] = {}
    for t in trajectories:
        groups.setdefault(t.question_index, []).append(t)
    for group in groups.values():
        rewards = [t.reward for t in group]
        calls = [c for t in group for turn in t.turns for c in turn.calls]
        failed = any(not c.ok and not c.refused for c in calls)
        excluded = (Exclusion.ENV_FAILURE_GROUP if failed else
                    Exclusion.DEGENERATE_GROUP if len(set(rewards)) == 1 else None)
        for t in group:
            t.excluded = excluded
            t.advantage = 0.0 if excluded else t.reward - math.fsum(rewards) / len(rewards)
            for turn in t.turns:  # ALGORITHM: trajectory-level credit, the same for every turn
                turn.advantage = t.advantage


def reference_turn_credit(trajectories: list[Trajectory], *, weight: float, discount: float,
                          bonus: float | None = None, penalty: float = 0.0) -> None:
    """ALGORITHM (GiGPO, mean-centred): a turn's return is what it earned (``bonus`` for the first
    result showing a reference answer, less ``penalty`` per repeated call) plus ``discount`` times
    the next turn's return, the trajectory's reward on the last. A turn adds ``weight`` times its
    return less the mean return of the turns of its group that saw the same calls and results."""
    steps: dict[tuple, list[tuple[Trajectory, Turn, float]]] = {}
    for t in trajectories:
        answers = [a for a in map(normalise_answer, t.example.answers) if a]
        seen: set[tuple[str, str]] = set()
        found, earned = False, []
        for turn in t.turns:
            own = 0.0
            for c in (c for c in turn.calls if not c.refused):
                key = (c.tool, " ".join(c.query.casefold().split()))
                own -= penalty if key in seen else 0.0
                seen.add(key)
                if bonus is not None and not found and c.ok and any(
                        a in normalise_answer(c.observation) for a in answers):
                    found, own = True, own + bonus
            turn.reward = own if bonus is not None else turn.reward
            earned.append(own)
        future = 0.0
        returns: list[float] = []
        for k in reversed(range(len(t.turns))):
            future = earned[k] + (t.reward if k == len(t.turns) - 1 else 0.0) + discount * future
            returns.insert(0, future)
        shown: tuple = ()  # what the environment showed before a turn: each call and its result
        for turn, value in zip(t.turns, returns):
            if t.excluded is None:
                steps.setdefault((t.question_index, shown), []).append((t, turn, value))
            shown += tuple((c.tool, " ".join(c.query.casefold().split()), c.ok, c.observation)
                           for c in turn.calls)
    for members in steps.values():
        values = [value for _, _, value in members]
        mean = math.fsum(values) / len(values)
        for t, turn, value in members:  # a lone turn, or equal returns, add nothing
            moved = len(members) > 1 and len(set(values)) > 1
            turn.advantage = t.advantage + weight * (value - mean if moved else 0.0)
            turn.step_group = len(members)


# ---------------------------------------------------------------- datums and update

def reference_datums(trajectories: list[Trajectory], vocab_size: int) -> list[Datum]:
    """ALGORITHM: the token sequence of a trajectory, once, shifted by one: a turn whose prompt
    extends the sequence so far continues its datum, any other turn starts a new one. The loss sees
    the policy's own tokens only (each with its turn's advantage and its sampler logprob; prompt and
    observation tokens carry 0); a datum with no advantage is not sent."""
    from pytrio.types import Datum, ModelInput, TensorData
    datums = []
    for t in (t for t in trajectories if not t.excluded):
        # one (tokens, logprobs, advantages) per context
        pieces: list[tuple[list[int], list[float], list[float]]] = []
        for turn in t.turns:
            if not pieces or turn.prompt_tokens[: len(pieces[-1][0])] != pieces[-1][0]:
                pieces.append(([], [], []))
            tokens, logprobs, advantages = pieces[-1]
            delta = turn.prompt_tokens[len(tokens):]
            tokens += delta + turn.completion_tokens
            logprobs += [0.0] * len(delta) + turn.logprobs
            advantages += [0.0] * len(delta) + [turn.advantage] * len(turn.completion_tokens)
        for tokens, logprobs, advantages in pieces:
            # PLUMBING: PyTRIO refuses a token id past the vocabulary
            if not any(advantages) or max(tokens) >= vocab_size:
                continue
            datums.append(Datum(model_input=ModelInput.from_ints(tokens[:-1]), loss_fn_inputs={
                "target_tokens": TensorData.from_numpy(np.asarray(tokens[1:], dtype=np.int64)),
                "logprobs": TensorData.from_numpy(np.asarray(logprobs[1:], dtype=np.float32)),
                "advantages": TensorData.from_numpy(np.asarray(advantages[1:], dtype=np.float32))}))
    return datums


def reference_correction(training_client: TrainingClient, datums: list[Datum], correction: str,
                         cap: float = 2.0, bounds: tuple[float, float] = (0.5, 2.0)) -> list[Datum]:
    """ALGORITHM (off-policy correction): one forward gives the learner's logprob ``p`` before the
    update; per trained token, ``r = exp(p - q)``: tis sends ``A * min(r, cap) / r``, mis ``A`` if
    ``r`` is within ``bounds`` else 0, decoupled ``p`` as the logprob and ``A * min(r, cap)``."""
    from pytrio.types import Datum, TensorData
    if correction == "none" or not datums:
        return datums
    outputs = training_client.forward(datums, "importance_sampling").result().loss_fn_outputs
    corrected = []
    for datum, output in zip(datums, outputs):
        logprobs = [float(v) for v in datum.loss_fn_inputs["logprobs"].data]
        advantages = [float(v) for v in datum.loss_fn_inputs["advantages"].data]
        for i, (a, p) in enumerate(zip(list(advantages), output["logprobs"].data)):
            r = math.exp(p - logprobs[i]) if a else 1.0
            if a and correction == "tis":
                advantages[i] = a * min(r, cap) / r
            elif a and correction == "mis":
                advantages[i] = a if bounds[0] <= r <= bounds[1] else 0.0
            elif a:  # decoupled: the learner's logprob is the proximal policy
                advantages[i], logprobs[i] = a * min(r, cap), float(p)
        inputs = dict(datum.loss_fn_inputs)
        inputs["logprobs"] = TensorData.from_numpy(np.asarray(logprobs, dtype=np.float32))
        inputs["advantages"] = TensorData.from_numpy(np.asarray(advantages, dtype=np.float32))
        corrected.append(Datum(model_input=datum.model_input, loss_fn_inputs=inputs))
    return corrected
