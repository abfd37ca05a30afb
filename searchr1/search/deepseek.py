"""DeepSeek backend: evidence search over the Anthropic-compatible Messages endpoint (SSE).

Our own httpx client (PyPI's ``deepseek-search`` is an unrelated project). One streamed call
per attempt; the stream is read to ``message_stop``. Retries on 429, 5xx, timeouts and
connection errors; 402 (balance), 401 and other 4xx fail at once. An SSE ``error`` event
becomes ``ok=False`` with a short, sanitised message. Every attempt's token usage is counted,
failed ones included. The model name and the web-search tool type are settings because the
service renamed both in 2026.

Timeouts, as in the lab port: ``timeout`` (60 s) is httpx's limit per read, so an evidence text
that keeps streaming is never cut by it; ``total_timeout`` (default 300 s) is the separate
wall-clock limit of one attempt. The error text says which one fired.

What counts as evidence: only text written after the search results arrived. A reply
without any web search (the service did not honour ``tool_choice``) returns no items and is
counted in ``search/no_web_search_rate``; its text, the model's own answer, is discarded. A
web-search error block (``web_search_tool_result_error``) is a failed search, retried when the
code says the search service was busy or down.
"""

from __future__ import annotations

from typing import Unpack

from searchr1.search.base import (
    BodyLimitOptions,
    CallContext,
    HttpSearchBackend,
    Outcome,
    check_url,
    http_status_outcome,
    parse_json,
)
from searchr1.search.evidence import EVIDENCE_SYSTEM_PROMPT, EvidenceStream, build_request, parse_evidence
from searchr1.basics.secrets import Secret, redact_url, sanitise_error, url_secrets
from searchr1.search.sse import NotAnEventStream, read_events

DEFAULT_BASE_URL = "https://api.deepseek.com/anthropic"
MESSAGES_PATH = "/v1/messages"
DEFAULT_MODEL = "deepseek-v4-flash"
DEFAULT_TOOL_TYPE = "web_search_20260209"
DEFAULT_TOTAL_TIMEOUT = 300.0  # seconds of wall-clock time for one streamed attempt
KEY_ENV_VARS = ("DEEPSEEK_API_KEY",)
# web_search_tool_result_error codes (Anthropic's vocabulary) worth another attempt.
RETRYABLE_SEARCH_ERRORS = {"too_many_requests", "unavailable"}

DEFAULT_MAX_LINE_BYTES = 1024 * 1024  # one SSE line; a real event is a few hundred bytes

_STATUS_NOTES = {401: "authentication failed", 402: "insufficient balance", 422: "invalid parameters"}


class DeepSeekSearchBackend(HttpSearchBackend):
    name = "deepseek"
    token_metrics = True

    def __init__(
        self,
        *,
        api_key: Secret | str,
        base_url: str = DEFAULT_BASE_URL,
        model: str = DEFAULT_MODEL,
        tool_type: str = DEFAULT_TOOL_TYPE,
        max_tokens: int = 2048,
        max_uses: int = 1,
        concurrency: int = 16,
        timeout: float = 60.0,
        max_retries: int = 1,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        **kwargs: Unpack[BodyLimitOptions],
    ) -> None:
        super().__init__(concurrency=concurrency, timeout=timeout, max_retries=max_retries, **kwargs)
        self.max_line_bytes = max_line_bytes
        self._api_key = api_key if isinstance(api_key, Secret) else Secret(api_key)
        if not self._api_key:
            raise ValueError("deepseek: api_key is empty")
        if not model or not tool_type:
            raise ValueError("deepseek: model and tool_type must be non-empty")
        self.base_url = check_url(base_url, "deepseek base_url").rstrip("/")
        self.model = model
        self.tool_type = tool_type
        self.max_tokens = max_tokens
        self.max_uses = max_uses

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, model={self.model!r}, tool_type={self.tool_type!r})"

    def secrets(self) -> tuple[Secret, ...]:
        return (self._api_key, *url_secrets(self.base_url))

    def default_total_timeout(self) -> float:
        return max(DEFAULT_TOTAL_TIMEOUT, self.timeout)

    def replay_options(self) -> dict[str, object]:
        return {
            **super().replay_options(),
            "base_url": redact_url(self.base_url),
            "model": self.model,
            "tool_type": self.tool_type,
            "max_tokens": self.max_tokens,
            "max_uses": self.max_uses,
        }

    def request_params(self) -> dict[str, object]:
        return {
            "base_url": redact_url(self.base_url),
            "model": self.model,
            "tool_type": self.tool_type,
            "max_uses": self.max_uses,
            "max_tokens": self.max_tokens,
            "prompt": EVIDENCE_SYSTEM_PROMPT,
        }

    async def _attempt(self, ctx: CallContext) -> Outcome:
        body = build_request(
            ctx.query,
            model=self.model,
            tool_type=self.tool_type,
            max_uses=self.max_uses,
            max_tokens=self.max_tokens,
        )
        headers = {
            "x-api-key": self._api_key.reveal(),
            "anthropic-version": "2023-06-01",
            "Accept": "text/event-stream",
        }
        stream = EvidenceStream()
        try:
            async with self._client.stream(
                "POST", self.base_url + MESSAGES_PATH, json=body, headers=headers
            ) as response:
                status = http_status_outcome(response)
                if status is not None:
                    note = _STATUS_NOTES.get(response.status_code)
                    if note:
                        status.error = f"HTTP {response.status_code} ({note})"
                    return status
                events = read_events(response, max_bytes=self.max_body_bytes, max_line_bytes=self.max_line_bytes)
                async for event in events:
                    try:
                        data = parse_json(event)
                    except ValueError:
                        continue  # keep-alives, "[DONE]" and other non-JSON data lines
                    stream.feed(data)
                    if stream.finished or stream.failed:
                        break
        except NotAnEventStream:
            return Outcome.fail("unexpected content type (expected an event stream)", 200)
        finally:
            ctx.usage.add(stream.usage_record())
        return self._judge(stream, ctx)

    def _judge(self, stream: EvidenceStream, ctx: CallContext) -> Outcome:
        if stream.failed:
            message = sanitise_error(stream.error_message or "", self.secrets(), limit=120)
            kind = sanitise_error(stream.error_type or "error", self.secrets(), limit=40)
            return Outcome.fail(f"DeepSeek stream error ({kind}): {message}".rstrip(": "), 200)
        if not stream.finished:
            return Outcome.fail("truncated event stream (no message_stop)", 200)
        if stream.searches > self.max_uses:
            return Outcome.fail(
                f"evidence mode broken: {stream.searches} web searches (max {self.max_uses})", 200
            )
        if stream.search_error is not None:
            code = sanitise_error(stream.search_error, self.secrets(), limit=40)
            error = f"DeepSeek web search failed ({code})"
            if stream.search_error in RETRYABLE_SEARCH_ERRORS:
                return Outcome.retry(error, 200, rate_limited=stream.search_error == "too_many_requests")
            return Outcome.fail(error, 200)
        if not stream.searched:
            ctx.searched = False  # the model answered from memory: not evidence
            return Outcome.success((), 200)
        ctx.searched = True
        return Outcome.success(parse_evidence(stream.text), 200)
