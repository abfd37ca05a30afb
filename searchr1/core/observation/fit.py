"""How much of a search result fits the trajectory: whole items in rank order while the content
and the next prompt stay within their budgets, or the first item truncated (and marked) when not even
it fits."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from searchr1.core.observation.piecewise import JoinedObservation
from searchr1.core.observation.text import observation_candidates
from searchr1.core.observation.tokens import plain_tokens
from searchr1.core.protocol import build_next_prompt, missing_closing, observation_tokens, tool_message
from searchr1.core.tools import tool_schemas
from searchr1.core.types import Message, RolloutBudgets, SearchResult, Tokenizer

TRUNCATION_MARKER = " [... truncated to fit the budget]"


@dataclass(frozen=True)
class FittedObservation:
    content: str
    next_prompt: list[int]
    truncated: bool


def observation_room(tokenizer: Tokenizer, prompt_tokens: Sequence[int], completion_tokens: Sequence[int],
                     budgets: RolloutBudgets) -> int:
    """How many observation tokens the next prompt can take after this turn: the trajectory budget
    less the sequence so far (prompt, completion, the part of the closing the sampler did not
    return) and less one token, kept for the next turn to generate."""
    so_far = len(prompt_tokens) + len(completion_tokens) + len(missing_closing(tokenizer, completion_tokens))
    return budgets.max_trajectory_tokens - so_far - 1


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
    assistant_text: str,
    previous_prompt_tokens: Sequence[int],
    completion_tokens: Sequence[int],
    call_id: str,
    result: SearchResult,
    budgets: RolloutBudgets,
    tool: str = "search",
) -> FittedObservation | None:
    """The tool message content and the next prompt, or ``None`` when nothing fits (``tool``: the
    tool that answered, ``""`` for a call that named none).

    Whole items are added greedily in rank order while the joined content stays within
    ``max_tool_response_tokens`` and the next prompt leaves room for at least one generated
    token; the first item that does not fit stops the loop (as the seed). Sizes come from the
    tokenizer directly; the template is rendered twice, and only for the chosen content. If not
    even the first item fits, ``tool_overflow="truncate"`` truncates it at a token boundary with a
    visible marker; ``"end"`` returns ``None`` (the seed).
    """
    room = observation_room(tokenizer, previous_prompt_tokens, completion_tokens, budgets)

    def fits(content: str) -> bool:
        if len(plain_tokens(tokenizer, content)) > budgets.max_tool_response_tokens:
            return False
        return len(observation_tokens(tokenizer, content)) <= room

    candidates = observation_candidates(result, tool)
    sizes = JoinedObservation(tokenizer, candidates)  # each item tokenised once, not once per try
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
    )
    return FittedObservation(content, next_prompt, truncated)
