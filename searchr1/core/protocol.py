"""The search-tool protocol: what the model is told, how its turns are parsed, and how the
token sequence grows from one turn to the next.

The model input is never re-tokenised from text. Each new prompt is the previous prompt, the
completion tokens exactly as the sampler returned them, the part of the assistant closing the
sampler did not return, and the observation tokens that the chat template puts between the
end of the assistant turn and the start of the next one. The template is consulted only for
those environment tokens, and checked for not rewriting history while doing so.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from searchr1.core.observation.tokens import (TemplateBoundaries, observation_wrapper, plain_tokens,
                                              split_at_control_tokens)
from searchr1.core.tools import (DECLARED, SEARCH, CallError, ParsedCall, ToolCall, ToolSpec, parse_tool_calls,
                                 shown_call)
from searchr1.core.types import JsonObject, Message, Tokenizer

BUDGET_PLACEHOLDER = "{max_search_calls}"
THINK_CLOSE = "</think>"  # with thinking on, ends the reasoning the generation prompt opened


SEARCH_TOOL: JsonObject = SEARCH.schema()  # the search function schema shown to the model

# The system prompt's wording (the reference step composes it in its own code)

PROMPT_HEAD = """\
You answer factual questions. A `search` tool returns short passages from the web.

How to work:
- Search whenever you are not sure of a fact. You may search several times, one short English query per turn.
- {calls}
- Never make a tool call and give the final answer in the same turn.
- When you know the answer, end your reply with exactly one line `Answer: <short answer>`."""

PROMPT_ONE_CALL = "Make at most one tool call in a turn, then wait for its result before going on."
PROMPT_CALLS = "Make at most {n} tool calls in a turn (they run together), then wait for their results before going on."
PROMPT_BUDGET = "- You can search at most {n} times in total; after that, answer with what you have."

PROMPT_EXAMPLE = """\

Example. Question: Which country was the author of The Little Prince from?
- First turn: call search with the query "The Little Prince author".
- The result names Antoine de Saint-Exupery. Second turn: call search with the query "Antoine de Saint-Exupery nationality".
- The result says he was a French writer. Third turn, no tool call:
Answer: France"""

SYSTEM_PROMPT = PROMPT_HEAD.format(calls=PROMPT_ONE_CALL) + "\n" + PROMPT_EXAMPLE
# With no tool offered (a closed-book attempt: ``probe-data``), the model answers from what it knows.
CLOSED_BOOK_PROMPT = """\
You answer factual questions from what you know; no tool is available.
End your reply with exactly one line `Answer: <short answer>`."""


def system_prompt(max_search_calls: int | None = None, template: str | None = None,
                  tools: Sequence[str] = ("search",), max_calls: int = 1) -> str:
    """The system prompt; with a budget it also tells the model how many searches it has, the
    guidance each of the ``tools`` declares (``open_page``: how to read on from a search result),
    and how many calls a turn may make. With no tool, the closed-book wording.

    ``template`` (``--system-prompt-file``) replaces the default wording; the text
    ``{max_search_calls}`` in it, if present, becomes the budget (nothing else is substituted,
    so other braces stay as written).
    """
    if template is not None:
        return template.replace(BUDGET_PLACEHOLDER, "" if max_search_calls is None else str(max_search_calls))
    if not tools:
        return CLOSED_BOOK_PROMPT
    calls = PROMPT_ONE_CALL if max_calls == 1 else PROMPT_CALLS.format(n=max_calls)
    lines = [PROMPT_HEAD.format(calls=calls)] + [line for name in tools if (line := DECLARED[name].guidance)]
    if max_search_calls is not None:
        lines.append(PROMPT_BUDGET.format(n=max_search_calls))
    return "\n".join(lines) + "\n" + PROMPT_EXAMPLE


def initial_messages(question: str, *, max_search_calls: int | None = None, system_template: str | None = None,
                     tools: Sequence[str] = ("search",), max_calls: int = 1) -> list[Message]:
    """System prompt plus the question, passed as it is."""
    return [
        {"role": "system", "content": system_prompt(max_search_calls, system_template, tools, max_calls)},
        {"role": "user", "content": question},
    ]


def assistant_message(text: str, reasoning: str | None = None) -> Message:
    """The raw generated text, tool-call XML included (structured ``tool_calls`` are never used),
    and with thinking on the turn's reasoning, which the template shows inside ``<think>``."""
    if reasoning is None:
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": text, "reasoning_content": reasoning}


def tool_message(call_id: str, content: str, tool: str = "search") -> Message:
    return {"role": "tool", "tool_call_id": call_id, "name": tool, "content": content}


def stop_sequences(tokenizer: Tokenizer) -> list[str]:
    """Stop strings for sampling: the tokenizer's eos (``<|im_end|>`` for Qwen3.5)."""
    eos = getattr(tokenizer, "eos_token", None)
    return [eos] if eos else []


# --------------------------------------------------------------------------- rendering


def render_text(tokenizer: Tokenizer, messages: list[Message], add_generation_prompt: bool,
                tools: list[JsonObject] | None = None, *, thinking: bool = False) -> str:
    """``messages`` under the model's chat template, as text, with the search tool (or ``tools``).
    Thinking off (the default), the generation prompt ends with an empty think block; on, with an
    open ``<think>`` the model goes on from. Either way every assistant turn after the question is
    shown with its reasoning (empty when it had none)."""
    return str(tokenizer.apply_chat_template(messages, tools=tools or [SEARCH_TOOL], tokenize=False,
                                             add_generation_prompt=add_generation_prompt, enable_thinking=thinking))


def render(tokenizer: Tokenizer, messages: list[Message], add_generation_prompt: bool,
           tools: list[JsonObject] | None = None, *, thinking: bool = False) -> list[int]:
    """The same render as token ids: its text encoded without added special tokens, as
    ``apply_chat_template(tokenize=True)`` does."""
    text = render_text(tokenizer, messages, add_generation_prompt, tools, thinking=thinking)
    return [int(token) for token in tokenizer.encode(text, add_special_tokens=False)]


def build_prompt(tokenizer: Tokenizer, messages: list[Message],
                 tools: list[JsonObject] | None = None, *, thinking: bool = False) -> list[int]:
    return render(tokenizer, messages, add_generation_prompt=True, tools=tools, thinking=thinking)


# --------------------------------------------------------------------------- parsing

_STOP = r"(?:<\|im_end\|>|<\|endoftext\|>)"
_TRAILING_STOP = re.compile(_STOP + r"(?:\s*" + _STOP + r")*\s*\Z")


class TurnKind(StrEnum):
    """What an assistant turn is (see :func:`parse_assistant`)."""

    TOOL = "tool"
    ANSWER = "answer"
    INVALID = "invalid"


@dataclass(frozen=True)
class ParsedAssistant:
    kind: TurnKind
    # The turn's text as classified: the sampled text without a trailing stop string (with
    # thinking on, what follows the reasoning). Whether the sampler returns ``<|im_end|>`` in
    # ``text`` is the service's convention; everything downstream (messages, transcripts, the
    # reward) uses this text, so it does not matter.
    text: str
    # Every call the turn makes, in order, each accepted or refused (empty for an answer).
    calls: tuple[ParsedCall, ...] = ()
    # With thinking on: the reasoning before ``</think>`` (all of the turn when it never closed).
    reasoning: str | None = None

    @property
    def query(self) -> str | None:
        """The first call of a ``tool`` turn as shown (a search's query, trimmed), else ``None``."""
        return shown_call(self.calls[0]) if self.kind == TurnKind.TOOL else None


def without_stop_strings(text: str) -> str:
    """``text`` without trailing ``<|im_end|>`` / ``<|endoftext|>`` strings (and the
    whitespace around them)."""
    match = _TRAILING_STOP.search(text)
    return text[: match.start()] if match else text


def split_reasoning(text: str) -> tuple[str, str]:
    """With thinking on, a turn goes on from the prompt's open ``<think>``: its reasoning, then
    ``</think>``, then what it says. ``(reasoning, the rest)`` split at the first ``</think>``; a
    turn that never closed its reasoning says nothing (``(text, "")``)."""
    reasoning, closed, rest = text.partition(THINK_CLOSE)
    return (reasoning, rest) if closed else (text, "")


def parse_assistant(text: str, tools: Sequence[ToolSpec] = (SEARCH,), max_calls: int = 1, *,
                    thinking: bool = False) -> ParsedAssistant:
    """Classify one assistant turn (never raises). With ``thinking``, only what follows the
    reasoning (:func:`split_reasoning`) is classified: a call or an ``Answer:`` line written
    while reasoning neither runs nor scores.

    * ``tool``: one to ``max_calls`` well-formed Qwen3.5 XML calls, each of a declared tool with
      arguments its schema accepts (for ``search``: one query that is not blank and has no
      ``<``/``>``), and nothing but whitespace (or a trailing ``<|im_end|>``) after them
      (planning text may come before the first call).
    * ``invalid``: any other use of ``<tool_call>`` (JSON bodies, undeclared functions, missing,
      extra or mistyped parameters, too many calls, text after a call, an unclosed call).
    * ``answer``: no ``<tool_call>`` at all (whether it holds an ``Answer:`` line is the
      reward's business).
    """
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    body, reasoning = without_stop_strings(text), None
    if thinking:  # what the turn says starts after the newlines the template puts after </think>
        reasoning, body = split_reasoning(body)
        body = body.lstrip("\n")
    parsed = parse_tool_calls(body, tools)
    if parsed is None:
        return ParsedAssistant(TurnKind.ANSWER, body, reasoning=reasoning)
    calls = tuple(parsed[1])
    if len(calls) > max_calls:
        calls = calls + (CallError("", f"{len(calls)} tool calls in one turn (at most {max_calls})"),)
    valid = all(isinstance(call, ToolCall) for call in calls)
    return ParsedAssistant(TurnKind.TOOL if valid else TurnKind.INVALID, body, calls, reasoning)


# --------------------------------------------------------------------------- stitching


class TemplateDriftError(ValueError):
    """The chat template does not behave as token stitching requires (it rewrote earlier
    history, or its assistant/tool boundaries are not where they should be)."""


_BOUNDARIES: "weakref.WeakKeyDictionary[Tokenizer, dict[tuple[str, bool], TemplateBoundaries]]" = (
    weakref.WeakKeyDictionary())
_SENTINEL = "SEARCHR1-OBSERVATION-SENTINEL"
_PROBE_MESSAGES: list[Message] = [
    {"role": "system", "content": "probe"},
    {"role": "user", "content": "Which river flows through Paris?"},
]


def template_boundaries(tokenizer: Tokenizer, *, thinking: bool = False) -> TemplateBoundaries:
    """Closing tokens and observation wrapper of this tokenizer's template (cached). The closing is
    learnt with thinking off (an empty turn would otherwise close its empty think block too); the
    observation ends with the next generation prompt, so it is learnt as ``thinking`` renders it."""
    template = str(getattr(tokenizer, "chat_template", ""))
    known = _BOUNDARIES.setdefault(tokenizer, {})
    if (template, thinking) in known:
        return known[template, thinking]
    prompt = build_prompt(tokenizer, _PROBE_MESSAGES)
    empty_turn = render(tokenizer, _PROBE_MESSAGES + [assistant_message("")], add_generation_prompt=False)
    if empty_turn[: len(prompt)] != prompt:
        raise TemplateDriftError(
            "cannot find the assistant closing: rendering an empty assistant turn does not "
            "extend the generation prompt"
        )
    closing = tuple(empty_turn[len(prompt):])
    if not closing:
        raise TemplateDriftError("the template closes an assistant turn with no tokens")
    call = "<tool_call>\n<function=search>\n<parameter=query>\nSeine\n</parameter>\n</function>\n</tool_call>"
    before = _PROBE_MESSAGES + [assistant_message(call)]
    end_text = render_text(tokenizer, before, add_generation_prompt=False)
    next_text = render_text(
        tokenizer, before + [tool_message("probe-1", _SENTINEL)], add_generation_prompt=True, thinking=thinking
    )
    closing_text = tokenizer.decode(list(closing), skip_special_tokens=False)
    if not next_text.startswith(end_text) or not end_text.endswith(closing_text):
        raise TemplateDriftError(
            "adding a tool observation rewrote the rendered conversation before it"
        )
    delta = next_text[len(end_text):]
    if delta.count(_SENTINEL) != 1:
        raise TemplateDriftError("the tool observation text does not appear exactly once")
    prefix, suffix = delta.split(_SENTINEL)
    boundaries = TemplateBoundaries(closing, prefix, suffix)
    known[template, thinking] = boundaries
    return boundaries


_JOINTS: "weakref.WeakKeyDictionary[Tokenizer, tuple[str, str]]" = weakref.WeakKeyDictionary()


def observation_joint(tokenizer: Tokenizer) -> str:
    """What the template puts between two tool responses of one observation (Qwen3.5:
    ``\\n</tool_response>\\n<tool_response>\\n``), learnt once per template, when a turn first
    makes several calls."""
    template = str(getattr(tokenizer, "chat_template", ""))
    cached = _JOINTS.get(tokenizer)
    if cached is not None and cached[0] == template:
        return cached[1]
    boundaries = template_boundaries(tokenizer)
    before = _PROBE_MESSAGES + [assistant_message("probe")]
    end_text = render_text(tokenizer, before, add_generation_prompt=False)
    pair = render_text(tokenizer, before + [tool_message("probe-1", _SENTINEL), tool_message("probe-2", _SENTINEL)],
                       add_generation_prompt=True)
    head, tail = boundaries.observation_prefix + _SENTINEL, _SENTINEL + boundaries.observation_suffix
    delta = pair[len(end_text):]
    if not pair.startswith(end_text) or not delta.startswith(head) or not delta.endswith(tail):
        raise TemplateDriftError("two tool observations are not rendered as one observation with a joint")
    joint = delta[len(head): len(delta) - len(tail)]
    _JOINTS[tokenizer] = (template, joint)
    return joint


def _contents(content: str | Sequence[str]) -> list[str]:
    return [content] if isinstance(content, str) else list(content)


def observation_text(tokenizer: Tokenizer, content: str | Sequence[str], *, thinking: bool = False) -> str:
    """The observation as text: wrapper plus the content (or each of several contents, joined as
    the template joins tool responses) trimmed as the template trims it."""
    boundaries, contents = template_boundaries(tokenizer, thinking=thinking), _contents(content)
    joint = observation_joint(tokenizer) if len(contents) > 1 else ""
    return boundaries.observation_prefix + joint.join(c.strip() for c in contents) + boundaries.observation_suffix


def observation_tokens(tokenizer: Tokenizer, content: str | Sequence[str], *, thinking: bool = False) -> list[int]:
    """Observation tokens for ``content`` (or several contents, one per call of the turn) without
    rendering the conversation.

    The wrapper (and the joint between contents) keeps the template's real control tokens; the
    content (with the plain text next to it) is tokenised by :func:`plain_tokens`, so a search
    result that contains ``<|im_end|>``, ``<|im_start|>``, ``</tool_response>`` or any other
    special-token string stays text the policy reads and can never end the tool turn or forge a
    new one. For content without such strings the tokens equal those of a full render (the
    observation starts right after ``<|im_end|>``, so nothing merges across the boundary), which
    ``build_next_prompt`` checks against the template on every turn. ``thinking``: the next
    generation prompt opens the model's reasoning (:func:`render_text`).
    """
    boundaries = template_boundaries(tokenizer, thinking=thinking)
    wrapper, contents = observation_wrapper(tokenizer, boundaries), _contents(content)
    tokens, text = list(wrapper.head), wrapper.head_text
    if len(contents) > 1:
        before, joint, after = split_at_control_tokens(tokenizer, observation_joint(tokenizer))
        for item in contents[:-1]:
            tokens += plain_tokens(tokenizer, text + item.strip() + before) + list(joint)
            text = after
    return tokens + plain_tokens(tokenizer, text + contents[-1].strip() + wrapper.tail_text) + list(wrapper.tail)


def suffix_prefix_overlap(tokens: Sequence[int], suffix: Sequence[int]) -> int:
    """Largest ``L`` with ``tokens[-L:] == suffix[:L]`` (0 when none)."""
    for length in range(min(len(tokens), len(suffix)), 0, -1):
        if list(tokens[-length:]) == list(suffix[:length]):
            return length
    return 0


def missing_closing(tokenizer: Tokenizer, completion_tokens: Sequence[int]) -> list[int]:
    """The part of the assistant closing the sampler did not already return."""
    closing = template_boundaries(tokenizer).closing
    return list(closing[suffix_prefix_overlap(completion_tokens, closing):])


def build_next_prompt(
    tokenizer: Tokenizer,
    messages_before_assistant: list[Message],
    assistant_text: str | Message,
    previous_prompt_tokens: Sequence[int],
    completion_tokens: Sequence[int],
    next_tool_message: Message | Sequence[Message],
    tools: list[JsonObject] | None = None,
    *,
    observation: Sequence[int] | None = None,
    thinking: bool = False,
) -> list[int]:
    """``previous prompt + completion (as sampled) + missing closing + observation``.

    Two template renders per call, as text: the conversation ending with the assistant turn,
    and the same conversation with the tool message (or one per call of the turn, in call order)
    and the next generation prompt. The second must extend the first (else
    ``TemplateDriftError``: the template rewrote history), the first must end with the assistant
    closing, and the difference must be exactly the observation the start-up wrapper predicts.
    Only that difference is tokenised: it starts right after a special token, so its tokens are
    the ones a full render would produce, except that special-token strings inside the tool
    content stay plain text (a full render would turn them into control tokens; see
    :func:`observation_tokens`). ``observation``: those tokens when the caller already has them
    (the rollout sizes them while fitting). ``assistant_text``: the turn's text, or its message
    with its reasoning (thinking on); ``thinking``: how the next generation prompt is rendered.
    With thinking on the template shows every turn after the question with its reasoning, so
    adding an observation rewrites none of them either.
    """
    tool_messages = [next_tool_message] if isinstance(next_tool_message, dict) else list(next_tool_message)
    assistant = assistant_message(assistant_text) if isinstance(assistant_text, str) else assistant_text
    with_assistant = list(messages_before_assistant) + [assistant]
    assistant_end = render_text(tokenizer, with_assistant, add_generation_prompt=False, tools=tools)
    next_prompt = render_text(tokenizer, with_assistant + tool_messages, add_generation_prompt=True, tools=tools,
                              thinking=thinking)
    if not next_prompt.startswith(assistant_end):
        raise TemplateDriftError(
            "the chat template rewrote earlier history after the tool observation was added "
            "(the render with the tool message does not extend the render without it)"
        )
    boundaries = template_boundaries(tokenizer, thinking=thinking)
    if not assistant_end.endswith(tokenizer.decode(list(boundaries.closing), skip_special_tokens=False)):
        raise TemplateDriftError(
            "the rendered assistant turn does not end with the closing tokens learnt from the template"
        )
    contents = [str(message.get("content", "")) for message in tool_messages]
    if next_prompt[len(assistant_end):] != observation_text(tokenizer, contents, thinking=thinking):
        raise TemplateDriftError(
            "the template's observation differs from the wrapper learnt at start-up "
            "(the tool turn is rendered differently for this conversation)"
        )
    return (
        list(previous_prompt_tokens)
        + list(completion_tokens)
        + missing_closing(tokenizer, completion_tokens)
        + (list(observation) if observation is not None else observation_tokens(tokenizer, contents, thinking=thinking))
    )
