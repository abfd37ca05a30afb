"""In-process fakes of the four search services, for ``httpx.MockTransport``.

Each fake checks that a request follows the service's documented wire format (the MediaWiki
Action API's pages on search and extracts, Zhihu's global-search API documentation, DeepSeek's
Anthropic-compatible API documentation, and the Search-R1 repository's
``search_r1/search/retrieval_server.py``; a violation raises :class:`WireFormatError`),
finds the query in it, and answers with the next scripted response for that query, rendered
in the service's documented response format. The cassette builder records these exchanges
through the real clients; tests use the same fakes for fault injection.

A scripted response is a small mapping (the "spec vocabulary"):

- every backend: ``results`` (list of ``{title, text, url?}``, best first; success),
  ``status`` (HTTP status, default 200), ``headers``, ``retry_after`` (adds ``Retry-After``),
  ``raw`` + ``content_type`` (a literal body: HTML error pages, broken JSON), ``gzip``
  (send the body gzip-compressed, ``Content-Encoding: gzip``);
- wikipedia: ``api_error`` (``{"code": "maxlag", ...}``: an API error envelope, HTTP 200,
  with the ``MediaWiki-API-Error`` header the API sets on every error), ``warnings`` (added to
  the payload as given); a result with ``"text": null`` is a page without ``extract``; more
  results than the client asked for are sent as they are (pages out of rank order);
- zhihu: ``code`` (+ ``message``): a body ``Code`` other than 0, ``Data: null``;
  ``empty_as`` (``"items_null"``, ``"data_null"``, ``"items_missing"``): how a success with
  no hits is written; results may add ``type`` and ``author``;
- deepseek: ``evidence_text`` (literal model text instead of numbered items), ``usage``,
  ``sse_error`` (``{"type", "message"}``: an SSE error event after ``message_start``),
  ``truncate`` (stream ends before ``message_delta``/``message_stop``), ``web_searches``
  (0: the model answers without searching), ``search_error`` (the result block is a
  ``web_search_tool_result_error`` with this code), ``ping`` (ping events between blocks),
  ``thinking`` (a thinking block first), ``pre_search_text`` (text before the search),
  ``citations`` (each fact in its own cited text block, with ``citations_delta``);
- retriever: results may add ``score``.

Error pages (a non-200 ``status`` with nothing else) take each service's shape: Wikimedia's
plain-text refusal on 403 and HTML pages otherwise, Zhihu's ``{Code, Message, Data: null}``
envelope (30001 on 429, 20001 on 401/403, 90001 on 500) or a gateway's HTML page on 502-504,
DeepSeek's ``{"type": "error", "error": {...}}``.

Pages (``open_page``), for wikipedia and retriever: ``pages={name: page}`` scripts each page a
client may open, ``page`` a mapping of ``paragraphs`` (single-spaced lines, each at most an
item's content limit; ``null``: no such page), ``title`` (default: the name; another title is a
Wikipedia redirect, or the page a retriever passage id names), ``revision`` (Wikipedia; default
derived from the title, the ``lastrevid`` the search answers give) and ``responses``: what the
page's next requests get, in order, in the vocabulary above (``{}``: the page's own answer; once
they are spent every request gets the page's own answer). Wikipedia answers the documented
``prop=revisions`` query (``normalized``, ``redirects``, ``missing``) and ``action=parse``
(the revision's HTML: an infobox table, a hatnote, headings, citation markers and an empty
paragraph around the scripted ones; an unknown ``oldid`` is the API's ``nosuchrevid`` error);
the retriever answers ``POST /page`` (:mod:`searchr1.bm25.server`), and a ``404`` there is
FastAPI's ``{"detail": "Not Found"}``, as the official server (which has no ``/page``) sends.
"""

from __future__ import annotations

import gzip
import hashlib
import html
import json
import re
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal, NotRequired, TypedDict, cast
from urllib.parse import quote

import httpx

from searchr1.basics.json_types import JsonValue
from searchr1.search.base import CONTENT_LIMIT
from searchr1.search.cache import normalise_query

COMMON_KEYS = {"results", "status", "headers", "retry_after", "raw", "content_type", "gzip"}
BACKEND_KEYS = {
    "wikipedia": {"api_error", "warnings"},
    "zhihu": {"code", "message", "empty_as"},
    "deepseek": {
        "evidence_text",
        "usage",
        "sse_error",
        "truncate",
        "web_searches",
        "search_error",
        "ping",
        "thinking",
        "pre_search_text",
        "citations",
    },
    "retriever": set(),
}
ZHIHU_EMPTY_FORMS = {"items_null", "data_null", "items_missing"}
WIKIMEDIA_UA_REFUSAL = (
    "Please set a user-agent and respect our robot policy https://w.wiki/4wJS. See also T400119.\n"
)
RESULT_KEYS = {"title", "text", "url", "type", "author", "score"}
DEFAULT_DEEPSEEK_USAGE = {"input_tokens": 1200, "cache_read_input_tokens": 0, "output_tokens": 80}
ZHIHU_MESSAGES = {
    10001: "parameter error",
    20001: "authentication failed",
    30001: "second limit exceeded",
    30002: "额度不足",
    90001: "internal error",
}


class ScriptedResult(TypedDict):
    """One search hit of a scripted response (``text`` null: a Wikipedia page without extract)."""

    title: str
    text: str | None
    url: NotRequired[str]
    type: NotRequired[str]  # zhihu
    author: NotRequired[str]  # zhihu
    score: NotRequired[float]  # retriever


class ApiError(TypedDict, total=False):
    """A MediaWiki API error; what a script leaves out is filled in as the API writes it."""

    code: str
    info: str
    host: str
    lag: float
    type: str
    docref: str


class SseError(TypedDict, total=False):
    type: str
    message: str


class ScriptedResponse(TypedDict, total=False):
    """A scripted response in the spec vocabulary (the module docstring): the keys every backend
    reads, then wikipedia's, zhihu's and deepseek's."""

    results: list[ScriptedResult]
    status: int
    headers: dict[str, object]  # each value sent as its text
    retry_after: float
    raw: str
    content_type: str
    gzip: bool
    api_error: ApiError
    warnings: JsonValue
    code: int
    message: str
    empty_as: Literal["items_null", "data_null", "items_missing"]
    evidence_text: str | None
    usage: dict[str, int]
    sse_error: SseError
    truncate: bool
    web_searches: int
    search_error: str | None
    ping: bool
    thinking: str
    pre_search_text: str
    citations: bool


class PageScript(TypedDict, total=False):
    """A page ``open_page`` may read (``paragraphs`` null: no such page)."""

    title: str
    paragraphs: list[str] | None
    revision: int
    responses: list[ScriptedResponse]


class WireFormatError(AssertionError):
    """The client sent a request the real service would reject (names the field)."""


class ScriptExhausted(AssertionError):
    """The client made more requests for a query than the script has responses for."""


def check_response_spec(backend: str, response: Mapping[str, object], where: str) -> None:
    """Reject unknown keys so that typos in a spec fail loudly."""
    allowed = COMMON_KEYS | BACKEND_KEYS[backend]
    unknown = sorted(set(response) - allowed)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown} for {backend}; allowed: {sorted(allowed)}")
    if "empty_as" in response and response["empty_as"] not in ZHIHU_EMPTY_FORMS:
        raise ValueError(f"{where}: empty_as must be one of {sorted(ZHIHU_EMPTY_FORMS)}")
    results = response.get("results") or []
    if not isinstance(results, Iterable):
        raise ValueError(f"{where}: 'results' must be a list")
    for n, result in enumerate(results):
        if (
            not isinstance(result, Mapping)
            or not isinstance(result.get("title"), str)
            or "text" not in result
        ):
            raise ValueError(f"{where}: results[{n}] needs a string 'title' and a 'text'")
        if result["text"] is None and backend != "wikipedia":
            raise ValueError(f"{where}: results[{n}]: a null 'text' (page without extract) is Wikipedia's")
        extra = sorted(set(result) - RESULT_KEYS)
        if extra:
            raise ValueError(
                f"{where}: results[{n}] has unknown key(s) {extra}; allowed: {sorted(RESULT_KEYS)}"
            )


def _stable_int(text: str, digits: int = 8) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest()[:digits], 16)


def _scripted_headers(response: ScriptedResponse) -> tuple[dict[str, str], int, httpx.Response | None]:
    """A scripted response's headers (``Retry-After`` from ``retry_after``), its status, and, for a
    ``raw`` body (an HTML error page, a truncated JSON), the whole answer as sent."""
    headers = {str(k): str(v) for k, v in (response.get("headers") or {}).items()}
    if "retry_after" in response:
        headers["Retry-After"] = str(response["retry_after"])
    status = response.get("status", 200)
    if "raw" not in response:
        return headers, status, None
    content_type = response.get("content_type", "text/html; charset=utf-8")
    raw = httpx.Response(status, headers={"content-type": content_type, **headers},
                         content=str(response["raw"]).encode())
    return headers, status, raw


def _json_response(status: int, payload: object, headers: Mapping[str, str]) -> httpx.Response:
    body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
    return httpx.Response(
        status, headers={"content-type": "application/json; charset=utf-8", **headers}, content=body
    )


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise WireFormatError(message)


# --------------------------------------------------------------------------- request checks


def wikipedia_query(request: httpx.Request) -> str:
    _require(request.method == "GET", f"wikipedia: expected GET, got {request.method}")
    _require(
        request.url.path.endswith("/api.php"), f"wikipedia: expected .../api.php, got {request.url.path}"
    )
    params = request.url.params
    expected = {"action": "query", "format": "json", "formatversion": "2", "generator": "search"}
    for key, value in expected.items():
        _require(params.get(key) == value, f"wikipedia: {key} must be {value!r}, got {params.get(key)!r}")
    _require("extracts" in params.get("prop", "").split("|"), "wikipedia: prop must include extracts")
    for flag in ("exintro", "explaintext", "redirects"):
        value = params.get(flag)
        _require(
            value is None or value.lower() not in {"false", "0", "no", ""},
            f"wikipedia: boolean {flag}={value!r} would be read as TRUE; leave it out instead",
        )
    _require("exintro" in params, "wikipedia: exintro is required for more than one extract per request")
    _require(
        not ("exchars" in params and "exsentences" in params), "wikipedia: exchars and exsentences together"
    )
    _require(1 <= int(params.get("exchars", "1200")) <= 1200, "wikipedia: exchars must be 1..1200")
    agent = request.headers.get("user-agent", "")
    _require(
        "(" in agent and not agent.startswith("python-httpx"),
        f"wikipedia: non-descriptive User-Agent {agent!r}",
    )
    query = params.get("gsrsearch", "")
    _require(bool(query), "wikipedia: gsrsearch is empty")
    return query


def zhihu_query(request: httpx.Request) -> str:
    _require(request.method == "GET", f"zhihu: expected GET, got {request.method}")
    _require(
        request.url.path == "/api/v1/content/global_search", f"zhihu: unexpected path {request.url.path}"
    )
    auth = request.headers.get("authorization", "")
    _require(
        auth.startswith("Bearer ") and len(auth) > len("Bearer "),
        "zhihu: Authorization: Bearer <key> missing",
    )
    _require(request.headers.get("x-request-timestamp", "").isdigit(), "zhihu: X-Request-Timestamp missing")
    params = request.url.params
    _require(1 <= int(params.get("Count", "10")) <= 20, "zhihu: Count must be 1..20")
    _require(params.get("SearchDB", "all") in {"all", "realtime", "static"}, "zhihu: bad SearchDB")
    query = params.get("Query", "")
    _require(bool(query), "zhihu: Query is empty")
    return query


def deepseek_query(request: httpx.Request) -> str:
    _require(request.method == "POST", f"deepseek: expected POST, got {request.method}")
    _require(request.url.path.endswith("/v1/messages"), f"deepseek: unexpected path {request.url.path}")
    _require(
        bool(request.headers.get("x-api-key") or request.headers.get("authorization")),
        "deepseek: no key header",
    )
    body = json.loads(request.content)
    _require(body.get("stream") is True, "deepseek: stream must be true")
    _require(isinstance(body.get("model"), str) and body["model"], "deepseek: model missing")
    _require(isinstance(body.get("max_tokens"), int), "deepseek: max_tokens missing")
    tools = body.get("tools")
    _require(isinstance(tools, list) and len(tools) == 1, "deepseek: exactly one tool expected")
    _require(
        tools[0].get("name") == "web_search" and tools[0].get("max_uses") == 1,
        "deepseek: web_search tool with max_uses=1 expected",
    )
    messages = body.get("messages")
    _require(
        isinstance(messages, list) and len(messages) == 1 and messages[0].get("role") == "user",
        "deepseek: one user message expected",
    )
    query = messages[0].get("content")
    _require(isinstance(query, str) and bool(query), "deepseek: user content must be the query text")
    return query


def retriever_query(request: httpx.Request) -> str:
    _require(request.method == "POST", f"retriever: expected POST, got {request.method}")
    _require(request.url.path.endswith("/retrieve"), f"retriever: unexpected path {request.url.path}")
    body = json.loads(request.content)
    queries = body.get("queries")
    _require(
        isinstance(queries, list) and len(queries) == 1 and isinstance(queries[0], str),
        "retriever: queries must be a list with one string",
    )
    _require(isinstance(body.get("topk"), int) and body["topk"] >= 1, "retriever: topk must be an int >= 1")
    _require(isinstance(body.get("return_scores"), bool), "retriever: return_scores must be a boolean")
    return queries[0]


# --------------------------------------------------------------------------- renderers


def wikipedia_url(title: str) -> str:
    return "https://en.wikipedia.org/wiki/" + quote(title.replace(" ", "_"), safe="_()',-")


def render_wikipedia(
    response: ScriptedResponse, request: httpx.Request, headers: dict[str, str]
) -> httpx.Response:
    if "api_error" in response:
        error = response["api_error"].copy()
        code = error.get("code", "internal_api_error")
        headers.setdefault("MediaWiki-API-Error", code)
        if code == "maxlag":
            error.setdefault("info", "Waiting for 10.64.16.41: 6.2 seconds lagged.")
            error.setdefault("host", "10.64.16.41")
            error.setdefault("lag", 6.2)
            error.setdefault("type", "db")
            headers.setdefault("Retry-After", "5")
            headers.setdefault("X-Database-Lag", "6")
        else:
            error.setdefault("info", "An API error occurred.")
        error.setdefault(
            "docref",
            "See https://en.wikipedia.org/w/api.php for API usage. Subscribe to the "
            "mediawiki-api-announce mailing list at "
            "&lt;https://lists.wikimedia.org/postorius/lists/mediawiki-api-announce.lists.wikimedia.org/&gt; "
            "for notice of API deprecations and breaking changes.",
        )
        return _json_response(response.get("status", 200), {"error": error, "servedby": "mw1376"}, headers)
    results = response.get("results") or []
    if not results:
        payload: dict[str, object] = {"batchcomplete": True}
        if "warnings" in response:
            payload["warnings"] = response["warnings"]
        return _json_response(response.get("status", 200), payload, headers)
    exchars = int(request.url.params.get("exchars", "1200"))
    pages: list[tuple[int, dict[str, object]]] = []  # (page id, page)
    for rank, result in enumerate(results, start=1):
        title = result["title"]
        extract = result["text"]
        if extract is not None and len(extract) > exchars:
            extract = extract[:exchars].rstrip() + "…"
        url = result.get("url") or wikipedia_url(title)
        pageid = _stable_int(title, 6)
        pages.append((pageid, {
            "pageid": pageid,
            "ns": 0,
            "title": title,
            "index": rank,
            **({"extract": extract} if extract is not None else {}),
            "contentmodel": "wikitext",
            "pagelanguage": "en",
            "pagelanguagehtmlcode": "en",
            "pagelanguagedir": "ltr",
            "touched": "2026-01-15T08:00:00Z",
            "lastrevid": _stable_int(title + "#rev", 8),
            "length": 1000 + len(result["text"] or "") * 7,
            "fullurl": url,
            "editurl": url.replace("/wiki/", "/w/index.php?title=") + "&action=edit",
            "canonicalurl": url,
        }))
    pages.sort(key=lambda page: page[0])  # the API lists pages by id, not by rank
    payload = {
        "batchcomplete": True,
        "continue": {"gsroffset": len(results), "continue": "gsroffset||"},
        "query": {"pages": [page for _, page in pages]},
    }
    if "warnings" in response:
        payload["warnings"] = response["warnings"]
    return _json_response(response.get("status", 200), payload, headers)


def _highlight(text: str, query: str) -> str:
    for word in query.split():
        if len(word) >= 2:
            found = re.search(re.escape(word), text, flags=re.IGNORECASE)
            if found:
                return text[: found.start()] + "<em>" + found.group(0) + "</em>" + text[found.end() :]
    return text


def render_zhihu(response: ScriptedResponse, query: str, headers: dict[str, str]) -> httpx.Response:
    status = response.get("status", 200)
    if "code" in response:
        code = int(response["code"])
        message = response.get("message", ZHIHU_MESSAGES.get(code, "error"))
        return _json_response(status, {"Code": code, "Message": message, "Data": None}, headers)
    if not response.get("results") and "empty_as" in response:
        data: object = {
            "items_null": {"HasMore": False, "Items": None},
            "data_null": None,
            "items_missing": {"HasMore": False},
        }[response["empty_as"]]
        return _json_response(status, {"Code": 0, "Message": "success", "Data": data}, headers)
    items = []
    for rank, result in enumerate(response.get("results") or []):
        content_id = str(1_900_000_000_000_000_000 + _stable_int(result["title"], 12))
        items.append(
            {
                "Title": result["title"],
                "ContentType": result.get("type", "Answer"),
                "ContentID": content_id,
                "ContentText": _highlight(cast(str, result["text"]), query),  # only Wikipedia has null texts
                "Url": result.get("url")
                or f"https://www.zhihu.com/answer/{content_id}?utm_medium=openapi_platform&utm_source=6d23634e",
                "CommentCount": 3 + rank,
                "VoteUpCount": 120 - 10 * rank,
                "AuthorName": result.get("author", "知乎用户"),
                "AuthorAvatar": "https://picx.zhimg.com/v2-placeholder_l.jpg",
                "AuthorBadge": "",
                "AuthorBadgeText": "",
                "EditTime": 1767225600 - 86400 * rank,
                "AuthorityLevel": str(2 + (rank % 3)),
            }
        )
    payload = {"Code": 0, "Message": "success", "Data": {"HasMore": False, "Items": items}}
    return _json_response(status, payload, headers)


def _sse(event: str, data: Mapping[str, object]) -> str:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


def evidence_text(results: Sequence[ScriptedResult]) -> str:
    return "\n\n".join(
        f"[{n}] Source: {r['title']}\nEvidence: {r['text']}" for n, r in enumerate(results, start=1)
    )


def _text_block(index: int, text: str, *, cited: ScriptedResult | None = None) -> list[str]:
    """A text content block streamed in 48-character deltas (with a citation when given)."""
    block: dict[str, object] = {"type": "text", "text": ""}
    if cited is not None:
        block["citations"] = []
    events = [_sse("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})]
    if cited is not None:
        citation = {
            "type": "web_search_result_location",
            "cited_text": text[:150],
            "url": cited.get("url") or wikipedia_url(cited["title"]),
            "title": cited["title"],
            "encrypted_index": "RW5jcnlwdGVkSW5kZXg=",
        }
        events.append(
            _sse(
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": {"type": "citations_delta",
                                                                          "citation": citation}},
            )
        )
    for start in range(0, len(text), 48):
        events.append(
            _sse(
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta",
                                                                          "text": text[start : start + 48]}},
            )
        )
    return events


def _stop(index: int) -> str:
    return _sse("content_block_stop", {"type": "content_block_stop", "index": index})


def _ping() -> str:
    return _sse("ping", {"type": "ping"})


def _thinking_block(index: int, thinking: str) -> list[str]:
    return [
        _sse(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": {"type": "thinking", "thinking": "",
                                                                              "signature": ""}},
        ),
        _sse(
            "content_block_delta",
            {"type": "content_block_delta", "index": index, "delta": {"type": "thinking_delta", "thinking": thinking}},
        ),
        _sse(
            "content_block_delta",
            {"type": "content_block_delta", "index": index, "delta": {"type": "signature_delta",
                                                                      "signature": "U2lnbmF0dXJl"}},
        ),
        _stop(index),
    ]


def _search_blocks(index: int, query: str, search: int, results: Sequence[ScriptedResult],
                   error: str | None) -> list[str]:
    """The server_tool_use block of one web search and its result block."""
    tool_id = f"srvtoolu_{_stable_int(query + str(search), 10):010x}"
    events = [
        _sse(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": index,
                "content_block": {"type": "server_tool_use", "id": tool_id, "name": "web_search", "input": {}},
            },
        ),
        _sse(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "input_json_delta", "partial_json": json.dumps({"query": query}, ensure_ascii=False)},
            },
        ),
        _stop(index),
    ]
    content: object
    if error is not None:
        content = {"type": "web_search_tool_result_error", "error_code": error}
    else:
        content = [
            {
                "type": "web_search_result",
                "title": r["title"],
                "url": r.get("url") or wikipedia_url(r["title"]),
                "page_age": None,
                "encrypted_content": "RW5jcnlwdGVkQ29udGVudA==",
            }
            for r in results
        ]
    events.append(
        _sse(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": index + 1,
                "content_block": {"type": "web_search_tool_result", "tool_use_id": tool_id, "content": content},
            },
        )
    )
    events.append(_stop(index + 1))
    return events


def render_deepseek(
    response: ScriptedResponse, query: str, model: str, headers: dict[str, str]
) -> httpx.Response:
    """One evidence call as the Anthropic-compatible stream: message_start, optional thinking
    and pre-search text, the search and its results, the evidence text, usage, message_stop."""
    results = response.get("results") or []
    usage = {**DEFAULT_DEEPSEEK_USAGE, **(response.get("usage") or {})}
    message_id = f"msg_{_stable_int(query, 12):012x}"
    ping = bool(response.get("ping"))
    events = [
        _sse(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": message_id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {
                        "input_tokens": usage["input_tokens"],
                        "cache_read_input_tokens": usage["cache_read_input_tokens"],
                        "output_tokens": 1,
                    },
                },
            },
        )
    ]
    if ping:
        events.append(_ping())
    if "sse_error" in response:
        error = {"type": "api_error", "message": "Internal server error", **response["sse_error"]}
        events.append(_sse("error", {"type": "error", "error": error}))
        return _sse_response(response, events, headers)
    index = 0
    if response.get("thinking"):
        events += _thinking_block(index, str(response["thinking"]))
        index += 1
    if response.get("pre_search_text"):
        events += _text_block(index, str(response["pre_search_text"])) + [_stop(index)]
        index += 1
    for search in range(int(response.get("web_searches", 1))):
        events += _search_blocks(index, query, search, results, response.get("search_error"))
        index += 2
        if ping:
            events.append(_ping())
    text = response.get("evidence_text")
    if text is None:
        text = evidence_text(results) if results else "Insufficient evidence from this search."
    if response.get("citations") and results and response.get("evidence_text") is None:
        # Each item: its label as plain text, the fact in a cited block, then the separator.
        for n, result in enumerate(results, start=1):
            label = f"[{n}] Source: {result['title']}\nEvidence: "
            events += _text_block(index, ("\n\n" if n > 1 else "") + label) + [_stop(index)]
            events += _text_block(index + 1, str(result["text"]), cited=result) + [_stop(index + 1)]
            index += 2
        last = index - 1
        events.pop()  # the last block's stop is sent with the message end below
    else:
        events += _text_block(index, text)
        last = index
    if not response.get("truncate"):
        events.append(_stop(last))
        events.append(
            _sse(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": usage["output_tokens"]},
                },
            )
        )
        events.append(_sse("message_stop", {"type": "message_stop"}))
    return _sse_response(response, events, headers)


def _sse_response(response: ScriptedResponse, events: list[str], headers: dict[str, str]) -> httpx.Response:
    return httpx.Response(
        response.get("status", 200),
        headers={"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache", **headers},
        content="".join(events).encode(),
    )


def render_retriever(response: ScriptedResponse, headers: dict[str, str]) -> httpx.Response:
    hits = []
    for rank, result in enumerate(response.get("results") or []):
        hits.append(
            {
                "document": {
                    "id": str(_stable_int(result["title"], 7)),
                    "contents": f'"{result["title"]}"\n{result["text"]}',
                },
                "score": result.get("score", round(0.9 - 0.05 * rank, 4)),
            }
        )
    return _json_response(response.get("status", 200), {"result": [hits]}, headers)


# --------------------------------------------------------------------------- pages (open_page)

PAGE_BACKENDS = ("wikipedia", "retriever")
PAGE_KEYS = {"title", "paragraphs", "revision", "responses"}
PAGE_FAULT_KEYS = COMMON_KEYS - {"results"}
RETRIEVER_PAGE_FIELDS = {"page", "offset", "window"}


def check_page_script(backend: str, page: Mapping[str, object], where: str) -> None:
    """Reject a page script the fakes cannot serve exactly (names the key at fault)."""
    if backend not in PAGE_BACKENDS:
        raise ValueError(f"{where}: {backend} has no pages (only {', '.join(PAGE_BACKENDS)} do)")
    if not isinstance(page, Mapping):
        raise ValueError(f"{where}: a page script must be an object")
    unknown = sorted(set(page) - PAGE_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(PAGE_KEYS)}")
    paragraphs = page.get("paragraphs")
    if paragraphs is not None:
        if not isinstance(paragraphs, list) or not paragraphs:
            raise ValueError(f"{where}: 'paragraphs' must be a non-empty list of strings, or null (no such page)")
        for n, text in enumerate(paragraphs):
            if not isinstance(text, str) or not text or " ".join(text.split()) != text or len(text) > CONTENT_LIMIT:
                raise ValueError(f"{where}: paragraphs[{n}] must be one line of single-spaced text, at most "
                                 f"{CONTENT_LIMIT} characters")
    if "title" in page and (not isinstance(page["title"], str) or not page["title"].strip()):
        raise ValueError(f"{where}: 'title' must be a non-blank string")
    if "revision" in page:
        if backend != "wikipedia":
            raise ValueError(f"{where}: 'revision' is Wikipedia's")
        if isinstance(page["revision"], bool) or not isinstance(page["revision"], int) or page["revision"] < 1:
            raise ValueError(f"{where}: 'revision' must be a positive integer")
    responses = page.get("responses", [])
    if not isinstance(responses, list):
        raise ValueError(f"{where}: 'responses' must be a list")
    for n, response in enumerate(responses):
        if not isinstance(response, Mapping):
            raise ValueError(f"{where}: responses[{n}] must be an object")
        check_response_spec(backend, response, f"{where} responses[{n}]")
        if "results" in response:
            raise ValueError(f"{where}: responses[{n}]: a page answers with its paragraphs, not 'results' "
                             "(use {} for the page's own answer)")


def page_title(name: str, page: PageScript) -> str:
    """The title a page script's page has (a Wikipedia name normalised as the wiki does)."""
    return str(page.get("title") or wiki_normalised(name))


def page_revision(name: str, page: PageScript) -> int:
    """The revision a scripted Wikipedia page is read at."""
    return int(page.get("revision") or _stable_int(page_title(name, page) + "#rev", 8))


def wiki_normalised(name: str) -> str:
    """A title as MediaWiki normalises it: underscores read as spaces, the first letter upper case."""
    title = " ".join(name.replace("_", " ").split())
    return title[:1].upper() + title[1:]


def _check_user_agent(request: httpx.Request) -> None:
    agent = request.headers.get("user-agent", "")
    _require(
        "(" in agent and not agent.startswith("python-httpx"),
        f"wikipedia: non-descriptive User-Agent {agent!r}",
    )


def _check_flags(params: httpx.QueryParams, *flags: str) -> None:
    for flag in flags:
        value = params.get(flag)
        _require(
            value is None or value.lower() not in {"false", "0", "no", ""},
            f"wikipedia: boolean {flag}={value!r} would be read as TRUE; leave it out instead",
        )


def wikipedia_page_request(request: httpx.Request) -> tuple[str, str] | None:
    """``("resolve", title)`` or ``("parse", oldid)`` for an ``open_page`` request (checked
    against the documented parameters), ``None`` for any other request."""
    params = request.url.params
    action = params.get("action")
    resolving = action == "query" and "generator" not in params and "revisions" in params.get("prop", "").split("|")
    if action != "parse" and not resolving:
        return None
    _require(request.method == "GET", f"wikipedia: expected GET, got {request.method}")
    _require(request.url.path.endswith("/api.php"), f"wikipedia: expected .../api.php, got {request.url.path}")
    for key, value in {"format": "json", "formatversion": "2"}.items():
        _require(params.get(key) == value, f"wikipedia: {key} must be {value!r}, got {params.get(key)!r}")
    _check_user_agent(request)
    if resolving:
        _check_flags(params, "redirects")
        titles = params.get("titles", "")
        _require(bool(titles) and "|" not in titles, f"wikipedia: titles must name one page, got {titles!r}")
        _require("ids" in params.get("rvprop", "").split("|"), "wikipedia: rvprop must include ids")
        if "rvstart" in params:
            _require(params.get("rvlimit") == "1" and params.get("rvdir") == "older",
                     "wikipedia: rvstart without rvlimit=1 and rvdir=older does not name one revision")
        return "resolve", titles
    _check_flags(params, "disableeditsection", "disablelimitreport")
    _require(params.get("oldid", "").isdigit(), f"wikipedia: oldid must be a revision id, got {params.get('oldid')!r}")
    _require(not {"page", "pageid", "text", "title"} & set(params), "wikipedia: oldid with page, pageid, text or title")
    _require("text" in params.get("prop", "").split("|"), "wikipedia: prop must include text")
    return "parse", params["oldid"]


def retriever_page_request(request: httpx.Request) -> tuple[str, int, int] | None:
    """``(page, offset, window)`` of a ``POST /page`` (checked as ``retriever serve`` checks
    it), ``None`` for any other request."""
    if not request.url.path.endswith("/page"):
        return None
    _require(request.method == "POST", f"retriever: expected POST, got {request.method}")
    body = json.loads(request.content)
    _require(isinstance(body, dict) and not set(body) - RETRIEVER_PAGE_FIELDS,
             f"retriever: /page takes {sorted(RETRIEVER_PAGE_FIELDS)}")
    page, offset, window = body.get("page"), body.get("offset", 0), body.get("window", 4)
    _require(isinstance(page, str) and bool(page.strip()), "retriever: page must be a non-blank string")
    _require(isinstance(offset, int) and not isinstance(offset, bool) and offset >= 0,
             "retriever: offset must be an int >= 0")
    _require(isinstance(window, int) and not isinstance(window, bool) and 1 <= window <= 100,
             "retriever: window must be an int from 1 to 100")
    return page, offset, window


def page_html(title: str, paragraphs: Sequence[str]) -> str:
    """A revision's parsed HTML as ``action=parse`` gives it: the scripted paragraphs among what a
    reader skips (a hidden short description, TemplateStyles, a hatnote, an infobox with a
    paragraph of its own, an empty paragraph, headings, citation markers, the reference list)."""
    escaped = html.escape(title)
    parts = [
        '<div class="mw-content-ltr mw-parser-output" lang="en" dir="ltr">',
        '<div class="shortdescription nomobile noexcerpt noprint searchaux" style="display:none">'
        f"Article about {escaped}</div>",
        '<style data-mw-deduplicate="TemplateStyles:r1236090951">.mw-parser-output .hatnote'
        "{font-style:italic}</style>",
        f'<div role="note" class="hatnote navigation-not-searchable">For other uses, see '
        f'<a href="/wiki/{quote(title.replace(" ", "_"))}_(disambiguation)">{escaped} (disambiguation)</a>.</div>',
        f'<table class="infobox"><tbody><tr><th colspan="2" class="infobox-above">{escaped}</th></tr>'
        "<tr><td colspan=\"2\"><p>Infobox caption, not a paragraph of the article.</p></td></tr></tbody></table>",
        '<p class="mw-empty-elt">\n</p>',
    ]
    for n, text in enumerate(paragraphs):
        if n and n % 2 == 0:
            parts.append(f'<div class="mw-heading mw-heading2"><h2 id="Section_{n // 2}">Section {n // 2}</h2></div>')
        before, found, after = text.partition(title) if n == 0 else (text, "", "")
        body = html.escape(before) + (f"<b>{escaped}</b>" if found else "") + html.escape(after)  # a lead's bold title
        marker = (f'<sup id="cite_ref-{n + 1}" class="reference"><a href="#cite_note-{n + 1}">'
                  f'<span class="cite-bracket">[</span>{n + 1}<span class="cite-bracket">]</span></a></sup>')
        parts.append(f"<p>{body}{marker}\n</p>")
    parts.append('<div class="reflist"><ol class="references">'
                 + "".join(f'<li id="cite_note-{n + 1}"><span class="reference-text">Source {n + 1}.</span></li>'
                           for n in range(len(paragraphs)))
                 + "</ol></div></div>")
    return "\n".join(parts)


def render_wikipedia_revision(name: str, page: PageScript, request: httpx.Request,
                              headers: dict[str, str]) -> httpx.Response:
    """The ``prop=revisions`` answer for the title ``name`` (normalised, redirected, or missing)."""
    normalised = wiki_normalised(name)
    query: dict[str, object] = {}
    if normalised != name:
        query["normalized"] = [{"fromencoded": False, "from": name, "to": normalised}]
    if page.get("paragraphs") is None:
        query["pages"] = [{"ns": 0, "title": normalised, "missing": True}]
    else:
        title = page_title(name, page)
        if title != normalised:
            query["redirects"] = [{"from": normalised, "to": title}]
        revision = page_revision(name, page)
        timestamp = request.url.params.get("rvstart") or "2026-01-15T08:00:00Z"
        query["pages"] = [{"pageid": _stable_int(title, 6), "ns": 0, "title": title,
                           "revisions": [{"revid": revision, "parentid": revision - 1 - _stable_int(title, 3),
                                          "timestamp": timestamp}]}]
    return _json_response(200, {"batchcomplete": True, "query": query}, headers)


def render_wikipedia_parse(name: str, page: PageScript, headers: dict[str, str]) -> httpx.Response:
    """The ``action=parse`` answer for a scripted page's revision."""
    title = page_title(name, page)
    paragraphs = page["paragraphs"]
    assert paragraphs is not None, "a page without paragraphs has no revision to parse"
    parsed = {"title": title, "pageid": _stable_int(title, 6), "revid": page_revision(name, page),
              "text": page_html(title, paragraphs)}
    return _json_response(200, {"parse": parsed}, headers)


def render_retriever_page(name: str, page: PageScript, offset: int, window: int,
                          headers: dict[str, str]) -> httpx.Response:
    """The ``POST /page`` answer: the passages from ``offset`` on, at most ``window``, and the total."""
    passages = page.get("paragraphs") or []
    title = str(page.get("title") or name)
    first = _stable_int(title, 7)
    result = [{"id": str(first + k), "contents": f'"{title}"\n{passages[k]}'}
              for k in range(offset, min(len(passages), offset + window))]
    return _json_response(200, {"result": result, "total": len(passages)}, headers)


# --------------------------------------------------------------------------- the service

QUERY_EXTRACTORS = {
    "wikipedia": wikipedia_query,
    "zhihu": zhihu_query,
    "deepseek": deepseek_query,
    "retriever": retriever_query,
}


class FakeSearchService:
    """Answers requests for one backend from a script ``{query: [response, ...]}``."""

    def __init__(self, backend: str, script: Mapping[str, Sequence[ScriptedResponse]],
                 pages: Mapping[str, PageScript] | None = None) -> None:
        if backend not in QUERY_EXTRACTORS:
            raise ValueError(f"no fake service for backend {backend!r}")
        self.backend = backend
        self._queues: dict[str, deque[ScriptedResponse]] = {}
        for query, responses in script.items():
            for n, response in enumerate(responses):
                check_response_spec(backend, response, f"query {query!r} response {n}")
            self._queues[normalise_query(query)] = deque(responses)
        self._pages: dict[str, PageScript] = {}
        self._page_queues: dict[str, deque[ScriptedResponse]] = {}
        self._revisions: dict[str, str] = {}  # a Wikipedia revision id -> the page read at it
        for name, page in (pages or {}).items():
            check_page_script(backend, page, f"page {name!r}")
            key = normalise_query(name)
            self._pages[key] = page
            self._page_queues[key] = deque(page.get("responses") or [])
            if backend == "wikipedia" and page.get("paragraphs") is not None:
                self._revisions[str(page_revision(key, page))] = key
        self.requests: list[httpx.Request] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.backend in PAGE_BACKENDS:
            answer = self._page_answer(request)
            if answer is not None:
                return answer
        query = QUERY_EXTRACTORS[self.backend](request)
        queue = self._queues.get(normalise_query(query))
        if queue is None:
            raise ScriptExhausted(f"{self.backend} fake: no script for query {query!r}")
        if not queue:
            raise ScriptExhausted(f"{self.backend} fake: more requests than scripted responses for {query!r}")
        response = queue.popleft()
        return self.render(response, request, query)

    def render(self, response: ScriptedResponse, request: httpx.Request, query: str) -> httpx.Response:
        return self._compressed(response, self._render(response, request, query))

    def _page_answer(self, request: httpx.Request) -> httpx.Response | None:
        """The answer to an ``open_page`` request (``None``: not one): the page's next scripted
        response, or its own answer."""
        offset = window = 0
        if self.backend == "wikipedia":
            found = wikipedia_page_request(request)
            if found is None:
                return None
            kind, name = found
            key = self._revisions.get(name) if kind == "parse" else normalise_query(name)
        else:
            read = retriever_page_request(request)
            if read is None:
                return None
            kind, (name, offset, window) = "read", read
            key = normalise_query(name)
        if key is None:  # a revision no scripted page has: the API's own error
            error: ApiError = {"code": "nosuchrevid", "info": f"There is no revision with ID {name}."}
            return self.render({"api_error": error}, request, name)
        if key not in self._pages:
            raise ScriptExhausted(f"{self.backend} fake: no script for page {name!r}")
        queue = self._page_queues[key]
        response: ScriptedResponse = queue.popleft() if queue else {}
        return self._compressed(response, self._render_page(response, request, kind, key, offset, window))

    def _render_page(self, response: ScriptedResponse, request: httpx.Request, kind: str, key: str,
                     offset: int, window: int) -> httpx.Response:
        headers, status, raw = _scripted_headers(response)
        if raw is not None:
            return raw
        if "api_error" in response:
            return render_wikipedia(response, request, headers)
        if status == 404 and self.backend == "retriever":  # FastAPI's answer for a route it lacks
            return _json_response(404, {"detail": "Not Found"}, headers)
        if status != 200:
            return self._error_page(status, headers)
        page = self._pages[key]
        if kind == "resolve":
            return render_wikipedia_revision(request.url.params["titles"], page, request, headers)
        if kind == "parse":
            return render_wikipedia_parse(key, page, headers)
        return render_retriever_page(key, page, offset, window, headers)

    def _compressed(self, response: ScriptedResponse, rendered: httpx.Response) -> httpx.Response:
        if not response.get("gzip"):
            return rendered
        body = gzip.compress(rendered.content, mtime=0)  # mtime=0: the same bytes every build
        headers = {k: v for k, v in rendered.headers.items() if k.lower() != "content-length"}
        return httpx.Response(
            rendered.status_code, headers={**headers, "Content-Encoding": "gzip"}, content=body
        )

    def _render(self, response: ScriptedResponse, request: httpx.Request, query: str) -> httpx.Response:
        headers, status, raw = _scripted_headers(response)
        if raw is not None:
            return raw
        if status != 200 and not response.get("results") and not set(response) & BACKEND_KEYS[self.backend]:
            return self._error_page(status, headers)
        if self.backend == "wikipedia":
            return render_wikipedia(response, request, headers)
        if self.backend == "zhihu":
            return render_zhihu(response, query, headers)
        if self.backend == "deepseek":
            return render_deepseek(response, query, json.loads(request.content).get("model", ""), headers)
        return render_retriever(response, headers)

    def _error_page(self, status: int, headers: dict[str, str]) -> httpx.Response:
        reason = httpx.codes.get_reason_phrase(status) or "Error"
        if self.backend == "deepseek":
            kind = "rate_limit_error" if status == 429 else "api_error"
            return _json_response(
                status, {"type": "error", "error": {"type": kind, "message": reason}}, headers
            )
        if self.backend == "zhihu" and status not in (502, 503, 504):
            code = {429: 30001, 401: 20001, 403: 20001}.get(status, 90001 if status >= 500 else 10001)
            return _json_response(
                status, {"Code": code, "Message": ZHIHU_MESSAGES.get(code, reason), "Data": None}, headers
            )
        if self.backend == "wikipedia" and status == 403:
            return httpx.Response(
                status,
                headers={"content-type": "text/plain; charset=utf-8", **headers},
                content=WIKIMEDIA_UA_REFUSAL.encode(),
            )
        page = (
            f"<!DOCTYPE html><html><head><title>{status} {reason}</title></head>"
            f"<body><h1>{reason}</h1></body></html>"
        )
        return httpx.Response(
            status, headers={"content-type": "text/html; charset=utf-8", **headers}, content=page.encode()
        )

    def unused(self) -> dict[str, int]:
        """Queries (and ``open_page NAME``) whose scripted responses were not all requested
        (script and client disagree)."""
        return {**{query: len(queue) for query, queue in self._queues.items() if queue},
                **{f"open_page {name}": len(queue) for name, queue in self._page_queues.items() if queue}}
