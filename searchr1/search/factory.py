"""``create_search_backend(name, ...)``: one entry point for the four backends.

Per-backend defaults (concurrency, per-read timeout in seconds): deepseek 16/60,
wikipedia 3/15, zhihu 1/15, retriever 32/30, local 64/30 (``local`` is BM25 in this process
over an index directory: ``index=`` or ``$SEARCHR1_INDEX``). The wall-clock limit of one request
(``total_timeout``) defaults to the per-read timeout, except DeepSeek's 300 s: its evidence
stream may keep sending for longer than 60 s. Keys are resolved here, at construction, from
explicit arguments, then the environment, then the ``.env`` file; a missing key raises
:class:`~searchr1.search.env.MissingApiKeyError` naming the variable and the file.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, Unpack

import httpx

from searchr1.search import deepseek, retriever, wikipedia, zhihu
from searchr1.search.base import HttpSearchBackend
from searchr1.search.cache import QueryCache
from searchr1.search.clock import Clock
from searchr1.search.limits import Backoff, StartRateLimiter
from searchr1.search.deepseek import DeepSeekSearchBackend
from searchr1.search.env import coerce_keys, lookup, require_keys
from searchr1.search.local import INDEX_ENV, LocalSearchBackend
from searchr1.search.retriever import RetrieverSearchBackend
from searchr1.basics.secrets import Secret
from searchr1.search.wikipedia import WikipediaSearchBackend
from searchr1.search.zhihu import ZhihuSearchBackend
from searchr1.basics import invocation

if TYPE_CHECKING:
    from searchr1.bm25.index import BM25Index

BACKENDS: dict[str, type[HttpSearchBackend]] = {
    "deepseek": DeepSeekSearchBackend,
    "wikipedia": WikipediaSearchBackend,
    "zhihu": ZhihuSearchBackend,
    "retriever": RetrieverSearchBackend,
    "local": LocalSearchBackend,
}
BACKEND_NAMES = tuple(BACKENDS)
# The backends that speak HTTP to a service: the ones cassettes record and replay.
HTTP_BACKEND_NAMES = ("deepseek", "wikipedia", "zhihu", "retriever")
DEFAULT_CONCURRENCY = {"deepseek": 16, "wikipedia": 3, "zhihu": 1, "retriever": 32, "local": 64}
DEFAULT_TIMEOUT = {"deepseek": 60.0, "wikipedia": 15.0, "zhihu": 15.0, "retriever": 30.0, "local": 30.0}
KEY_ENV_VARS = {"deepseek": deepseek.KEY_ENV_VARS, "zhihu": zhihu.KEY_ENV_VARS}
RETRIEVER_URL_ENV = "SEARCHR1_RETRIEVER_URL"


class BackendSettings(TypedDict, total=False):
    """The options of the backends given as values (not objects of the wiring): the pipeline's, then
    each backend's own (which one takes which: its class's ``__init__``)."""

    max_retries: int
    total_timeout: float | None
    deadline: float | None
    max_retry_after: float
    max_body_bytes: int
    remember: bool
    api_key: Secret | str | None  # deepseek, retriever
    keys: str | Secret | Sequence[str | Secret]  # zhihu
    base_url: str  # deepseek, zhihu
    model: str  # deepseek
    tool_type: str
    max_tokens: int
    max_uses: int
    max_line_bytes: int
    api_url: str  # wikipedia
    contact: str | None
    maxlag: int | None
    rate_limit_per_minute: float
    limit: int
    exchars: int
    count: int  # zhihu
    search_db: str
    default_cooldown: float
    url: str | None  # retriever
    topk: int  # retriever, local
    source: str
    index: str | os.PathLike[str] | BM25Index | None  # local
    max_batch: int


class FactoryOptions(BackendSettings, total=False):
    """What :func:`create_search_backend` passes to the backend class: the settings, and the wiring."""

    client: httpx.AsyncClient | None
    transport: httpx.AsyncBaseTransport | None
    clock: Clock | None
    cache: QueryCache | None
    backoff: Backoff | None
    limiter: StartRateLimiter | None  # wikipedia
    wall_clock: Callable[[], float]  # zhihu


class SearchSettings(BackendSettings, total=False):
    """What a backend built from the flags or a cassette is given: the settings, the concurrency and
    timeout (``None``: the backend's default), a cache and a backoff."""

    concurrency: int | None
    timeout: float | None
    cache: QueryCache | None
    backoff: Backoff | None


def check_backend_name(name: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f"unknown search backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}")
    return name


def resolve_concurrency(name: str, value: int | None) -> int:
    check_backend_name(name)
    if value is None:
        return DEFAULT_CONCURRENCY[name]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"search concurrency must be an integer >= 1, got {value!r}")
    return value


def resolve_timeout(name: str, value: float | None) -> float:
    check_backend_name(name)
    if value is None:
        return DEFAULT_TIMEOUT[name]
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"search timeout must be > 0 seconds, got {value!r}")
    return float(value)


def create_search_backend(
    name: str,
    *,
    concurrency: int | None = None,
    timeout: float | None = None,
    env_file: str | Path | None = None,
    **options: Unpack[FactoryOptions],
) -> HttpSearchBackend:
    """Build a backend. ``options`` go to the backend class: common ones are ``cache``
    (a :class:`~searchr1.search.cache.QueryCache`), ``clock``, ``transport``/``client``,
    ``max_retries``, ``total_timeout``, ``deadline``; backend ones e.g. ``model``/``tool_type`` (deepseek),
    ``contact``/``api_url``/``rate_limit_per_minute`` (wikipedia), ``keys`` (zhihu),
    ``api_key`` (deepseek; retriever: optional, else ``$SEARCHR1_RETRIEVER_API_KEY``), ``url`` (retriever),
    ``index``/``topk`` (local)."""
    cls = BACKENDS[check_backend_name(name)]
    accepted = _accepted_options(cls)
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise TypeError(
            f"search backend {name!r} does not take option(s) {', '.join(unknown)}; "
            f"it takes {', '.join(sorted(accepted))}"
        )
    if name == "deepseek":
        given = options.pop("api_key", None)
        options["api_key"] = (
            coerce_keys(given, "deepseek api_key")[0]
            if given is not None
            else require_keys(KEY_ENV_VARS["deepseek"], env_file=env_file)[0]
        )
    elif name == "zhihu":
        given_keys = options.pop("keys", None)
        options["keys"] = (
            coerce_keys(given_keys, "zhihu keys")
            if given_keys is not None
            else require_keys(KEY_ENV_VARS["zhihu"], env_file=env_file)
        )
    elif name == "wikipedia" and options.get("contact") is None:
        options["contact"] = lookup((wikipedia.CONTACT_ENV,), env_file=env_file)
    elif name == "retriever":
        if options.get("url") is None:
            options.pop("url", None)
            url = lookup((RETRIEVER_URL_ENV,), env_file=env_file)
            if url:
                options["url"] = url
        if options.get("api_key") is None:
            key = lookup((retriever.KEY_ENV,), env_file=env_file)
            options["api_key"] = Secret(key) if key else None
    elif name == "local" and options.get("index") is None:
        options.pop("index", None)
        directory = lookup((INDEX_ENV,), env_file=env_file)
        if not directory:
            from searchr1.bm25.index import BM25IndexError

            raise BM25IndexError(f"the local backend needs an index: pass --index DIR (or set {INDEX_ENV}); "
                                 f"build one with `{invocation.command('index build CORPUS.jsonl --out DIR')}`")
        options["index"] = directory
    make: Callable[..., HttpSearchBackend] = cls  # the options were checked against its signature above
    return make(
        concurrency=resolve_concurrency(name, concurrency),
        timeout=resolve_timeout(name, timeout),
        **options,
    )


def _accepted_options(cls: type[HttpSearchBackend]) -> set[str]:
    names: set[str] = set()
    for klass in cls.__mro__:
        if "__init__" in vars(klass):
            for parameter in inspect.signature(vars(klass)["__init__"]).parameters.values():
                if parameter.kind is parameter.KEYWORD_ONLY:
                    names.add(parameter.name)
    return names - {"concurrency", "timeout"}
