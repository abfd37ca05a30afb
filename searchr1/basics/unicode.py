"""Text from outside made valid Unicode where it is parsed.

JSON may spell a lone surrogate (``"\\ud800"``) and ``json.loads`` hands it over as is: a
Python ``str`` that no UTF-8 encoder, tokenizer or file writer accepts. Every backend parses
with ``searchr1.search.base.parse_json``, which mends them (``searchr1.basics.jsonl``, the rules of
every JSON we read; a replayed cassette goes through the same parsing), so search items, titles,
error texts and echoed queries are always encodable; :func:`valid_text` mends a single string.
A lone surrogate becomes U+FFFD; a proper pair never survives ``json.loads`` as two code points,
so nothing valid is changed.
"""

from __future__ import annotations

import re

from searchr1.basics.json_types import JsonValue

REPLACEMENT = "\ufffd"
_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_text(text: str) -> str:
    """``text`` with every code point UTF-8 cannot encode (lone surrogates) replaced by U+FFFD."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub(REPLACEMENT, text)
    return text


def valid_tree(value: JsonValue) -> JsonValue:
    """A parsed JSON value with :func:`valid_text` applied to every string, keys included."""
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, dict):
        return {valid_text(key): valid_tree(item) for key, item in value.items()}
    if isinstance(value, list):
        return [valid_tree(item) for item in value]
    return value
