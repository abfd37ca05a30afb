"""One Search-R1 step as plainly as possible: sample, parse, call the tools, stitch, score, advantage,
datum, update. Synchronous, one trajectory after another, no metrics, no retries, the seed's recipe only
(exact match, mean-centred advantages, env-failure groups left out, one ``forward_backward``, no KL),
with the tools, calls a turn and refused-call policy the budgets declare. The production engine
(:mod:`~searchr1.core.rollout` and :mod:`~searchr1.core.trainer`) is held to it by a property test: same
sampler, search and seeds, same trajectories and datums. It uses none of the engine's helpers: its
prompts, parser, stitching, observations, truncation, seeds, reward, advantages and datums are its own
code, so a bug in one of the engine's shows as a difference. Shared with the engine: the tokenizer and
its chat template, the data types and the budgets (:mod:`~searchr1.core.types`), the declared tools as
data (``DECLARED``: schemas and budgets, nothing else from :mod:`~searchr1.core.tools`), numpy and
pytrio.
(Search results holding special-token strings are outside it: the engine keeps those plain text.)
``# ALGORITHM`` marks a decision of Search-R1; ``# PLUMBING`` what only moves data."""

from __future__ import annotations

import hashlib
import json
import math
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from searchr1.core.budgets import RolloutBudgets
from searchr1.core.tools import DECLARED
from searchr1.core.types import (NOT_ANSWERED, CallRecord, Exclusion, JsonObject, JsonValue, Message, RewardResult,
                                 SearchExample, SearchItem, SearchResult, Termination, Tokenizer, Turn, Trajectory)

if TYPE_CHECKING:  # pytrio is loaded when first used, as everywhere in the core
    from pytrio import SamplingClient, TrainingClient
    from pytrio.types import Datum

Search = Callable[[str], SearchResult]  # one query in, one result out (synchronous)
Tool = Callable[[dict[str, JsonValue]], SearchResult]  # another tool: its arguments in, its result out
SYSTEM = """You answer factual questions. A `search` tool returns short passages from the web.

How to work:
- Search whenever you are not sure of a fact. You may search several times, one short English query per turn.
- {calls}
- Never make a tool call and give the final answer in the same turn.
- When you know the answer, end your reply with exactly one line `Answer: <short answer>`.{pages}{budget}

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
    pages = ("\n- Each search result names its page. `open_page` reads that page passage by passage: pass its "
             "title or id, and an offset to read on.") if "open_page" in names(budgets) else ""
    n = budgets.max_calls_per_turn
    calls = (f"Make at most {n} tool calls in a turn (they run together), then wait for their results before going on."
             if n > 1 else "Make at most one tool call in a turn, then wait for its result before going on.")
    return {"role": "system", "content": SYSTEM.format(budget=line if budget else "", pages=pages, calls=calls)}


def names(budgets: RolloutBudgets) -> list[str]:
    return list(budgets.tools)


def render(tokenizer: Tokenizer, messages: list[Message], budgets: RolloutBudgets, *, generate: bool,
           tokenize: bool = True) -> list[int] | str:
    """PLUMBING: the conversation under the model's chat template, the tools declared, thinking off:
    its tokens, or (``tokenize=False``) its text."""
    about = ("Look up evidence on the web. Pass one short English query." if budgets.tool_description is None
             else budgets.tool_description)
    query: JsonObject = {"type": "string", "description": "A short English search query."}
    tool: JsonObject = {"type": "function", "function": {"name": "search", "description": about, "parameters": {
        "type": "object", "properties": {"query": query}, "required": ["query"]}}}
    tools = [tool if name == "search" else DECLARED[name].schema() for name in names(budgets)]
    out = tokenizer.apply_chat_template(messages, tools=tools, tokenize=tokenize, add_generation_prompt=generate,
                                        enable_thinking=False, return_dict=False)
    return [int(token) for token in out] if tokenize else out


def sample(sampler: SamplingClient, tokenizer: Tokenizer, prompt: list[int], n: int, seed: int,
           budgets: RolloutBudgets) -> list[Turn] | None:
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
    return [Turn(list(prompt), [int(x) for x in s.tokens], [float(x) for x in s.logprobs],  # PLUMBING
                          s.text if s.text is not None else tokenizer.decode(list(s.tokens), skip_special_tokens=True),
                          str(getattr(s, "stop_reason", "") or "")) for s in response.sequences]


STOPS = re.compile(r"(<\|im_end\|>|<\|endoftext\|>)(\s*(<\|im_end\|>|<\|endoftext\|>))*\s*\Z")
MARKER = " [... truncated to fit the budget]"
FUNCTION = re.compile(r"\s*<function=([^<>\n]+)>(.*)</function>\s*", re.DOTALL)
PARAMETER = re.compile(r"\s*<parameter=([^<>\n]+)>(.*?)</parameter>", re.DOTALL)
MARKUP = ("<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>")
Call = tuple[str, dict[str, JsonValue] | str]  # (function, its typed arguments) or (function, why it is refused)


def typed(text: str, schema: JsonObject) -> tuple[bool, JsonValue]:
    """ALGORITHM: a parameter's text as its schema's type (a list of types: null first, then in order)."""
    declared = schema.get("type", "string")
    kinds = sorted(map(str, declared), key=lambda k: k != "null") if isinstance(declared, list) else [str(declared)]
    for kind in (k.strip().lower() for k in kinds):
        word, ok = text.strip(), False
        value: JsonValue = None
        if kind == "string" or kind not in ("null", "boolean", "integer", "number", "array", "object"):
            value, ok = text, True
        elif kind == "null":
            ok = word.lower() in ("null", "none")
        elif kind == "boolean":
            ok, value = word.lower() in ("true", "false"), word.lower() == "true"
        elif re.fullmatch(r"\s*[-+]?\d+\s*", text) and kind in ("integer", "number"):
            ok, value = True, int(word)
        elif kind == "number":
            try:
                number = float(word)
            except ValueError:
                number = math.inf
            ok, value = math.isfinite(number), number
        elif kind in ("array", "object"):
            try:
                value = json.loads(text)
            except ValueError:
                pass
            ok = isinstance(value, list if kind == "array" else dict)
        enum = schema.get("enum")
        if ok:  # the first type that reads the text decides, the enum included
            return (False, None) if isinstance(enum, list) and value not in enum else (True, value)
    return False, None


def shown(text: str) -> str:
    """PLUMBING: a name or value in a refusal: on one line, cut to 40 characters."""
    line = " ".join(text.split())
    return repr(line if len(line) <= 40 else line[:39] + "…")


def read(inside: str, budgets: RolloutBudgets) -> Call:
    """ALGORITHM: one call, checked against the declared tools: the function, then each parameter in order
    (markup, given twice, undeclared, type), then what is left over, the required ones, the search query."""
    function = FUNCTION.fullmatch(inside)
    if function is None:
        return "", "the tool call is not one <function=…> block"
    name, body = function.groups()
    if name not in names(budgets):
        return name, f"unknown tool {shown(name)} (declared: {', '.join(sorted(names(budgets)))})"
    schema = DECLARED[name].parameters
    properties, arguments, at = schema.get("properties", {}), {}, 0
    assert isinstance(properties, dict)
    while (parameter := PARAMETER.match(body, at)) is not None:
        key, value, at = parameter.group(1), parameter.group(2), parameter.end()
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        if any(tag in value for tag in MARKUP):
            return name, f"parameter {shown(key)} of {name} holds tool-call markup"
        if key in arguments:
            return name, f"parameter {shown(key)} of {name} is given twice"
        if key not in properties and schema.get("additionalProperties") is not True:
            return name, f"{name} has no parameter {shown(key)}"
        kind = properties.get(key, {})
        assert isinstance(kind, dict)
        ok, arguments[key] = typed(value, kind) if key in properties else (True, value)
        if not ok:
            wanted = kind.get("type", "string")
            wanted = " or ".join(map(str, wanted)) if isinstance(wanted, list) else str(wanted)
            return name, f"parameter {key} of {name} must be {wanted}, got {shown(value)}"
    if body[at:].strip():
        return name, f"the call of {name} holds text that is not a <parameter=…> block"
    required = schema.get("required", [])
    missing = [str(key) for key in (required if isinstance(required, list) else []) if key not in arguments]
    if missing:
        return name, f"{name} needs the parameter {', '.join(missing)}"
    query = str(arguments.get("query", "x"))
    if name == "search" and not query.strip():
        return name, "the search query is blank"
    if name == "search" and ("<" in query or ">" in query):
        return name, "the search query holds < or >"
    if name == "open_page" and not str(arguments["page"]).strip():
        return name, "the page name is blank"
    if name == "open_page" and int(str(arguments.get("offset", 0))) < 0:
        return name, "the offset is negative"
    return name, arguments


def parse(text: str, budgets: RolloutBudgets) -> tuple[str, str, list[Call]]:
    """ALGORITHM: ``(text, kind, calls)``, the text without its trailing stop strings. ``answer``: no
    ``<tool_call>``; ``tool``: it ends with a run of well-formed calls (text may come before them), at most
    ``max_calls_per_turn``, none refused; ``invalid``: anything else."""
    text = STOPS.sub("", text)
    if "<tool_call>" not in text:
        return text, "answer", []
    before, _, rest = text.partition("<tool_call>")
    *blocks, after = ("<tool_call>" + rest).split("</tool_call>")
    insides = [block.lstrip()[len("<tool_call>"):] for block in blocks]
    if "</tool_call>" in before or after.strip() or any(
            not block.lstrip().startswith("<tool_call>") or "<tool_call>" in inside
            for block, inside in zip(blocks, insides)):
        return text, "invalid", [("", "the tool calls are not closed <tool_call> blocks ending the turn")]
    calls = [read(inside, budgets) for inside in insides]
    if len(calls) > budgets.max_calls_per_turn:
        calls.append(("", f"{len(calls)} tool calls in one turn (at most {budgets.max_calls_per_turn})"))
    return text, "tool" if all(isinstance(arguments, dict) for _, arguments in calls) else "invalid", calls


def observation_items(result: SearchResult, tool: str = "search", ids: bool = False) -> list[str]:
    """PLUMBING: the result as the model reads it: its items numbered in rank order (with each
    passage's id when ``ids``: open_page is offered), or one line saying there are none, or the error."""
    def item(i: int, it: SearchItem) -> str:
        if it.source is None and it.url is None:
            return f"[{i}] Source: {it.title}\n    Evidence: {it.content}"
        return "\n".join([f"[{i}] Title: {it.title}"] + [f"    Id: {it.ident}"] * bool(it.ident and ids)
                         + [f"    Content: {it.content}"]
                         + [f"    Source: {it.source}"] * bool(it.source) + [f"    URL: {it.url}"] * bool(it.url))
    error = result.error or "unknown error"
    if not result.ok:
        return [f"Search error: {error}" if tool == "search" else f"Tool error ({tool}): {error}" if tool
                else f"Tool error: {error}"]
    nothing = "Search returned no results." if tool == "search" else f"{tool} returned nothing."
    return [item(i, it) for i, it in enumerate(result.items, 1)] or [nothing]


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


def step_trajectory(t: Trajectory, turn: Turn, tokenizer: Tokenizer, search: Search, budgets: RolloutBudgets,
                    closing: list[int], tools: Mapping[str, Tool]) -> None:
    """Record one assistant turn; end the trajectory or run its calls and stitch its next prompt."""
    t.turns.append(turn)
    text, kind, calls = parse(turn.text, budgets)
    reply: Message = {"role": "assistant", "content": text}
    before = list(t.messages)
    t.messages.append(reply)
    if kind == "answer":  # ALGORITHM: an answer (scored later) only with a scorable Answer: line
        return t.finish(Termination.ANSWER if answer_of(text) is not None else Termination.NO_ANSWER, text)
    if kind == "invalid" and budgets.invalid_calls == "end":  # a refused call (format penalty)
        return t.finish(Termination.INVALID, text)
    calls = calls[-1:] if len(calls) > budgets.max_calls_per_turn else calls  # too many: the model reads why
    for name in {name for name, arguments in calls if isinstance(arguments, dict)}:
        made = sum(name == r.tool and not r.refused for turn in t.turns for r in turn.calls)
        budget = budgets.max_search_calls if name == "search" else DECLARED[name].budget
        if budget is not None and made + sum(n == name for n, _ in calls) > budget:  # ALGORITHM: each tool's budget
            return t.finish(Termination.SEARCH_BUDGET, text)
    if len(t.turns) >= budgets.max_assistant_turns:
        return t.finish(Termination.TURN_BUDGET, text)
    # ALGORITHM: the next prompt is this prompt + the sampled tokens as they are + the part of the
    # template's closing the sampler did not return + the observation (what the template puts
    # between that closing and the next generation prompt: one tool response per call, in call
    # order); one token must stay free to generate.
    said = max((k for k in range(1, len(closing) + 1) if turn.completion_tokens[-k:] == closing[:k]), default=0)
    stitched = turn.prompt_tokens + turn.completion_tokens + closing[said:]
    made = sum(len(earlier.calls) for earlier in t.turns)
    ids = [f"{name if isinstance(arguments, dict) else 'call'}-{t.question_index}-{t.group_index}-{made + k}"
           for k, (name, arguments) in enumerate(calls, 1)]

    def message(k: int, content: str) -> Message:
        return {"role": "tool", "tool_call_id": ids[k], "name": calls[k][0], "content": content}
    ended = str(render(tokenizer, before + [reply], budgets, generate=False, tokenize=False))

    def observation(contents: list[str]) -> list[int]:
        responses = [message(k, content) for k, content in enumerate(contents)]
        full = str(render(tokenizer, before + [reply] + responses, budgets, generate=True, tokenize=False))
        return tokenizer.encode(full[len(ended):], add_special_tokens=False)
    room = budgets.max_trajectory_tokens - 1 - len(stitched)
    if len(observation(["x"] * len(calls))) > room:  # not even one-letter observations fit: no call
        return t.finish(Termination.TOKEN_BUDGET, text)
    results = [SearchResult(False, error=arguments) if isinstance(arguments, str) else
               search(str(arguments["query"]).strip()) if name == "search" else tools[name](arguments)
               for name, arguments in calls]
    # ALGORITHM: the calls share the room in call order, each keeping the least the later ones could show
    least = "x" + MARKER if budgets.tool_overflow == "truncate" else "x"
    contents: list[str] = []
    cuts: list[bool] = []
    for k, ((name, _), result) in enumerate(zip(calls, results)):
        later = [least] * (len(calls) - k - 1)
        content, truncated = fit(tokenizer, observation_items(result, name, "open_page" in names(budgets)),
                                 lambda c: observation(contents + [c] + later), room, budgets)
        if content is None:
            return t.finish(Termination.TOOL_OVERFLOW, text)
        contents, cuts = contents + [content], cuts + [truncated]
    for k, ((name, arguments), result) in enumerate(zip(calls, results)):
        t.messages.append(message(k, contents[k]))
        shown_call = name if isinstance(arguments, str) else str(arguments["query"]).strip() if name == "search" else (
            ", ".join(f"{key}={value}" for key, value in arguments.items()))
        turn.calls.append(CallRecord(shown_call, result.ok, contents[k], len(result.items), result.error, result.cached,
                                     cuts[k], tool=name, refused=isinstance(arguments, str)))
    t.next_prompt_tokens = stitched + observation(contents)


def seed_of(budgets: RolloutBudgets, step: int, question: int, sample: int, turn: int) -> int:
    """ALGORITHM: every sampling seed is a hash of (seed, step, question, sample, turn), never a
    counter: the first 4 bytes of its BLAKE2b digest, big-endian, below 2**31."""
    digest = hashlib.blake2b(f"{budgets.seed}/{step}/{question}/{sample}/{turn}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") % 2**31


def reference_rollout(sampler: SamplingClient, tokenizer: Tokenizer, search: Search, examples: Sequence[SearchExample],
                      budgets: RolloutBudgets, *, step: int = 0, tools: Mapping[str, Tool] | None = None) -> list[Trajectory]:
    """``group_size`` trajectories per question, in question then sample order (``tools``: the declared
    tools other than search, by name)."""
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
        firsts: list[Turn | None] = list(first) if first else [None] * len(group)
        for t, turn in zip(group, firsts):
            while turn is not None:  # one turn, then the next on the stitched prompt
                step_trajectory(t, turn, tokenizer, search, budgets, closing, tools or {})
                if t.done:
                    break
                assert t.next_prompt_tokens is not None  # the calls stitched the next prompt
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
    the group mean; a group whose rewards are all equal, or where a tool failed, trains on nothing (a refused
    call is the policy's own mistake)."""
    for t in trajectories:
        answer = answer_of(t.final_text) if t.termination == Termination.ANSWER else None
        right = answer is not None and normalise(answer) in {normalise(a) for a in t.example.answers}
        t.reward_result = NOT_ANSWERED if answer is None else RewardResult(1.0 if right else 0.0, True, right, answer)
    groups: dict[int, list[Trajectory]] = {}
    for t in trajectories:
        groups.setdefault(t.question_index, []).append(t)
    for group in groups.values():
        rewards = [t.reward for t in group]
        failed = any(not c.ok and not c.refused for t in group for turn in t.turns for c in turn.calls)
        excluded = (Exclusion.ENV_FAILURE_GROUP if failed else
                    Exclusion.DEGENERATE_GROUP if len(set(rewards)) == 1 else None)
        for t in group:
            t.excluded = excluded
            t.advantage = 0.0 if excluded else t.reward - math.fsum(rewards) / len(rewards)
            for turn in t.turns:  # ALGORITHM: trajectory-level credit, every turn carries the same advantage
                turn.advantage = t.advantage


def reference_datums(trajectories: list[Trajectory], vocab_size: int) -> list[Datum]:
    """ALGORITHM: the token sequence of a trajectory, once, shifted by one: a turn whose prompt extends
    the sequence so far continues its datum, any other turn starts a new one. The loss sees the policy's
    own tokens only (each with its turn's advantage and its sampler logprob; prompt and observation
    tokens carry 0); a datum with no advantage is not sent."""
    from pytrio.types import Datum, ModelInput, TensorData
    datums = []
    for t in (t for t in trajectories if not t.excluded):
        pieces: list[tuple[list[int], list[float], list[float]]] = []  # tokens, logprobs, advantages
        for turn in t.turns:
            if not pieces or turn.prompt_tokens[: len(pieces[-1][0])] != pieces[-1][0]:
                pieces.append(([], [], []))
            tokens, logprobs, advantages = pieces[-1]
            delta = turn.prompt_tokens[len(tokens):]
            tokens += delta + turn.completion_tokens
            logprobs += [0.0] * len(delta) + turn.logprobs
            advantages += [0.0] * len(delta) + [turn.advantage] * len(turn.completion_tokens)
        for tokens, logprobs, advantages in pieces:
            if not any(advantages) or max(tokens) >= vocab_size:  # PLUMBING: PyTRIO refuses ids outside it
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
