"""A bounded reader of server-sent events (the part of the SSE format DeepSeek's stream uses).

Bytes are counted as they arrive, so a body is cut at ``max_bytes`` even inside one event, and
the unfinished line is never buffered past ``max_line_bytes``: one event without a newline
cannot fill memory. Lines end at ``\\r\\n``, ``\\r`` or ``\\n``; a blank line ends an event;
``data:`` lines of one event are joined with newlines; comments (``:``) and other fields are
ignored; an unfinished event at the end of the body is dropped, as the format says.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import AsyncIterator

import httpx

from searchr1.search.base import LineTooLong, ResponseTooLarge


_NEWLINE = re.compile(r"\r\n|\r|\n")


class NotAnEventStream(ValueError):
    """The response's Content-Type is not ``text/event-stream``."""


class EventReader:
    """Feed bytes, get the ``data`` of each finished event (pure: no I/O)."""

    def __init__(self, *, max_bytes: int, max_line_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.max_line_bytes = max_line_bytes
        self.received = 0
        self._text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._line: list[str] = []
        self._line_size = 0
        self._after_cr = False
        self._data: list[str] = []
        self._has_data = False

    def feed(self, chunk: bytes) -> list[str]:
        self.received += len(chunk)
        if self.received > self.max_bytes:
            raise ResponseTooLarge(self.received)
        return self._text_in(self._text.decode(chunk))

    def close(self) -> list[str]:
        """Events finished by the last bytes (an unterminated last event is dropped)."""
        return self._text_in(self._text.decode(b"", final=True))

    def _text_in(self, text: str) -> list[str]:
        if text and self._after_cr:
            self._after_cr = False
            if text[0] == "\n":
                text = text[1:]  # the second half of a \r\n split across chunks
        events: list[str] = []
        start = 0
        for newline in _NEWLINE.finditer(text):
            self._append(text[start : newline.start()])
            events += self._line_done()
            start = newline.end()
            self._after_cr = newline.group() == "\r" and start == len(text)
        self._append(text[start:])
        return events

    def _append(self, part: str) -> None:
        if part:
            self._line_size += len(part)
            if self._line_size > self.max_line_bytes:
                raise LineTooLong(self._line_size)
            self._line.append(part)

    def _line_done(self) -> list[str]:
        line = "".join(self._line)
        self._line, self._line_size = [], 0
        if not line:
            if not self._has_data:
                return []
            data = "\n".join(self._data)
            self._data, self._has_data = [], False
            return [data]
        if line.startswith(":"):
            return []
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
            self._has_data = True
        return []


async def read_events(response: httpx.Response, *, max_bytes: int, max_line_bytes: int) -> AsyncIterator[str]:
    """The ``data`` of each event of a streamed response, within the limits."""
    content_type = response.headers.get("content-type", "").partition(";")[0]
    if "text/event-stream" not in content_type:
        raise NotAnEventStream(content_type)
    reader = EventReader(max_bytes=max_bytes, max_line_bytes=max_line_bytes)
    async for chunk in response.aiter_bytes():
        for data in reader.feed(chunk):
            yield data
    for data in reader.close():
        yield data
