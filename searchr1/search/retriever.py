"""Retriever backend: the official Search-R1 retrieval server (``POST /retrieve``).

Request ``{"queries": [q], "topk": 3, "return_scores": true}``; response
``{"result": [[{"document": {"id", "contents"}, "score"}, …]]}`` (one list per query; plain
document lists when scores are off). As in the official rollout code, a document's first line
is its title and the rest its text; wiki-18 titles are stored in double quotes, which we drop.
Items carry ``source="wiki-18"`` (configurable) so observations use the Title:/Content: layout.

A server started with a key (``retriever serve --api-key``) is sent it as ``Authorization: Bearer``
from :data:`KEY_ENV` (the environment, then the ``.env`` file); a 401 or 403 from the server is a
:class:`RetrieverRefusedError` that stops the run in one line naming the variable, never its value.
"""

from __future__ import annotations

from typing import Unpack

from searchr1.search.base import (
    BackendOptions,
    CallContext,
    HttpSearchBackend,
    Outcome,
    PayloadError,
    SearchRefusedError,
    check_url,
    http_status_outcome,
    read_json,
    passage_ident,
    truncate,
)
from searchr1.basics.secrets import Secret, redact_url, url_secrets
from searchr1.core.types import SearchItem
from searchr1.bm25.corpus import split_contents  # the wiki-18 layout, also read by the local index

DEFAULT_URL = "http://127.0.0.1:8000/retrieve"
DEFAULT_SOURCE = "wiki-18"
KEY_ENV = "SEARCHR1_RETRIEVER_API_KEY"
REFUSED_STATUSES = (401, 403)


class RetrieverRefusedError(SearchRefusedError):
    """The retrieval server refused the key sent, or the lack of one (HTTP 401 or 403); names the
    URL without its credentials and :data:`KEY_ENV`, never a key."""

    def __init__(self, url: str, status: int, *, key_sent: bool) -> None:
        advice = (f"the key in {KEY_ENV} is not the one it was started with" if key_sent
                  else f"it takes a key: set {KEY_ENV} to the key its server was started with")
        super().__init__(f"the retriever at {redact_url(url)} refused the request (HTTP {status}); {advice}")
        self.status = status


def key_headers(api_key: Secret | None) -> dict[str, str]:
    """The headers of a request to a retrieval server: JSON, and the key when there is one."""
    headers = {"Accept": "application/json"}
    if api_key is not None:
        headers["Authorization"] = f"Bearer {api_key.reveal()}"
    return headers


def parse_retriever_payload(
    payload: object, *, limit: int = 3, source: str = DEFAULT_SOURCE
) -> tuple[SearchItem, ...]:
    """Items of the first (only) query's hits, in server order; documents without text dropped."""
    if not isinstance(payload, dict):
        raise PayloadError(f"top level is {type(payload).__name__}, expected an object")
    result = payload.get("result")
    if not isinstance(result, list):
        raise PayloadError("result is not a list")
    if not result:
        return ()
    hits = result[0]
    if not isinstance(hits, list):
        raise PayloadError("result[0] is not a list")
    items: list[SearchItem] = []
    for position, hit in enumerate(hits):
        if not isinstance(hit, dict):
            raise PayloadError(f"result[0][{position}] is not an object")
        document = hit.get("document", hit)
        if not isinstance(document, dict):
            raise PayloadError(f"result[0][{position}].document is not an object")
        contents = document.get("contents")
        if not isinstance(contents, str):
            raise PayloadError(f"result[0][{position}] has no string 'contents'")
        title, text = split_contents(contents)
        if not text:
            continue
        items.append(SearchItem(title=title or "Untitled", content=truncate(text), source=source,
                                ident=passage_ident(document.get("id"))))
    return tuple(items[:limit])


class RetrieverSearchBackend(HttpSearchBackend):
    name = "retriever"

    def __init__(
        self,
        *,
        url: str = DEFAULT_URL,
        topk: int = 3,
        source: str = DEFAULT_SOURCE,
        api_key: Secret | str | None = None,
        concurrency: int = 32,
        timeout: float = 30.0,
        **kwargs: Unpack[BackendOptions],
    ) -> None:
        super().__init__(concurrency=concurrency, timeout=timeout, **kwargs)
        self.api_key = Secret(api_key) if isinstance(api_key, str) else api_key
        if topk < 1:
            raise ValueError(f"retriever: topk must be >= 1, got {topk}")
        if not source:
            raise ValueError(
                "retriever: source label must be non-empty (it selects the Title:/Content: layout)"
            )
        self.url = check_url(url, "retriever url")
        self.topk = topk
        self.source = source

    def request_params(self) -> dict[str, object]:
        return {"url": redact_url(self.url), "topk": self.topk}

    def secrets(self) -> tuple[Secret, ...]:
        return (*url_secrets(self.url), *((self.api_key,) if self.api_key else ()))

    def replay_options(self) -> dict[str, object]:
        # No credential of the URL: the cassette stores none, and replay matches without them.
        return {**super().replay_options(), "url": redact_url(self.url), "topk": self.topk, "source": self.source}

    async def _attempt(self, ctx: CallContext) -> Outcome:
        body = {"queries": [ctx.query], "topk": self.topk, "return_scores": True}
        async with self._client.stream("POST", self.url, json=body, headers=key_headers(self.api_key)) as response:
            if response.status_code in REFUSED_STATUSES:
                raise RetrieverRefusedError(self.url, response.status_code, key_sent=self.api_key is not None)
            status = http_status_outcome(response)
            if status is not None:
                return status
            payload = await read_json(response, self.max_body_bytes)
            items = parse_retriever_payload(payload, limit=self.topk, source=self.source)
            return Outcome.success(items, response.status_code)
