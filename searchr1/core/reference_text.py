"""The text of the reference step (:mod:`searchr1.core.reference`), in its own code: what the model
reads (the system prompt, the conversation under the chat template with the tools declared, a
tool's result as an observation, cut to the room left) and what it writes (the sampled turns; their
tool calls, read against the declared schemas with each value converted to its declared type; its
``Answer:`` line, normalised as SQuAD normalises it). Like the reference it uses none of the
engine's helpers: only the data types, the budgets, the declared tools as data (``DECLARED``:
schemas, wording, rules), the system prompt's wording (:mod:`~searchr1.core.protocol`'s
``PROMPT_*``) and the tokenizer.
``# ALGORITHM`` marks a decision of Search-R1; ``# PLUMBING`` what only moves data."""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Callable
from typing import TYPE_CHECKING

from searchr1.core.budgets import RolloutBudgets
from searchr1.core.protocol import (PROMPT_BUDGET, PROMPT_CALLS, PROMPT_EXAMPLE, PROMPT_HEAD,
                                    PROMPT_ONE_CALL)
from searchr1.core.tools import DECLARED
from searchr1.core.types import (JsonObject, JsonValue, Message, SearchItem, SearchResult,
                                 Tokenizer, Turn)

if TYPE_CHECKING:  # pytrio is loaded when first used, as everywhere in the core
    from pytrio import SamplingClient

SEARCH = "search"  # the tool that --tool-description describes and --max-search-calls budgets

# ---------------------------------------------------------------- what the model reads

def system_message(budgets: RolloutBudgets) -> Message:
    """The instructions: how many calls a turn may make, each offered tool's guidance line, and
    the search budget (unless told not to); ``system_prompt`` replaces them."""
    budget = str(budgets.max_search_calls) if budgets.state_search_budget else ""
    if budgets.system_prompt is not None:
        content = budgets.system_prompt.replace("{max_search_calls}", budget)
        return {"role": "system", "content": content}
    n = budgets.max_calls_per_turn
    calls = PROMPT_CALLS.format(n=n) if n > 1 else PROMPT_ONE_CALL
    guidance = [line for name in budgets.tools if (line := DECLARED[name].guidance)]
    stated = [PROMPT_BUDGET.format(n=budget)] if budget else []
    content = "\n".join([PROMPT_HEAD.format(calls=calls), *guidance, *stated, PROMPT_EXAMPLE])
    return {"role": "system", "content": content}


def tool_schemas(budgets: RolloutBudgets) -> list[JsonObject]:
    """The function schema of each offered tool, in the order given: its declared name and
    parameters, and its description (search's from ``tool_description`` when one is given)."""
    schemas: list[JsonObject] = []
    for name in budgets.tools:
        declared = DECLARED[name]
        description = declared.description
        if name == SEARCH and budgets.tool_description is not None:
            description = budgets.tool_description
        schemas.append({"type": "function", "function": {
            "name": name, "description": description, "parameters": declared.parameters}})
    return schemas


def render_text(tokenizer: Tokenizer, messages: list[Message], budgets: RolloutBudgets, *,
                generate: bool) -> str:
    """PLUMBING: the conversation under the model's chat template, the tools declared, thinking
    off, as text (``generate``: with the prompt of the next assistant turn)."""
    return str(tokenizer.apply_chat_template(messages, tools=tool_schemas(budgets), tokenize=False,
                                             add_generation_prompt=generate, enable_thinking=False,
                                             return_dict=False))


def render_tokens(tokenizer: Tokenizer, messages: list[Message], budgets: RolloutBudgets, *,
                  generate: bool) -> list[int]:
    """PLUMBING: the same render as tokens."""
    out = tokenizer.apply_chat_template(messages, tools=tool_schemas(budgets), tokenize=True,
                                        add_generation_prompt=generate, enable_thinking=False,
                                        return_dict=False)
    return [int(token) for token in out]


def item_text(index: int, item: SearchItem, ids: bool) -> str:
    """PLUMBING: one result item, numbered: an evidence item (no source, no url) as source and
    evidence; any other as title, its id (when ``ids``), content, source and url when known."""
    if item.source is None and item.url is None:
        return f"[{index}] Source: {item.title}\n    Evidence: {item.content}"
    lines = [f"[{index}] Title: {item.title}"]
    lines += [f"    Id: {item.ident}"] * bool(item.ident and ids)
    lines += [f"    Content: {item.content}"]
    lines += [f"    Source: {item.source}"] * bool(item.source)
    lines += [f"    URL: {item.url}"] * bool(item.url)
    return "\n".join(lines)


def observation_items(result: SearchResult, tool: str = SEARCH, ids: bool = False) -> list[str]:
    """PLUMBING: the result of a call of ``tool`` as the model reads it: its items numbered in rank
    order (each passage's id shown when ``ids``: a tool that takes ids is offered), or the line the
    tool declares for no items, or its error under the head the tool declares."""
    declared = DECLARED.get(tool)
    if not result.ok:
        head = (declared.error_head if declared and declared.error_head else
                f"Tool error ({tool})" if tool else "Tool error")
        return [f"{head}: {result.error or 'unknown error'}"]
    nothing = declared.nothing if declared and declared.nothing else f"{tool} returned nothing."
    return [item_text(i, item, ids) for i, item in enumerate(result.items, 1)] or [nothing]


TRUNCATION_MARKER = " [... truncated to fit the budget]"


def fit_observation(tokenizer: Tokenizer, items: list[str], observation: Callable[[str], list[int]],
                    room: int, budgets: RolloutBudgets) -> tuple[str | None, bool]:
    """ALGORITHM: ``(content, truncated)``: as many whole items as fit (the content under
    ``max_tool_response_tokens``, its ``observation`` tokens within ``room``), in rank order; when
    not even the first does, a prefix of it (ending at a token, marked) that fits, stepping down
    from the cap, or None (``tool_overflow="end"``, or no prefix fits)."""
    def fits_budgets(content: str) -> bool:
        cap = budgets.max_tool_response_tokens
        return (len(tokenizer.encode(content, add_special_tokens=False)) <= cap
                and len(observation(content)) <= room)
    count = 0
    while count < len(items) and fits_budgets("\n\n".join(items[: count + 1])):
        count += 1
    if count or budgets.tool_overflow != "truncate":
        return ("\n\n".join(items[:count]) if count else None), False
    ids = tokenizer.encode(items[0], add_special_tokens=False)
    keep = min(len(ids), budgets.max_tool_response_tokens)
    while keep > 0:  # one token at a time, an eighth of what is left while more than 64 are
        head = tokenizer.decode(ids[:keep]).rstrip("\ufffd")  # no half character at its end
        if head.strip() and fits_budgets(head.rstrip() + TRUNCATION_MARKER):
            return head.rstrip() + TRUNCATION_MARKER, True
        keep -= max(1, keep // 8) if keep > 64 else 1
    return None, False


# ---------------------------------------------------------------- what the model writes

def sample_turns(sampler: SamplingClient, tokenizer: Tokenizer, prompt: list[int], n: int,
                 seed: int, budgets: RolloutBudgets) -> list[Turn] | None:
    """``n`` completions of ``prompt``, or None when the trajectory has no room left to generate."""
    from pytrio import ModelInput, SamplingParams
    room = budgets.max_trajectory_tokens - len(prompt)
    max_tokens = min(budgets.max_assistant_tokens, room)  # ALGORITHM: the budgets
    if max_tokens <= 0:
        return None
    stop = [tokenizer.eos_token] if tokenizer.eos_token else None  # the sampler stops at <|im_end|>
    params = SamplingParams(max_tokens=max_tokens, seed=seed, stop=stop,
                            temperature=budgets.temperature, top_p=budgets.top_p)
    response = sampler.sample(prompt=ModelInput.from_ints(prompt), num_samples=n,
                              sampling_params=params, return_text=True).result()
    turns = []
    for s in response.sequences:  # PLUMBING
        tokens, logprobs = [int(x) for x in s.tokens], [float(x) for x in s.logprobs]
        text = s.text if s.text is not None else tokenizer.decode(tokens, skip_special_tokens=True)
        stop_reason = str(getattr(s, "stop_reason", "") or "")
        turns.append(Turn(list(prompt), tokens, logprobs, text, stop_reason))
    return turns


STOPS = re.compile(r"(<\|im_end\|>|<\|endoftext\|>)(\s*(<\|im_end\|>|<\|endoftext\|>))*\s*\Z")
FUNCTION = re.compile(r"\s*<function=([^<>\n]+)>(.*)</function>\s*", re.DOTALL)
PARAMETER = re.compile(r"\s*<parameter=([^<>\n]+)>(.*?)</parameter>", re.DOTALL)
MARKUP = ("<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>")
# a call: (function, its typed arguments), or (function, why it is refused)
Call = tuple[str, dict[str, JsonValue] | str]


def parse_turn(text: str, budgets: RolloutBudgets) -> tuple[str, str, list[Call]]:
    """ALGORITHM: ``(text, kind, calls)``, the text without its trailing stop strings. ``answer``:
    no ``<tool_call>``; ``tool``: it ends with a run of well-formed calls (text may come before
    them), at most ``max_calls_per_turn``, none refused; ``invalid``: anything else."""
    text = STOPS.sub("", text)
    if "<tool_call>" not in text:
        return text, "answer", []
    before, _, rest = text.partition("<tool_call>")
    *blocks, after = ("<tool_call>" + rest).split("</tool_call>")
    insides = [block.lstrip()[len("<tool_call>"):] for block in blocks]
    if "</tool_call>" in before or after.strip() or any(
            not block.lstrip().startswith("<tool_call>") or "<tool_call>" in inside
            for block, inside in zip(blocks, insides)):
        reason = "the tool calls are not closed <tool_call> blocks ending the turn"
        return text, "invalid", [("", reason)]
    calls = [parse_call(inside, budgets) for inside in insides]
    if len(calls) > budgets.max_calls_per_turn:
        most = budgets.max_calls_per_turn
        calls.append(("", f"{len(calls)} tool calls in one turn (at most {most})"))
    refused = any(isinstance(arguments, str) for _, arguments in calls)
    return text, "invalid" if refused else "tool", calls


def parse_call(inside: str, budgets: RolloutBudgets) -> Call:
    """ALGORITHM: one call, checked against the offered tools: the function, then each parameter
    in order (markup, given twice, undeclared, type), then what is left over, the required ones,
    and the rule the tool declares beside its schema (a search query is not blank, has no ``<``)."""
    function = FUNCTION.fullmatch(inside)
    if function is None:
        return "", "the tool call is not one <function=…> block"
    name, body = function.groups()
    if name not in budgets.tools:
        offered = ", ".join(sorted(budgets.tools))
        return name, f"unknown tool {quoted_in_refusal(name)} (declared: {offered})"
    schema = DECLARED[name].parameters
    properties, arguments, at = schema.get("properties", {}), {}, 0
    assert isinstance(properties, dict)
    while (parameter := PARAMETER.match(body, at)) is not None:
        key, value, at = parameter.group(1), parameter.group(2), parameter.end()
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        if any(tag in value for tag in MARKUP):
            return name, f"parameter {quoted_in_refusal(key)} of {name} holds tool-call markup"
        if key in arguments:
            return name, f"parameter {quoted_in_refusal(key)} of {name} is given twice"
        if key not in properties and schema.get("additionalProperties") is not True:
            return name, f"{name} has no parameter {quoted_in_refusal(key)}"
        declared = properties.get(key, {})
        assert isinstance(declared, dict)
        ok, arguments[key] = (value_as_declared(value, declared) if key in properties
                              else (True, value))
        if not ok:
            wanted = declared.get("type", "string")
            wanted = " or ".join(map(str, wanted)) if isinstance(wanted, list) else str(wanted)
            got = quoted_in_refusal(value)
            return name, f"parameter {key} of {name} must be {wanted}, got {got}"
    if body[at:].strip():
        return name, f"the call of {name} holds text that is not a <parameter=…> block"
    required = schema.get("required", [])
    missing = [str(key) for key in (required if isinstance(required, list) else [])
               if key not in arguments]
    if missing:
        return name, f"{name} needs the parameter {', '.join(missing)}"
    rule = DECLARED[name].check  # what the schema cannot say
    broken = rule(arguments) if rule else None
    return (name, broken) if broken else (name, arguments)


# the types a value is converted to; any other type reads the text as a string
NOT_STRING_TYPES = ("null", "boolean", "integer", "number", "array", "object")


def value_as_declared(text: str, schema: JsonObject) -> tuple[bool, JsonValue]:
    """ALGORITHM: ``(read, value)``: a parameter's text as its schema's type (a list of types: null
    first, then in order); the first type that reads the text decides, its enum included."""
    declared = schema.get("type", "string")
    kinds = (sorted(map(str, declared), key=lambda k: k != "null") if isinstance(declared, list)
             else [str(declared)])
    for kind in (k.strip().lower() for k in kinds):
        word, ok = text.strip(), False
        value: JsonValue = None
        if kind == "string" or kind not in NOT_STRING_TYPES:
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
        if ok:
            return (False, None) if isinstance(enum, list) and value not in enum else (True, value)
    return False, None


def quoted_in_refusal(text: str) -> str:
    """PLUMBING: a name or value as a refusal quotes it: on one line, cut to 40 characters."""
    line = " ".join(text.split())
    return repr(line if len(line) <= 40 else line[:39] + "…")


def answer_line(text: str) -> str | None:
    """ALGORITHM: the answer is the rest of the one line that starts with ``Answer:`` (any case; it
    may go on on the next line); None when no line or several do, or it is empty."""
    found = re.findall(r"^\s*answer:\s*(.*?)\s*$", text, re.IGNORECASE | re.MULTILINE)
    return (found[0].strip() or None) if len(found) == 1 else None


def normalise_answer(text: str) -> str:
    """SQuAD's rule: lowercase, drop punctuation (Unicode category P*), then the articles, one
    space between words."""
    text = "".join(c for c in text.lower() if not unicodedata.category(c).startswith("P"))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def call_as_shown(name: str, arguments: dict[str, JsonValue] | str) -> str:
    """PLUMBING: a call in one line: a refused call's function; the value of a tool's only
    parameter (a search's query), stripped; another tool's arguments as ``key=value``."""
    if isinstance(arguments, str):
        return name
    if len(DECLARED[name].properties) == 1:
        return str(next(iter(arguments.values()))).strip()
    return ", ".join(f"{key}={value}" for key, value in arguments.items())
