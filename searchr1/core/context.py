"""Context management: what one context holds when a trajectory outgrows its window.

With ``--context full`` (the default, Search-R1's and the lab port's) a trajectory is one context
that only grows. With ``--context fold`` a context holds at most ``--context-window`` tokens: when
a turn's observation would leave the next turn less than its generation cap
(``--max-assistant-tokens``) inside the window, the conversation folds. Every earlier tool
result is replaced by a one-line stub (the call as shown and what it returned: the titles it
listed, or its first line), the model's own turns stay as they were, and the next context starts
from the folded conversation rendered afresh. A turn whose prompt does not extend the sequence
before it starts a new datum of the same trajectory (:mod:`searchr1.core.datum`), so every turn is
trained in the context it was sampled in.

The trajectory's whole length (``--max-trajectory-tokens``) counts its first prompt and every
turn's new tokens (completion, closing, observation), folded or not; under ``full`` it is the
length of the one context. Sources: context folding (arXiv 2510.11967), MEM1 (arXiv 2506.15841)
and tinker-cookbook's new datum when an observation is not a prefix extension (docs/algorithms.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from enum import StrEnum

from searchr1.core.types import CallRecord, Message

STUB_PREFIX = "[folded]"
STUB_CHARS = 200  # a stub's listing, at most
_TITLE = re.compile(r"^\s*\[\d+\] Title: (.*)$", re.MULTILINE)  # an item as core.observation.text shows it


class ContextPolicy(StrEnum):
    """How a trajectory's context grows (``--context``)."""

    FULL = "full"  # one context, only growing (Search-R1, the lab port)
    FOLD = "fold"  # earlier tool results folded to stubs when the next turn would not fit the window


def stub(call: CallRecord) -> str:
    """One line for a folded tool result: the call as shown and what it returned (the titles it
    listed, else its first line), without ``<`` or ``>`` (no special-token string can come back)."""
    titles = _TITLE.findall(call.observation)
    lines = call.observation.strip().splitlines()
    returned = "; ".join(titles) if titles else (lines[0] if lines else "nothing")
    text = f"{STUB_PREFIX} {call.tool} {call.query[:80]!r} returned: {returned}"[:len(STUB_PREFIX) + STUB_CHARS]
    return text.replace("<", "").replace(">", "")


def fold_messages(messages: Sequence[Message], calls: Sequence[CallRecord]) -> list[Message]:
    """``messages`` with each tool message's content replaced by the stub of its call (the n-th
    tool message answers the n-th call); every other message as it was."""
    folded: list[Message] = []
    answered = iter(calls)
    for message in messages:
        if message["role"] == "tool":
            call = next(answered, None)
            message = {**message, "content": stub(call) if call is not None else STUB_PREFIX}
        folded.append(message)
    return folded


def leaves_room(next_prompt_tokens: int, window: int, max_assistant_tokens: int) -> bool:
    """Whether a context of ``next_prompt_tokens`` leaves the next turn its whole generation cap
    inside ``window`` (``--context fold`` folds when it does not)."""
    return window - next_prompt_tokens >= max_assistant_tokens
