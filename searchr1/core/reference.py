"""One Search-R1 step as plainly as possible: sample, parse, search, stitch, score, advantage,
datum, update. Synchronous, one trajectory after another, no metrics, no retries, the seed's
recipe only (exact match, mean-centred advantages, env-failure groups left out, one
``forward_backward``, no KL). The production engine (:mod:`~searchr1.core.rollout` and
:mod:`~searchr1.core.trainer`) is held to it by a property test: same sampler, search and seeds,
same trajectories and datums. It uses none of the engine's helpers: its prompts, parser, stitching,
observations, truncation, seeds, reward, advantages and datums are its own code, so a bug in one of
the engine's shows as a difference. Shared with the engine: the tokenizer and its chat template,
the data types and the budgets (:mod:`~searchr1.core.types`, its only import from the package),
numpy and pytrio.
(Search results holding special-token strings are outside it: the engine keeps those plain text.)
``# ALGORITHM`` marks a decision of Search-R1; ``# PLUMBING`` what only moves data."""

from __future__ import annotations

import hashlib
import math
import re
import unicodedata
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from searchr1.core.types import (NOT_ANSWERED, AssistantTurn, Exclusion, JsonObject, Message, RewardResult, RolloutBudgets,
                                 SearchExample, SearchItem, SearchRecord, SearchResult, Termination, Tokenizer, Trajectory)

if TYPE_CHECKING:  # pytrio is loaded when first used, as everywhere in the core
    from pytrio import SamplingClient, TrainingClient
    from pytrio.types import Datum

Search = Callable[[str], SearchResult]  # one query in, one result out (synchronous)
SYSTEM = """You answer factual questions. A `search` tool returns short passages from the web.

How to work:
- Search whenever you are not sure of a fact. You may search several times, one short English query per turn.
- Make at most one tool call in a turn, then wait for its result before going on.
- Never make a tool call and give the final answer in the same turn.
- When you know the answer, end your reply with exactly one line `Answer: <short answer>`.{budget}

Example. Question: Which country was the author of The Little Prince from?
- First turn: call search with the query "The Little Prince author".
- The result names Antoine de Saint-Exupery. Second turn: call search with the query "Antoine de Saint-Exupery nationality".
- The result says he was a French writer. Third turn, no tool call:
Answer: France"""


def system_message(budgets: RolloutBudgets) -> Message:
    """The instructions, stating the search budget (unless told not to); ``system_prompt`` replaces them."""
    budget = str(budgets.max_search_calls) if budgets.state_search_budget else ""
    if budgets.system_prompt is not None:
        return {"role": "system", "content": budgets.system_prompt.replace("{max_search_calls}", budget)}
    line = f"\n- You can search at most {budget} times in total; after that, answer with what you have."
    return {"role": "system", "content": SYSTEM.format(budget=line if budget else "")}


def render(tokenizer: Tokenizer, messages: list[Message], budgets: RolloutBudgets, *, generate: bool,
           tokenize: bool = True) -> list[int] | str:
    """PLUMBING: the conversation under the model's chat template, the one search tool declared, thinking off:
    its tokens, or (``tokenize=False``) its text."""
    about = ("Look up evidence on the web. Pass one short English query." if budgets.tool_description is None
             else budgets.tool_description)
    query: JsonObject = {"type": "string", "description": "A short English search query."}
    tool: JsonObject = {"type": "function", "function": {"name": "search", "description": about, "parameters": {
        "type": "object", "properties": {"query": query}, "required": ["query"]}}}
    out = tokenizer.apply_chat_template(messages, tools=[tool], tokenize=tokenize, add_generation_prompt=generate,
                                        enable_thinking=False, return_dict=False)
    return [int(token) for token in out] if tokenize else out


def sample(sampler: SamplingClient, tokenizer: Tokenizer, prompt: list[int], n: int, seed: int,
           budgets: RolloutBudgets) -> list[AssistantTurn] | None:
    """``n`` completions of ``prompt``, or None when the trajectory has no room left to generate."""
    from pytrio import ModelInput, SamplingParams
    max_tokens = min(budgets.max_assistant_tokens, budgets.max_trajectory_tokens - len(prompt))  # ALGORITHM: budgets
    if max_tokens <= 0:
        return None
    stop = [tokenizer.eos_token] if tokenizer.eos_token else None  # the sampler stops at <|im_end|>
    params = SamplingParams(max_tokens=max_tokens, seed=seed, stop=stop, temperature=budgets.temperature,
                            top_p=budgets.top_p)
    response = sampler.sample(prompt=ModelInput.from_ints(prompt), num_samples=n, sampling_params=params,
                              return_text=True).result()
    return [AssistantTurn(list(prompt), [int(x) for x in s.tokens], [float(x) for x in s.logprobs],  # PLUMBING
                          s.text if s.text is not None else tokenizer.decode(list(s.tokens), skip_special_tokens=True),
                          str(getattr(s, "stop_reason", "") or "")) for s in response.sequences]


STOPS = re.compile(r"(<\|im_end\|>|<\|endoftext\|>)(\s*(<\|im_end\|>|<\|endoftext\|>))*\s*\Z")
MARKER = " [... truncated to fit the budget]"
CALL = re.compile(r"\s*<function=search>\s*<parameter=query>\s*(.*?)\s*</parameter>\s*</function>\s*</tool_call>\s*",
                  re.DOTALL)


def parse(text: str) -> tuple[str, str, str | None]:
    """ALGORITHM: ``(text, kind, query)``, the text without its trailing stop strings. ``answer``: no
    ``<tool_call>``; ``tool``: it ends with exactly one well-formed call of ``search`` whose one query is
    not empty and free of ``<``/``>`` (text may come before the call); ``invalid``: anything else."""
    text = STOPS.sub("", text)
    if "<tool_call>" not in text:
        return text, "answer", None
    before, _, call = text.partition("<tool_call>")
    match = CALL.fullmatch(call)
    query = match.group(1).strip() if match and "</tool_call>" not in before else ""
    return (text, "tool", query) if query and "<" not in query and ">" not in query else (text, "invalid", None)


def observation_items(result: SearchResult) -> list[str]:
    """PLUMBING: the result as the model reads it: its items numbered in rank order, or one line
    saying there are none, or the error."""
    def item(i: int, it: SearchItem) -> str:
        if it.source is None and it.url is None:
            return f"[{i}] Source: {it.title}\n    Evidence: {it.content}"
        return "\n".join([f"[{i}] Title: {it.title}", f"    Content: {it.content}"]
                         + [f"    Source: {it.source}"] * bool(it.source) + [f"    URL: {it.url}"] * bool(it.url))
    if not result.ok:
        return [f"Search error: {result.error or 'unknown error'}"]
    return [item(i, it) for i, it in enumerate(result.items, 1)] or ["Search returned no results."]


def fit(tokenizer: Tokenizer, items: list[str], observation: Callable[[str], list[int]], room: int,
        budgets: RolloutBudgets) -> tuple[str | None, bool]:
    """ALGORITHM: ``(content, truncated)``: as many whole items as fit, in rank order; when not even the
    first does, a prefix of it (ending at a token, marked) that fits, stepping down from the cap, or None
    (``tool_overflow="end"``, or no prefix fits)."""
    def fits(content: str) -> bool:
        return (len(tokenizer.encode(content, add_special_tokens=False)) <= budgets.max_tool_response_tokens
                and len(observation(content)) <= room)
    count = 0
    while count < len(items) and fits("\n\n".join(items[: count + 1])):
        count += 1
    if count or budgets.tool_overflow != "truncate":
        return ("\n\n".join(items[:count]) if count else None), False
    ids = tokenizer.encode(items[0], add_special_tokens=False)
    keep = min(len(ids), budgets.max_tool_response_tokens)
    while keep > 0:  # one token at a time, an eighth of what is left while more than 64 are
        head = tokenizer.decode(ids[:keep]).rstrip("\ufffd")  # no half character at its end
        if head.strip() and fits(head.rstrip() + MARKER):
            return head.rstrip() + MARKER, True
        keep -= max(1, keep // 8) if keep > 64 else 1
    return None, False


def step_trajectory(t: Trajectory, turn: AssistantTurn, tokenizer: Tokenizer, search: Search, budgets: RolloutBudgets,
                    closing: list[int]) -> None:
    """Record one assistant turn; end the trajectory or search and stitch its next prompt."""
    t.turns.append(turn)
    text, kind, query = parse(turn.text)
    reply: Message = {"role": "assistant", "content": text}
    before = list(t.messages)
    t.messages.append(reply)
    if kind == "answer":  # ALGORITHM: an answer (scored later) only with a scorable Answer: line
        return t.finish(Termination.ANSWER if answer_of(text) is not None else Termination.NO_ANSWER, text)
    if kind == "invalid":  # a malformed call (format penalty)
        return t.finish(Termination.INVALID, text)
    if len(t.searches) >= budgets.max_search_calls:  # ALGORITHM: a tool call over budget ends the trajectory
        return t.finish(Termination.SEARCH_BUDGET, text)
    if len(t.turns) >= budgets.max_assistant_turns:
        return t.finish(Termination.TURN_BUDGET, text)
    # ALGORITHM: the next prompt is this prompt + the sampled tokens as they are + the part of the
    # template's closing the sampler did not return + the observation (what the template puts
    # between that closing and the next generation prompt); one token must stay free to generate.
    said = max((k for k in range(1, len(closing) + 1) if turn.completion_tokens[-k:] == closing[:k]), default=0)
    stitched = turn.prompt_tokens + turn.completion_tokens + closing[said:]
    call_id = f"search-{t.question_index}-{t.group_index}-{len(t.searches) + 1}"
    def tool(content: str) -> Message:
        return {"role": "tool", "tool_call_id": call_id, "name": "search", "content": content}
    ended = str(render(tokenizer, before + [reply], budgets, generate=False, tokenize=False))

    def observation(content: str) -> list[int]:
        full = str(render(tokenizer, before + [reply, tool(content)], budgets, generate=True, tokenize=False))
        return tokenizer.encode(full[len(ended):], add_special_tokens=False)
    room = budgets.max_trajectory_tokens - 1 - len(stitched)
    if len(observation("x")) > room:  # not even a one-letter observation fits: no search
        return t.finish(Termination.TOKEN_BUDGET, text)
    assert query is not None  # a tool turn always carries its query
    result = search(query)
    content, truncated = fit(tokenizer, observation_items(result), observation, room, budgets)
    if content is None:
        return t.finish(Termination.TOOL_OVERFLOW, text)
    t.messages.append(tool(content))
    t.next_prompt_tokens = stitched + observation(content)
    t.searches.append(SearchRecord(query, result.ok, content, len(result.items), result.error, result.cached,
                                   truncated))


def seed_of(budgets: RolloutBudgets, step: int, question: int, sample: int, turn: int) -> int:
    """ALGORITHM: every sampling seed is a hash of (seed, step, question, sample, turn), never a
    counter: the first 4 bytes of its BLAKE2b digest, big-endian, below 2**31."""
    digest = hashlib.blake2b(f"{budgets.seed}/{step}/{question}/{sample}/{turn}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") % 2**31


def reference_rollout(sampler: SamplingClient, tokenizer: Tokenizer, search: Search, examples: Sequence[SearchExample],
                      budgets: RolloutBudgets, *, step: int = 0) -> list[Trajectory]:
    """``group_size`` trajectories per question, in question then sample order."""
    trajectories = []
    for q, example in enumerate(examples):
        messages: list[Message] = [system_message(budgets), {"role": "user", "content": example.question}]
        group = [Trajectory(example, q, g, [m.copy() for m in messages]) for g in range(budgets.group_size)]
        trajectories += group
        prompt = render(tokenizer, messages, budgets, generate=True)
        # PLUMBING: the template's closing of an assistant turn, what an empty reply adds to the prompt
        empty_reply = render(tokenizer, messages + [{"role": "assistant", "content": ""}], budgets, generate=False)
        assert isinstance(prompt, list) and isinstance(empty_reply, list)  # tokens, as asked
        closing = empty_reply[len(prompt):]
        # ALGORITHM: the first turn is ONE request with num_samples = group_size on the shared prompt
        first = sample(sampler, tokenizer, prompt, budgets.group_size, seed_of(budgets, step, q, 0, 0), budgets)
        firsts: list[AssistantTurn | None] = list(first) if first else [None] * len(group)
        for t, turn in zip(group, firsts):
            while turn is not None:  # one turn, then the next on the stitched prompt
                step_trajectory(t, turn, tokenizer, search, budgets, closing)
                if t.done:
                    break
                assert t.next_prompt_tokens is not None  # a search stitched the next prompt
                seed = seed_of(budgets, step, q, t.group_index, len(t.turns))
                following = sample(sampler, tokenizer, t.next_prompt_tokens, 1, seed, budgets)
                turn = following[0] if following else None
            if not t.done:  # no room left to generate
                t.finish(Termination.TOKEN_BUDGET if t.turns else Termination.PROMPT_TOO_LONG)
    return trajectories


def answer_of(text: str) -> str | None:
    """ALGORITHM: the answer is the rest of the one line that starts with ``Answer:`` (any case; it may
    go on on the next line); None when no line or several do, or it is empty."""
    found = re.findall(r"^\s*answer:\s*(.*?)\s*$", text, re.IGNORECASE | re.MULTILINE)
    return (found[0].strip() or None) if len(found) == 1 else None


def normalise(text: str) -> str:
    """SQuAD's rule: lowercase, drop punctuation (Unicode category P*), then the articles, one space."""
    text = "".join(c for c in text.lower() if not unicodedata.category(c).startswith("P"))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def reference_rewards_and_advantages(trajectories: list[Trajectory]) -> None:
    """ALGORITHM: reward (exact match of an ``answer`` ending, else -0.1), then advantage = reward minus
    the group mean; a group whose rewards are all equal, or with a failed search, trains on nothing."""
    for t in trajectories:
        answer = answer_of(t.final_text) if t.termination == Termination.ANSWER else None
        right = answer is not None and normalise(answer) in {normalise(a) for a in t.example.answers}
        t.reward_result = NOT_ANSWERED if answer is None else RewardResult(1.0 if right else 0.0, True, right, answer)
    groups: dict[int, list[Trajectory]] = {}
    for t in trajectories:
        groups.setdefault(t.question_index, []).append(t)
    for group in groups.values():
        rewards = [t.reward for t in group]
        excluded = (Exclusion.ENV_FAILURE_GROUP if any(not s.ok for t in group for s in t.searches) else
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
        tokens: list[int] = []
        logprobs: list[float] = []
        advantages: list[float] = []
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
                   examples: Sequence[SearchExample], budgets: RolloutBudgets, *, step: int, learning_rate: float,
                   betas: tuple[float, float] = (0.9, 0.95)) -> tuple[list[Trajectory], list[Datum], dict[str, float] | None]:
    """One whole step: its trajectories, datums and loss metrics (None when nothing was sent)."""
    from pytrio import AdamParams
    trajectories = reference_rollout(sampler, tokenizer, search, examples, budgets, step=step)
    reference_rewards_and_advantages(trajectories)
    datums = reference_datums(trajectories, len(tokenizer))
    if not datums:
        return trajectories, datums, None
    output = training_client.forward_backward(datums, loss_fn="importance_sampling").result()  # ALGORITHM
    training_client.optim_step(AdamParams(learning_rate=learning_rate, beta1=betas[0], beta2=betas[1])).result()
    return trajectories, datums, dict(output.metrics)
