"""Zhihu backend: the open platform's global search, with a pool of keys.

``GET /api/v1/content/global_search?Query=…&Count=3&SearchDB=all`` with
``Authorization: Bearer <key>`` and ``X-Request-Timestamp``. Keys come from
``ZHIHU_SEARCH_KEYS`` (several, comma separated; also read from ``.env``) and are used round
robin. A success without hits may carry ``"Items": null`` or ``"Data": null``: that is zero
items, not a schema error. Rate limits arrive as HTTP 429 *or* as HTTP 200 with body ``Code`` 30001: that key
cools down (for the server's ``Retry-After`` if any) and the call moves to the next key.
``Code`` 30002 (daily quota spent) and rejected keys (401/403/20001) disable the key for the
rest of the run. When every key is out, the result says so.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Unpack

import httpx

from searchr1.search.base import (
    BackendOptions,
    CallContext,
    HttpSearchBackend,
    Outcome,
    PayloadError,
    ResponseTooLarge,
    check_url,
    http_status_outcome,
    read_json,
    truncate,
)
from searchr1.search.clock import Clock
from searchr1.search.limits import parse_retry_after
from searchr1.basics.secrets import Secret, redact_url, sanitise_error, url_secrets
from searchr1.core.types import SearchItem

log = logging.getLogger("searchr1.search")

DEFAULT_BASE_URL = "https://developer.zhihu.com"
SEARCH_PATH = "/api/v1/content/global_search"
QUOTA_PATH = "/api/v1/quota"
KEY_ENV_VARS = ("ZHIHU_SEARCH_KEYS", "ZHIHU_SEARCH_KEY", "ZHIHU_ACCESS_SECRET")
DEFAULT_COOLDOWN = 1.0  # seconds; 30001 is a per-second limit

CODE_OK = 0
CODE_BAD_PARAMS = 10001
CODE_AUTH = 20001
CODE_RATE_LIMIT = 30001
CODE_QUOTA = 30002
CODE_INTERNAL = 90001

_EM_TAGS = re.compile(r"</?em>", re.IGNORECASE)


class KeyPool:
    """Round-robin keys with per-key cool-down and permanent disabling (shared by all calls)."""

    def __init__(self, keys: Sequence[Secret], clock: Clock) -> None:
        if not keys:
            raise ValueError("zhihu: the key pool needs at least one key")
        self._keys = tuple(keys)
        self._clock = clock
        self._cooling_until = [float("-inf")] * len(self._keys)
        self._disabled: dict[int, str] = {}
        self._cursor = 0

    def __len__(self) -> int:
        return len(self._keys)

    def _usable(self, index: int) -> bool:
        return index not in self._disabled and self._cooling_until[index] <= self._clock.now()

    def acquire(self) -> tuple[int, Secret] | None:
        """The next usable key after the last one handed out, or ``None``."""
        for step in range(len(self._keys)):
            index = (self._cursor + step) % len(self._keys)
            if self._usable(index):
                self._cursor = index + 1
                return index, self._keys[index]
        return None

    def has_usable(self) -> bool:
        return any(self._usable(i) for i in range(len(self._keys)))

    def cool_down(self, index: int, seconds: float) -> None:
        self._cooling_until[index] = max(self._cooling_until[index], self._clock.now() + seconds)

    def disable(self, index: int, reason: str) -> None:
        if index not in self._disabled:
            self._disabled[index] = reason
            log.warning("zhihu: key #%d disabled for this run (%s)", index + 1, reason)

    def all_disabled(self) -> bool:
        return len(self._disabled) == len(self._keys)

    def seconds_until_usable(self) -> float | None:
        """How long until a cooling key is usable again (``None`` if all are disabled)."""
        waits = [
            self._cooling_until[i] - self._clock.now()
            for i in range(len(self._keys))
            if i not in self._disabled
        ]
        return max(0.0, min(waits)) if waits else None

    @property
    def keys(self) -> tuple[Secret, ...]:
        return self._keys

    def __repr__(self) -> str:
        return f"KeyPool(keys={len(self._keys)}, disabled={len(self._disabled)})"


def parse_zhihu_items(items: object, *, limit: int = 3) -> tuple[SearchItem, ...]:
    """Map ``Data.Items`` to search items (``<em>`` highlight tags removed); ``null`` or a
    missing list is zero items (the service's way of saying "no hits")."""
    if items is None:
        return ()
    if not isinstance(items, list):
        raise PayloadError("Data.Items is not a list")
    out: list[SearchItem] = []
    for position, item in enumerate(items):
        if not isinstance(item, dict):
            raise PayloadError(f"Data.Items[{position}] is not an object")
        text = item.get("ContentText") or ""
        if not isinstance(text, str):
            raise PayloadError(f"Data.Items[{position}].ContentText is not a string")
        content = truncate(_EM_TAGS.sub("", text))
        if not content:
            continue
        title = item.get("Title")
        title = _EM_TAGS.sub("", title).strip() if isinstance(title, str) else ""
        author = item.get("AuthorName")
        source = str(item.get("ContentType") or "Zhihu")
        if isinstance(author, str) and author.strip():
            source = f"{source} / {author.strip()}"
        url = item.get("Url")
        out.append(
            SearchItem(
                title=title or "Untitled",
                content=content,
                source=source,
                url=url if isinstance(url, str) and url else None,
            )
        )
    return tuple(out[:limit])


def body_code(payload: object) -> tuple[int, str]:
    """``(Code, Message)`` of a response envelope."""
    if not isinstance(payload, dict):
        raise PayloadError(f"top level is {type(payload).__name__}, expected an object")
    code = payload.get("Code")
    if isinstance(code, str) and code.strip().lstrip("-").isdigit():
        code = int(code)
    if not isinstance(code, int) or isinstance(code, bool):
        raise PayloadError("Code is missing or not an integer")
    return code, str(payload.get("Message") or "")


@dataclass(frozen=True)
class QuotaRow:
    api_id: str
    api_name: str
    total: int | None
    used: int | None
    remaining: int | None


@dataclass(frozen=True)
class KeyQuota:
    """The quota of one key (``rows``), or why it could not be read (``error``)."""

    key_number: int  # 1-based position in ZHIHU_SEARCH_KEYS
    fingerprint: str  # a short hash, to tell keys apart without showing them
    rows: tuple[QuotaRow, ...] = ()
    error: str | None = None


def parse_quota_payload(payload: object) -> tuple[QuotaRow, ...]:
    code, _message = body_code(payload)
    if code != CODE_OK:
        raise PayloadError(f"Code {code}")
    data = payload.get("Data") if isinstance(payload, dict) else None  # body_code saw an object
    if not isinstance(data, list):
        raise PayloadError("Data is not a list")

    def number(value: object) -> int | None:
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    rows = []
    for entry in data:
        if not isinstance(entry, dict):
            raise PayloadError("Data entry is not an object")
        rows.append(
            QuotaRow(
                api_id=str(entry.get("APIID", "")),
                api_name=str(entry.get("APIName", "")),
                total=number(entry.get("TotalQuota")),
                used=number(entry.get("TotalUsed")),
                remaining=number(entry.get("RemainingQuota")),
            )
        )
    return tuple(rows)


class ZhihuSearchBackend(HttpSearchBackend):
    name = "zhihu"
    failover_metric = True

    def __init__(
        self,
        *,
        keys: Sequence[Secret | str],
        base_url: str = DEFAULT_BASE_URL,
        count: int = 3,
        search_db: str = "all",
        concurrency: int = 1,
        timeout: float = 15.0,
        default_cooldown: float = DEFAULT_COOLDOWN,
        wall_clock: Callable[[], float] = time.time,
        **kwargs: Unpack[BackendOptions],
    ) -> None:
        super().__init__(concurrency=concurrency, timeout=timeout, **kwargs)
        if not 1 <= count <= 20:
            raise ValueError(f"zhihu: count must be 1..20, got {count}")
        if search_db not in ("all", "realtime", "static"):
            raise ValueError(f"zhihu: search_db must be all, realtime or static, got {search_db!r}")
        self.base_url = check_url(base_url, "zhihu base_url").rstrip("/")
        self.count = count
        self.search_db = search_db
        self.default_cooldown = default_cooldown
        self.pool = KeyPool([k if isinstance(k, Secret) else Secret(k) for k in keys], self.clock)
        self._wall_clock = wall_clock

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, keys={len(self.pool)})"

    def secrets(self) -> tuple[Secret, ...]:
        return (*self.pool.keys, *url_secrets(self.base_url))

    def request_params(self) -> dict[str, object]:
        return {"base_url": redact_url(self.base_url), "count": self.count, "search_db": self.search_db}

    def replay_options(self) -> dict[str, object]:
        return {**super().replay_options(), **self.request_params()}

    def _max_failovers(self) -> int:
        return len(self.pool)

    def _headers(self, key: Secret) -> dict[str, str]:
        return {
            "Authorization": f"Bearer {key.reveal()}",
            "X-Request-Timestamp": str(int(self._wall_clock())),
            "Content-Type": "application/json",
        }

    def _key_out(self, outcome: Outcome) -> Outcome:
        """A key just became unusable: fail over if another key is usable, else wait/give up."""
        if self.pool.has_usable():
            outcome.failover = True
            return outcome
        if self.pool.all_disabled():
            return Outcome.fail("all Zhihu keys exhausted (quota spent or key rejected)", 429)
        wait = self.pool.seconds_until_usable()
        retry_after = wait if outcome.retry_after is None else max(wait or 0.0, outcome.retry_after)
        return Outcome.retry(
            outcome.error or "all Zhihu keys rate limited",
            429,
            retry_after=retry_after,
            rate_limited=outcome.rate_limited,
        )

    async def _attempt(self, ctx: CallContext) -> Outcome:
        picked = self.pool.acquire()
        if picked is None:
            if self.pool.all_disabled():
                return Outcome.fail("all Zhihu keys exhausted (quota spent or key rejected)", 429)
            return Outcome.retry(
                "all Zhihu keys rate limited",
                429,
                retry_after=self.pool.seconds_until_usable(),
                rate_limited=True,
            )
        index, key = picked
        params = {"Query": ctx.query, "Count": str(self.count), "SearchDB": self.search_db}
        url = self.base_url + SEARCH_PATH
        async with self._client.stream("GET", url, params=params, headers=self._headers(key)) as response:
            retry_hint = parse_retry_after(response.headers.get("retry-after"))
            if response.status_code == 429:
                self.pool.cool_down(index, retry_hint if retry_hint is not None else self.default_cooldown)
                return self._key_out(
                    Outcome.retry("HTTP 429 (rate limited)", 429, retry_after=retry_hint, rate_limited=True),
                )
            if response.status_code in (401, 403):
                self.pool.disable(index, f"HTTP {response.status_code}")
                return self._key_out(
                    Outcome.retry(f"HTTP {response.status_code} (key rejected)", response.status_code)
                )
            status = http_status_outcome(response)
            if status is not None:
                return status
            payload = await read_json(response, self.max_body_bytes)
            code, _message = body_code(payload)
            if code == CODE_OK:
                data = payload.get("Data") if isinstance(payload, dict) else None  # body_code saw an object
                if data is None:  # no hits
                    return Outcome.success((), 200)
                if not isinstance(data, dict):
                    raise PayloadError("Data is not an object")
                return Outcome.success(parse_zhihu_items(data.get("Items"), limit=self.count), 200)
            if code == CODE_RATE_LIMIT:
                self.pool.cool_down(index, retry_hint if retry_hint is not None else self.default_cooldown)
                return self._key_out(
                    Outcome.retry(
                        "Zhihu code 30001 (rate limited)", 200, retry_after=retry_hint, rate_limited=True
                    ),
                )
            if code == CODE_QUOTA:
                self.pool.disable(index, "quota spent (code 30002)")
                return self._key_out(Outcome.retry("Zhihu code 30002 (quota spent)", 200))
            if code == CODE_AUTH:
                self.pool.disable(index, "rejected (code 20001)")
                return self._key_out(Outcome.retry("Zhihu code 20001 (key rejected)", 200))
            if code == CODE_INTERNAL:
                return Outcome.retry("Zhihu code 90001 (server error)", 200)
            if code == CODE_BAD_PARAMS:
                return Outcome.fail("Zhihu code 10001 (bad parameters)", 200)
            return Outcome.fail(f"Zhihu code {code}", 200)

    async def quota(self, api_ids: Sequence[str] = ("global_search", "zhihu_search")) -> list[KeyQuota]:
        """The remaining quota of every key (this endpoint does not consume quota)."""
        out: list[KeyQuota] = []
        for number, key in enumerate(self.pool.keys, start=1):
            try:
                async with self._semaphore, self._client.stream(
                    "GET", self.base_url + QUOTA_PATH, params={"APIIDs": ",".join(api_ids)},
                    headers=self._headers(key),
                ) as response:
                    if response.status_code != 200:
                        out.append(KeyQuota(number, key.fingerprint(), error=f"HTTP {response.status_code}"))
                        continue
                    payload = await read_json(response, self.max_body_bytes)  # capped like a search answer
                rows = parse_quota_payload(payload)
                out.append(KeyQuota(number, key.fingerprint(), rows=rows))
            except ResponseTooLarge as exc:
                error = f"answer over the {self.max_body_bytes}-byte limit ({exc.args[0] if exc.args else '?'} bytes)"
                out.append(KeyQuota(number, key.fingerprint(), error=error))
            except ValueError as exc:  # PayloadError, invalid JSON
                error = sanitise_error(f"unexpected response: {exc}", self.secrets())
                out.append(KeyQuota(number, key.fingerprint(), error=error))
            except (httpx.HTTPError, OSError) as exc:
                out.append(KeyQuota(number, key.fingerprint(), error=f"network error ({type(exc).__name__})"))
        return out
