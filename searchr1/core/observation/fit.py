"""How much of a search result fits the trajectory: whole items in rank order while the content
and the next prompt stay within their budgets, or the first item truncated (and marked) when not even
it fits."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from searchr1.core.observation.piecewise import SEPARATOR, JoinedObservation
from searchr1.core.observation.text import observation_candidates
from searchr1.core.observation.tokens import plain_tokens
from searchr1.core.protocol import build_next_prompt, missing_closing, observation_tokens, tool_message
from searchr1.core.budgets import RolloutBudgets, tool_schemas
from searchr1.core.tools import SEARCH
from searchr1.core.types import Message, SearchResult, Tokenizer

TRUNCATION_MARKER = " [... truncated to fit the budget]"


@dataclass(frozen=True)
class FittedObservation:
    content: str
    next_prompt: list[int]
    truncated: bool


@dataclass(frozen=True)
class FittedCalls:
    """The tool message content of each call of a turn, in call order, and the next prompt."""

    contents: tuple[str, ...]
    truncated: tuple[bool, ...]
    next_prompt: list[int]


def observation_room(tokenizer: Tokenizer, prompt_tokens: Sequence[int], completion_tokens: Sequence[int],
                     budgets: RolloutBudgets, *, whole: int | None = None, foldable: bool = False) -> int:
    """How many observation tokens the next prompt can take after this turn: the context's window
    less the sequence so far (prompt, completion, the part of the closing the sampler did not
    return), and the whole trajectory's budget less its length so far (``whole``: before this
    turn, when its context may have folded; else the context is all of it), less one token kept
    for the next turn to generate. ``foldable``: the window does not bind (a fold can make room)."""
    closing = len(missing_closing(tokenizer, completion_tokens))
    in_context = len(prompt_tokens) + len(completion_tokens) + closing
    in_whole = in_context if whole is None else whole + len(completion_tokens) + closing
    left = budgets.max_trajectory_tokens - in_whole
    return (left if foldable else min(budgets.window - in_context, left)) - 1


def truncate_to_fit(tokenizer: Tokenizer, text: str, budget: Callable[[str], bool], limit: int) -> str | None:
    """A prefix of ``text`` ending at a token boundary, plus the marker, that ``budget`` accepts;
    ``None`` when no prefix with text in it does. Tries the first ``limit`` tokens, then fewer: an
    eighth fewer at a time while more than 64 are left, one fewer at a time from there, so a prefix
    of more than 64 tokens may fall short of the longest that fits by up to an eighth. Tokens are
    counted with :func:`plain_tokens`, as the observation will be tokenised."""
    ids = plain_tokens(tokenizer, text)
    keep = min(len(ids), limit)
    while keep > 0:
        head = tokenizer.decode(ids[:keep], skip_special_tokens=False).rstrip("\ufffd")
        candidate = head.rstrip() + TRUNCATION_MARKER
        if head.strip() and budget(candidate):
            return candidate
        keep = keep - max(1, keep // 8) if keep > 64 else keep - 1
    return None


def fit_tool_content(
    tokenizer: Tokenizer,
    messages_before_assistant: list[Message],
    assistant_text: str | Message,
    previous_prompt_tokens: Sequence[int],
    completion_tokens: Sequence[int],
    call_id: str,
    result: SearchResult,
    budgets: RolloutBudgets,
    tool: str = SEARCH.name,
    *,
    whole: int | None = None,
) -> FittedObservation | None:
    """The tool message content and the next prompt, or ``None`` when nothing fits (``tool``: the
    tool that answered, ``""`` for a call that named none).

    Whole items are added greedily in rank order while the joined content stays within
    ``max_tool_response_tokens`` and the next prompt leaves room for at least one generated
    token; the first item that does not fit stops the loop (as the lab port). Sizes come from the
    tokenizer directly; the template is rendered twice, and only for the chosen content. If not
    even the first item fits, ``tool_overflow="truncate"`` truncates it at a token boundary with a
    visible marker; ``"end"`` returns ``None`` (the lab port). ``whole``: see :func:`observation_room`.
    """
    room = observation_room(tokenizer, previous_prompt_tokens, completion_tokens, budgets, whole=whole)

    def fits(content: str) -> bool:
        if len(plain_tokens(tokenizer, content)) > budgets.max_tool_response_tokens:
            return False
        return len(observation_tokens(tokenizer, content, thinking=budgets.thinking)) <= room

    candidates = observation_candidates(result, tool)
    # each item tokenised once, not once per try
    sizes = JoinedObservation(tokenizer, candidates, thinking=budgets.thinking)
    accepted = 0
    observation: list[int] | None = None  # the accepted content's observation tokens
    for count in range(1, len(candidates) + 1):
        if len(sizes.content_tokens(count)) > budgets.max_tool_response_tokens:
            break
        tokens = sizes.observation_tokens(count)
        if len(tokens) > room:
            break
        accepted, observation = count, tokens
    truncated = False
    if accepted:
        content = sizes.joined(accepted)
    elif budgets.tool_overflow == "truncate":
        shortened = truncate_to_fit(tokenizer, candidates[0], fits, budgets.max_tool_response_tokens)
        if shortened is None:
            return None
        content, truncated = shortened, True
    else:
        return None
    next_prompt = build_next_prompt(
        tokenizer,
        messages_before_assistant,
        assistant_text,
        previous_prompt_tokens,
        completion_tokens,
        tool_message(call_id, content, tool),
        tools=tool_schemas(budgets),
        observation=observation,
        thinking=budgets.thinking,
    )
    return FittedObservation(content, next_prompt, truncated)


def fit_calls(
    tokenizer: Tokenizer,
    messages_before_assistant: list[Message],
    assistant_text: str | Message,
    previous_prompt_tokens: Sequence[int],
    completion_tokens: Sequence[int],
    answered: Sequence[tuple[str, str, SearchResult]],
    budgets: RolloutBudgets,
    *,
    whole: int | None = None,
) -> FittedCalls | None:
    """Every call's content and the next prompt, or ``None`` when one of them does not fit.

    ``answered``: ``(call id, tool, result)`` per call of the turn, in call order. One call is
    :func:`fit_tool_content`. Several are fitted in order, each by the same rule (whole items,
    then the first item truncated) against ``max_tool_response_tokens`` on its own and the room
    left by the ones before it, keeping for each one after it the room of the least it could
    show (one letter, marked as truncated under ``tool_overflow="truncate"``); each try is sized
    by tokenising the whole observation (several calls in a turn are rare).
    """
    if len(answered) == 1:
        call_id, tool, result = answered[0]
        one = fit_tool_content(tokenizer, messages_before_assistant, assistant_text, previous_prompt_tokens,
                               completion_tokens, call_id, result, budgets, tool, whole=whole)
        return None if one is None else FittedCalls((one.content,), (one.truncated,), one.next_prompt)
    room = observation_room(tokenizer, previous_prompt_tokens, completion_tokens, budgets, whole=whole)
    contents: list[str] = []
    truncated: list[bool] = []
    for index, (_, tool, result) in enumerate(answered):
        least = "x" + TRUNCATION_MARKER if budgets.tool_overflow == "truncate" else "x"
        later = [least] * (len(answered) - index - 1)

        def fits(content: str) -> bool:
            if len(plain_tokens(tokenizer, content)) > budgets.max_tool_response_tokens:
                return False
            return len(observation_tokens(tokenizer, contents + [content] + later, thinking=budgets.thinking)) <= room

        candidates = observation_candidates(result, tool)
        count = 0
        while count < len(candidates) and fits(SEPARATOR.join(candidates[: count + 1])):
            count += 1
        shortened = None
        if not count and budgets.tool_overflow == "truncate":
            shortened = truncate_to_fit(tokenizer, candidates[0], fits, budgets.max_tool_response_tokens)
        if not count and shortened is None:
            return None
        contents.append(SEPARATOR.join(candidates[:count]) if count else str(shortened))
        truncated.append(not count)
    messages = [tool_message(call_id, content, tool) for (call_id, tool, _), content in zip(answered, contents)]
    next_prompt = build_next_prompt(tokenizer, messages_before_assistant, assistant_text, previous_prompt_tokens,
                                    completion_tokens, messages, tools=tool_schemas(budgets), thinking=budgets.thinking)
    return FittedCalls(tuple(contents), tuple(truncated), next_prompt)
