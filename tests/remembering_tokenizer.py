"""A tokenizer wrapper for tests whose loops render the same few conversations again and again:
each pure call (chat template render, plain encode, decode) is asked of the real tokenizer once,
and every later call with the same arguments gets a copy of its answer. The tokenizer is
deterministic, so the wrapper answers exactly as the tokenizer does
(``tests/twin/test_learning_policy.py`` checks it)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any


class RememberingTokenizer:
    """``inner`` with its pure calls remembered: each distinct chat template render, encode and
    decode is done once by the real tokenizer, and every later call with the same arguments gets a
    copy of that answer. Every other call reaches the tokenizer itself."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._rendered: dict[str, Any] = {}
        self._encoded: dict[tuple[str, bool], list[int]] = {}
        self._decoded: dict[tuple[tuple[int, ...], bool], str] = {}

    def __getattr__(self, name: str) -> Any:  # eos_token, convert_tokens_to_ids, ...
        return getattr(self._inner, name)

    def __len__(self) -> int:
        return len(self._inner)

    def apply_chat_template(self, conversation: Any, **options: Any) -> Any:
        try:
            key = json.dumps([conversation, options])  # order-sensitive: a reordered message is a new render
        except TypeError:  # not plain data: not remembered
            return self._inner.apply_chat_template(conversation, **options)
        if key not in self._rendered:
            self._rendered[key] = self._inner.apply_chat_template(conversation, **options)
        out = self._rendered[key]
        return list(out) if isinstance(out, list) else out

    def encode(self, text: str, add_special_tokens: bool = True, **options: Any) -> list[int]:
        if options:
            return self._inner.encode(text, add_special_tokens=add_special_tokens, **options)
        key = (text, add_special_tokens)
        if key not in self._encoded:
            self._encoded[key] = list(self._inner.encode(text, add_special_tokens=add_special_tokens))
        return list(self._encoded[key])

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False, **options: Any) -> str:
        if options:
            return self._inner.decode(ids, skip_special_tokens=skip_special_tokens, **options)
        key = (tuple(int(i) for i in ids), skip_special_tokens)
        if key not in self._decoded:
            self._decoded[key] = self._inner.decode(list(key[0]), skip_special_tokens=skip_special_tokens)
        return self._decoded[key]
