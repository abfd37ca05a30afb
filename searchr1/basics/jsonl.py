"""The one JSON decoder and the one JSON Lines reader for every file the project reads: datasets,
corpora, run files, transcripts and eval files.

Whatever a file holds, reading it either yields values or raises the caller's error class with
one line naming the file and the line (and the field where there is one). Decoding is strict:

- the bytes must be UTF-8 (an invalid byte names its position);
- nesting is at most :data:`MAX_DEPTH` levels and an integer at most :data:`MAX_INT_DIGITS`
  digits, so no value makes a reader (or code that walks the value later) recurse without end or
  spend seconds converting digits;
- a line is at most ``max_line_bytes`` long, read in pieces of that size, so a runaway row costs
  that much memory and no more;
- JSON may spell a lone surrogate (``"\\udfff"``) that no UTF-8 writer, tokenizer or file
  accepts: :class:`Surrogates` says whether such a string is refused (naming the field) or mended
  to U+FFFD, here at the edge, before any work is done with it.

A crash can cut the last line of a file we append to; :class:`TornLines` says what a reader
makes of a line it cannot decode: an error, a torn last write, or a line to skip.
"""

from __future__ import annotations

import enum
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Protocol

from searchr1.core.errors import UserError
from searchr1.basics.json_types import JsonObject, JsonValue
from searchr1.basics.unicode import valid_tree

MAX_DEPTH = 64
MAX_INT_DIGITS = 64
MAX_LINE_BYTES = 64 * 1024 * 1024
_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


class JsonInputError(UserError, ValueError):
    """A file's JSON cannot be taken; the message names the file and the line."""


class TornLines(enum.Enum):
    """What a reader does with a line it cannot decode."""

    REFUSE = "refuse"  # an error naming the line: files a person writes (datasets, corpora)
    LAST = "last"  # the last line, without its newline, is a write a crash cut short: skipped
    SKIP = "skip"  # any such line is skipped and its number kept: ledgers read to resume or view


class Surrogates(enum.Enum):
    """What becomes of a string holding a lone surrogate."""

    REFUSE = "refuse"  # an error naming the field
    MEND = "mend"  # each lone surrogate becomes U+FFFD


class Digest(Protocol):
    def update(self, data: bytes, /) -> None: ...


class _IntegerTooLong(ValueError):
    pass


def _parse_int(digits: str) -> int:
    if len(digits) > MAX_INT_DIGITS and len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise _IntegerTooLong(digits)
    return int(digits)


def json_error_text(error: json.JSONDecodeError, *, one_line: bool = True) -> str:
    """``Expecting value at column 7`` (or ``at line 3, column 7`` in a document). Some of the
    decoder's messages end in "at" already (``Unterminated string starting at``)."""
    if one_line:
        where = "the end of the line" if error.pos >= len(error.doc.rstrip()) else f"column {error.pos + 1}"
    else:
        where = f"line {error.lineno}, column {error.colno}"
    return f"{error.msg} {where}" if error.msg.endswith(" at") else f"{error.msg} at {where}"


def _too_deep(value: JsonValue) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > MAX_DEPTH:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


def _lone_surrogate(value: JsonValue, path: str = "") -> str | None:
    """The path (``answers[0]``, ``meta.title``, or ``(top level)``) of the first string, key
    included, holding a lone surrogate."""
    if isinstance(value, str):
        return (path or "(top level)") if _SURROGATE.search(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            if _SURROGATE.search(key):
                return f"{path}.{key!a}".lstrip(".") + " (the key)"
            found = _lone_surrogate(item, f"{path}.{key}".lstrip("."))
            if found:
                return found
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _lone_surrogate(item, f"{path}[{index}]")
            if found:
                return found
    return None


def _field_words(path: str) -> str:
    return "the value" if path == "(top level)" else f"field {path}"


def decode_json(data: str | bytes, *, where: str, error: type[Exception] = JsonInputError,
                surrogates: Surrogates = Surrogates.REFUSE, one_line: bool = True) -> JsonValue:
    """One JSON value from ``data`` under the rules of the module docstring; ``error`` with a
    message starting ``where:`` otherwise. ``one_line``: positions are columns of a line, not
    lines of a document."""
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as problem:
            line = data.count(b"\n", 0, problem.start) + 1
            at = f"column {problem.start + 1}" if one_line else f"line {line}"
            raise error(f"{where}: not UTF-8 text (byte 0x{data[problem.start]:02x} at {at})") from None
    else:
        text = data
    try:
        value = json.loads(text, parse_int=_parse_int)
    except json.JSONDecodeError as problem:
        raise error(f"{where}: invalid JSON ({json_error_text(problem, one_line=one_line)})") from None
    except RecursionError:
        raise error(f"{where}: JSON nested deeper than {MAX_DEPTH} levels") from None
    except _IntegerTooLong:
        raise error(f"{where}: an integer longer than {MAX_INT_DIGITS} digits") from None
    if text.count("[") + text.count("{") > MAX_DEPTH and _too_deep(value):
        raise error(f"{where}: JSON nested deeper than {MAX_DEPTH} levels")
    if _ESCAPED_SURROGATE.search(text):
        if surrogates is Surrogates.MEND:
            return valid_tree(value)
        field = _lone_surrogate(value)
        if field is not None:
            raise error(f"{where}: {_field_words(field)} holds a lone surrogate (an escaped \\ud800-\\udfff "
                        "that is not text); write the character itself, or a valid pair")
    return value


def _size(count: int) -> str:
    return f"{count // (1024 * 1024)} MiB" if count >= 1024 * 1024 else f"{count} bytes"


class JsonLines:
    """``(line number, value)`` for every non-blank line of ``path``, decoded by
    :func:`decode_json`; afterwards ``torn_lines`` lists the lines skipped under ``torn`` and
    ``bytes_read`` counts the bytes read. ``digest`` (a hashlib object) sees every byte, blank
    lines included. A line over ``max_line_bytes`` is an error (skipped under
    :attr:`TornLines.SKIP`), and is never held whole."""

    def __init__(self, path: str | os.PathLike[str], *, error: type[Exception] = JsonInputError,
                 torn: TornLines = TornLines.REFUSE, surrogates: Surrogates = Surrogates.REFUSE,
                 max_line_bytes: int = MAX_LINE_BYTES, digest: Digest | None = None) -> None:
        self.path = Path(path)
        self.error = error
        self.torn = torn
        self.surrogates = surrogates
        self.max_line_bytes = max_line_bytes
        self.digest = digest
        self.torn_lines: list[int] = []
        self.torn_text: list[str] = []  # each skipped line as text (bytes that are not UTF-8 mended)
        self.bytes_read = 0

    def _read(self, handle: IO[bytes], limit: int) -> bytes:
        raw = handle.readline(limit)
        self.bytes_read += len(raw)
        if self.digest is not None:
            self.digest.update(raw)
        return raw

    def _skip(self, number: int, raw: bytes) -> None:
        self.torn_lines.append(number)
        self.torn_text.append(raw.decode("utf-8", "replace").rstrip("\n"))

    def __iter__(self) -> Iterator[tuple[int, JsonValue]]:
        try:
            handle = open(self.path, "rb")
        except OSError as problem:
            raise self.error(f"cannot read {self.path}: {problem.strerror or problem}") from None
        with handle:
            number = 0
            while raw := self._read(handle, self.max_line_bytes + 1):
                number += 1
                where = f"{self.path}:{number}"
                if len(raw) > self.max_line_bytes:
                    if self.torn is not TornLines.SKIP:
                        raise self.error(f"{where}: the line is longer than {_size(self.max_line_bytes)}, "
                                         "the most one row may hold")
                    self._skip(number, raw)
                    while not raw.endswith(b"\n") and (raw := self._read(handle, self.max_line_bytes)):
                        pass
                    continue
                if not raw.strip():
                    continue
                try:
                    value = decode_json(raw, where=where, error=self.error, surrogates=self.surrogates)
                except self.error:
                    if self.torn is TornLines.SKIP or (self.torn is TornLines.LAST and not raw.endswith(b"\n")):
                        self._skip(number, raw)
                        continue
                    raise
                yield number, value


def iter_json_lines(path: str | os.PathLike[str], *, error: type[Exception] = JsonInputError,
                    surrogates: Surrogates = Surrogates.REFUSE) -> Iterator[tuple[int, JsonValue]]:
    """``(line number, value)`` for every non-blank line; any bad line raises ``error``."""
    return iter(JsonLines(path, error=error, surrogates=surrogates))


def read_json_document(path: str | os.PathLike[str], *, error: type[Exception] = JsonInputError,
                       surrogates: Surrogates = Surrogates.REFUSE, max_bytes: int = MAX_LINE_BYTES) -> JsonValue:
    """The one JSON value a whole file holds (``config.json``, a manifest), by the same rules;
    a missing file is ``FileNotFoundError`` for the caller to word."""
    path = Path(path)
    with open(path, "rb") as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise error(f"{path}: longer than {_size(max_bytes)}, the most such a file may hold")
    return decode_json(data, where=str(path), error=error, surrogates=surrogates, one_line=False)


def read_json_object(path: str | os.PathLike[str], error: type[Exception], what: str) -> JsonObject:
    """The JSON object in ``path``; otherwise ``error`` with one line naming the file (and the
    line of a syntax error). ``what`` says what the file is meant to be."""
    path = Path(path)
    try:
        payload = read_json_document(path, error=error)
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist") from None
    except OSError as problem:
        raise error(f"cannot read {what} {path}: {problem.strerror or problem}") from None
    if not isinstance(payload, dict):
        raise error(f"{path}: the top level must be an object")
    return payload
