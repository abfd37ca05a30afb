"""Token ids of a joined observation, computed piece by piece, each piece tokenised once.

Fitting a search result (:func:`searchr1.core.observation.fit.fit_tool_content`) tries the items joined one, two, three
at a time, and sizes each try twice (the content alone, and wrapped as the observation):
tokenising each try whole would tokenise the first item up to seven times per tool turn, and
tokenisation is most of a step's local CPU. The tokenizer's pre-tokenizer splits text into pieces that BPE then encodes one by
one, so wherever a split is *certain*, the tokens of a text are the tokens of its two sides.
For the Qwen pre-tokenizer (:data:`QWEN_SPLIT`: one regex, scanned left to right, with no
look-behind, then byte-level mapping; NFC normalisation) a split is certain at position ``p`` of
``s`` when

* ``s[p-1]`` is a newline and ``s[p]`` is neither whitespace nor a combining character (no
  alternative of the regex matches a newline followed by anything but whitespace, and
  nothing composes with a newline), or
* ``s[p-1]`` is a letter and ``s[p]`` is a space (a run of letters ends there; a space
  composes with nothing).

Every other tokenizer, and a text with no such split, is tokenised whole: the result is
the same ids either way (the piecewise-token tests check it on arbitrary text).
"""

from __future__ import annotations

import json
import unicodedata
import weakref
from collections.abc import Sequence

from searchr1.core.observation.tokens import observation_wrapper, plain_tokens
from searchr1.core.protocol import observation_tokens as whole_observation_tokens
from searchr1.core.protocol import template_boundaries
from searchr1.core.types import JsonObject, Tokenizer

QWEN_SPLIT = (
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
SEPARATOR = "\n\n"  # how observation_candidates are joined into one tool message

_SUPPORTED: "weakref.WeakKeyDictionary[Tokenizer, bool]" = weakref.WeakKeyDictionary()


def _component(part: object) -> JsonObject | None:
    """A tokenizer component as JSON (just that component: the whole tokenizer is megabytes)."""
    if part is None:
        return None
    try:
        state = part.__getstate__()
        component = json.loads(state) if isinstance(state, str | bytes) else None
    except (AttributeError, TypeError, ValueError):
        component = None
    return component if isinstance(component, dict) else {"type": "unknown"}


def splits_predictably(tokenizer: Tokenizer) -> bool:
    """Whether this tokenizer pre-tokenises exactly as the split rules above assume (cached)."""
    cached = _SUPPORTED.get(tokenizer)
    if cached is not None:
        return cached
    supported = False
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        pre, normalizer = _component(backend.pre_tokenizer) or {}, _component(backend.normalizer)
        steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
        supported = (
            isinstance(steps, list) and len(steps) == 2
            and steps[0] == {"type": "Split", "pattern": {"Regex": QWEN_SPLIT}, "behavior": "Isolated",
                             "invert": False}
            and isinstance(steps[1], dict) and steps[1].get("type") == "ByteLevel"
            and steps[1].get("use_regex") is False
            and (normalizer is None or normalizer == {"type": "NFC"})
        )
    _SUPPORTED[tokenizer] = supported
    return supported


def certain_split(text: str, position: int) -> bool:
    """Whether the pre-tokenizer always splits ``text`` at ``position`` (see the module doc)."""
    if not 0 < position < len(text):
        return False
    before, after = text[position - 1], text[position]
    if before in "\r\n":
        return not after.isspace() and unicodedata.combining(after) == 0
    return after == " " and before.isalpha()


def last_word_split(text: str) -> int:
    """The last certain split before a space in ``text`` (0 when there is none)."""
    position = text.rfind(" ")
    while position > 0:
        if certain_split(text, position):
            return position
        position = text.rfind(" ", 0, position)
    return 0


class JoinedObservation:
    """Plain and observation tokens of ``SEPARATOR.join(items[:k])`` for every ``k``.

    Equal to ``plain_tokens(tokenizer, joined)`` and ``protocol.observation_tokens(tokenizer,
    joined)``; the bulk of each item is tokenised once whatever ``k`` is asked for.
    """

    def __init__(self, tokenizer: Tokenizer, items: Sequence[str], *, thinking: bool = False) -> None:
        self.tokenizer = tokenizer
        self.items = list(items)
        self.thinking = thinking
        self.wrapper = observation_wrapper(tokenizer, template_boundaries(tokenizer, thinking=thinking))
        self.piecewise = splits_predictably(tokenizer) and self._joins_are_splits()
        self._bodies: dict[int, list[int]] = {}
        self._splits: dict[int, int] = {}
        self._tails: dict[tuple[int, bool, str], list[int]] = {}

    def _joins_are_splits(self) -> bool:
        if not self.items or any(not item.strip() for item in self.items):
            return False
        head = self.wrapper.head_text
        first = self.items[0]
        if first != first.lstrip():  # the observation strips the content: keep that to the slow path
            return False
        if head and not certain_split(head + first, len(head)):
            return False
        return all(certain_split(SEPARATOR + item, len(SEPARATOR)) for item in self.items[1:])

    def _encode(self, text: str) -> list[int]:
        return plain_tokens(self.tokenizer, text) if text else []

    def _item(self, index: int, ending: str, *, stripped: bool = False) -> list[int]:
        """Tokens of ``items[index] + ending`` (the item right-stripped when ``stripped``): the
        item's bulk (before its last certain split) is tokenised once, the short rest with each
        ending."""
        key = (index, stripped, ending)
        if key not in self._tails:
            item = self.items[index].rstrip() if stripped else self.items[index]
            self._tails[key] = self._encode(item[self._split(index):] + ending)
        return self._body(index) + self._tails[key]

    def _split(self, index: int) -> int:
        if index not in self._splits:
            self._splits[index] = last_word_split(self.items[index].rstrip())
        return self._splits[index]

    def _body(self, index: int) -> list[int]:
        if index not in self._bodies:
            self._bodies[index] = self._encode(self.items[index][: self._split(index)])
        return self._bodies[index]

    def joined(self, count: int) -> str:
        return SEPARATOR.join(self.items[:count])

    def content_tokens(self, count: int) -> list[int]:
        """``plain_tokens`` of the first ``count`` items joined."""
        if not self.piecewise:
            return plain_tokens(self.tokenizer, self.joined(count))
        out: list[int] = []
        for index in range(count - 1):
            out += self._item(index, SEPARATOR)
        return out + self._item(count - 1, "")

    def observation_tokens(self, count: int) -> list[int]:
        """``protocol.observation_tokens`` of the first ``count`` items joined."""
        wrapper = self.wrapper
        if not self.piecewise:
            return whole_observation_tokens(self.tokenizer, self.joined(count), thinking=self.thinking)
        out = list(wrapper.head) + self._encode(wrapper.head_text)
        for index in range(count - 1):
            out += self._item(index, SEPARATOR)
        out += self._item(count - 1, wrapper.tail_text, stripped=True)
        return out + list(wrapper.tail)
