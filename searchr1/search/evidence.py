"""DeepSeek evidence search, the pure part: request body, stream accumulation, evidence parsing.

One streamed Anthropic-style Messages call in which the service runs one web search and the
model writes numbered evidence items (``[n] Source: …`` / ``Evidence: …``). Nothing here does
I/O; :mod:`searchr1.search.deepseek` feeds decoded SSE events in.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from searchr1.search.base import truncate
from searchr1.core.types import ReportedUsage
from searchr1.core.types import SearchItem

# The search model's instructions. Evidence, not answers: the policy must still decide what the
# facts mean, so the rules forbid everything that would do that work for it.
EVIDENCE_RULES: tuple[str, ...] = (
    "Run the web_search tool exactly once, with the user's text as the query. Do not rephrase "
    "it and do not search a second time.",
    "Use only what the search results returned. Add nothing from your own knowledge.",
    "Quote each fact, or restate it as closely as the source words it; report facts, never "
    "conclusions.",
    "Do not infer a relation, an ordering (earlier or later, larger or smaller, first or last) "
    "or a cause that a result does not state in so many words.",
    "Keep every item to one source: do not combine facts from different sources into one "
    "statement, and do not assemble them into an answer.",
    "Do not phrase anything as an answer: no direct reply to the user's question, no yes or "
    "no, no \"the answer is\".",
    "Give at most 8 items, one per source, each with the source's title and one or two short "
    "sentences taken from that source. Do not include URLs.",
    "If the results contain nothing relevant, reply exactly: Insufficient evidence from this search.",
)

EVIDENCE_SYSTEM_PROMPT = (
    "You are a retrieval component, not an assistant. You collect evidence; someone else "
    "decides what it means.\n\nRules:\n"
    + "\n".join(f"- {rule}" for rule in EVIDENCE_RULES)
    + "\n\nFormat every item as below, with one blank line between items:\n"
    "[1] Source: <title of the source>\n"
    "Evidence: <fact stated by that source>"
)

INSUFFICIENT_EVIDENCE = "Insufficient evidence from this search."
FALLBACK_TITLE = "DeepSeek Web Search"
MAX_EVIDENCE_ITEMS = 8

# "[n] Source: title" newline "Evidence: text", up to the blank line before the next item.
_EVIDENCE_ITEM = re.compile(
    r"^\[\d+\]\s*Source:\s*(?P<title>.*?)\s*\nEvidence:\s*(?P<evidence>.*?)"
    r"(?=\n\s*\n\[\d+\]\s*Source:|\Z)",
    re.MULTILINE | re.DOTALL,
)


def build_request(
    query: str, *, model: str, tool_type: str, max_uses: int = 1, max_tokens: int = 2048
) -> dict[str, object]:
    """The Messages request body of one evidence search."""
    return {
        "model": model,
        "max_tokens": max_tokens,
        "system": EVIDENCE_SYSTEM_PROMPT,
        "messages": [{"role": "user", "content": query}],
        "tools": [{"type": tool_type, "name": "web_search", "max_uses": max_uses}],
        "tool_choice": {"type": "any"},
        "stream": True,
    }


def parse_evidence(text: str | None) -> tuple[SearchItem, ...]:
    """Split the model's evidence text into items.

    Items need a blank line between them. Text that does not follow the numbered format
    becomes one item titled ``DeepSeek Web Search`` (the lab port's fallback), bounded to 1200
    characters. The "insufficient evidence" sentence (case and final full stop aside), or
    empty text, means no results; the lab port showed that sentence as an evidence item.
    """
    if text is None or not text.strip() or is_insufficient(text):
        return ()
    items = []
    for match in _EVIDENCE_ITEM.finditer(text):
        title, evidence = match.group("title").strip(), match.group("evidence").strip()
        if title and evidence:
            items.append(SearchItem(title=truncate(title, 200), content=truncate(evidence)))
    if items:
        return tuple(items[:MAX_EVIDENCE_ITEMS])
    return (SearchItem(title=FALLBACK_TITLE, content=truncate(text)),)


def is_insufficient(text: str) -> bool:
    """Whether the model's whole reply is the "insufficient evidence" sentence."""
    return text.strip().rstrip(".").strip().casefold() == INSUFFICIENT_EVIDENCE.rstrip(".").casefold()


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass
class EvidenceStream:
    """Accumulates the decoded SSE events of one evidence call.

    Only text written after search results arrived is evidence: text blocks that start after
    the last ``web_search_tool_result`` block. Anything the model writes before (a plan, its
    own answer when it does not search at all) is dropped, and thinking blocks never count.
    A result block whose content is an error object (``web_search_tool_result_error``) is
    kept as ``search_error``. Unknown events (``ping``, ``citations_delta``, …) are ignored.
    """

    usage: dict[str, int] = field(default_factory=dict)
    search_queries: list[str] = field(default_factory=list)
    web_results: list[dict[str, str]] = field(default_factory=list)
    searches: int = 0
    search_error: str | None = None
    dropped_text: int = 0  # characters written outside evidence blocks (before any results)
    finished: bool = False
    error_type: str | None = None
    error_message: str | None = None
    _text: list[str] = field(default_factory=list)
    _evidence_blocks: set[int] = field(default_factory=set)
    _other_text_blocks: set[int] = field(default_factory=set)
    _tool_input: dict[int, list[str]] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return "".join(self._text)

    @property
    def failed(self) -> bool:
        return self.error_type is not None

    @property
    def searched(self) -> bool:
        """Whether search results (not an error) arrived."""
        return self.searches > 0 and self.search_error is None

    def _take_usage(self, usage: object) -> None:
        if isinstance(usage, dict):
            for key, value in usage.items():
                if _int(value) is not None:
                    self.usage[key] = value
            server = usage.get("server_tool_use")
            if isinstance(server, dict) and _int(server.get("web_search_requests")) is not None:
                self.usage["web_search_requests"] = server["web_search_requests"]

    def feed(self, event: object) -> None:
        if not isinstance(event, dict):
            return
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message")
            if isinstance(message, dict):
                self._take_usage(message.get("usage"))
        elif kind == "content_block_start":
            self._block_start(event.get("index"), event.get("content_block"))
        elif kind == "content_block_delta":
            self._block_delta(event.get("index"), event.get("delta"))
        elif kind == "content_block_stop":
            self._block_stop(event.get("index"))
        elif kind == "message_delta":
            self._take_usage(event.get("usage"))
        elif kind == "message_stop":
            self.finished = True
        elif kind == "error":
            error = event.get("error")
            error = error if isinstance(error, dict) else {}
            self.error_type = str(error.get("type") or "error")
            self.error_message = str(error.get("message") or "")

    def _block_start(self, index: object, block: object) -> None:
        if not isinstance(block, dict):
            return
        kind = block.get("type")
        if kind == "server_tool_use":
            self._restart_evidence()
            if isinstance(index, int):
                self._tool_input[index] = []
            query = (block.get("input") or {}).get("query") if isinstance(block.get("input"), dict) else None
            if isinstance(query, str) and query:
                self.search_queries.append(query)
        elif kind == "web_search_tool_result":
            self._restart_evidence()
            self.searches += 1
            content = block.get("content")
            if isinstance(content, dict) and content.get("type") == "web_search_tool_result_error":
                self.search_error = str(content.get("error_code") or "unknown")
            else:
                self._take_results(content)
        elif kind == "text" and isinstance(index, int):
            text = block.get("text")
            initial = text if isinstance(text, str) else ""
            if self.searches:
                self._evidence_blocks.add(index)
                self._text.append(initial)
            else:
                self._other_text_blocks.add(index)
                self.dropped_text += len(initial)

    def _restart_evidence(self) -> None:
        """Text written before these results is not evidence about them."""
        self.dropped_text += sum(len(part) for part in self._text)
        self._text.clear()
        self._other_text_blocks |= self._evidence_blocks
        self._evidence_blocks.clear()

    def _block_delta(self, index: object, delta: object) -> None:
        if not isinstance(delta, dict):
            return
        kind = delta.get("type")
        if kind == "text_delta" and isinstance(delta.get("text"), str):
            if index in self._evidence_blocks:
                self._text.append(delta["text"])
            else:
                self.dropped_text += len(delta["text"])
        elif kind == "input_json_delta" and index in self._tool_input:
            partial = delta.get("partial_json")
            if isinstance(partial, str):
                self._tool_input[index].append(partial)
        elif kind == "web_search_delta":
            partial = delta.get("partial")
            self._take_results([partial] if isinstance(partial, dict) else partial)

    def _block_stop(self, index: object) -> None:
        parts = self._tool_input.pop(index, None) if isinstance(index, int) else None
        if parts:
            try:
                query = json.loads("".join(parts)).get("query")
            except (ValueError, AttributeError):
                query = None
            if isinstance(query, str) and query and query not in self.search_queries:
                self.search_queries.append(query)

    def _take_results(self, content: object) -> None:
        if not isinstance(content, list):
            return
        for entry in content:
            if isinstance(entry, dict) and entry.get("type") == "web_search_result":
                self.web_results.append(
                    {"title": str(entry.get("title") or ""), "url": str(entry.get("url") or "")}
                )

    def usage_record(self) -> ReportedUsage:
        """Token and search counts for the stats (the number of result blocks seen counts as
        searches unless the service reported a larger number)."""
        return ReportedUsage(
            input_tokens=self.usage.get("input_tokens", 0),
            cache_read_input_tokens=self.usage.get("cache_read_input_tokens", 0),
            output_tokens=self.usage.get("output_tokens", 0),
            web_search_requests=max(self.searches, self.usage.get("web_search_requests", 0)),
        )
