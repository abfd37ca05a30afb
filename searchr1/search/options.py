"""The search settings of a command (:class:`SearchOptions`, each field declared once) and the
backend they make (:func:`build_search_backend`: a replayed one when ``cassette`` is given).
The click flags are made from these declarations in :mod:`searchr1.commands.search_options`."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Unpack

from searchr1.core.settings import check_settings, setting
from searchr1.search.base import HttpSearchBackend
from searchr1.search.cache import QueryCache
from searchr1.search.factory import BACKEND_NAMES, BackendSettings, SearchSettings, create_search_backend
from searchr1.search.replay import ReplayBackend, open_replay_backend
from searchr1.basics import invocation

DEFAULT_CACHE_PATH = Path("runs/search-cache.sqlite")
log = logging.getLogger("searchr1.search")


@dataclass(frozen=True)
class SearchOptions:
    """The search flags of a command. Each field is declared once (:mod:`searchr1.core.settings`);
    ``@search_options()`` (:mod:`searchr1.commands.search_options`) makes the flags
    from these lines."""

    backend: str = setting(flag="--search-backend", aliases=("--backend",), choices=BACKEND_NAMES,
                           help="Search backend.")
    concurrency: int | None = setting(
        None, flag="--search-concurrency", above=0, help="Requests in flight at once.",
        default_text="deepseek 16, wikipedia 3, zhihu 1, retriever 32, local 64")
    timeout: float | None = setting(
        None, flag="--search-timeout", above=0, help="Per-read timeout in seconds (connect, each read, each write).",
        default_text="deepseek 60, wikipedia 15, zhihu 15, retriever 30, local 30")
    model: str | None = setting(None, flag="--search-model", help="DeepSeek model name.",
                                default_text="deepseek-v4-flash")
    tool_type: str | None = setting(None, flag="--search-tool-type", help="DeepSeek web-search tool type.",
                                    default_text="web_search_20260209")
    cache: str = setting(str(DEFAULT_CACHE_PATH), flag="--search-cache", metavar="PATH|off",
                         help="Persistent SQLite query cache (successes only), or 'off'. Ignored with --cassette.")
    cache_ttl_hours: float | None = setting(None, flag="--search-cache-ttl", above=0, metavar="HOURS",
                                            help="Ignore cache entries older than this.")
    cassette: Path | None = setting(
        None, help="Replay search from this cassette (offline, virtual time) instead of the live service.")
    retriever_url: str | None = setting(None, repr=False, help="Search-R1 retrieval server URL.",
                                        default_text="$SEARCHR1_RETRIEVER_URL or http://127.0.0.1:8000/retrieve")
    wikipedia_contact: str | None = setting(None, repr=False,
                                            help="Contact (URL or e-mail) for the Wikipedia User-Agent.",
                                            default_text="$SEARCHR1_CONTACT")
    env_file: Path | None = setting(None, flag="--search-env-file",
                                    help="dotenv file with DEEPSEEK_API_KEY / ZHIHU_SEARCH_KEYS.",
                                    default_text="./.env")
    total_timeout: float | None = setting(
        None, flag="--search-total-timeout", above=0,
        help="Wall-clock limit of one search request, a whole streamed answer included; the error says which "
             "limit fired.", default_text="deepseek 300; others: the per-read timeout")

    index: str | None = setting(
        None, flag="--index", metavar="DIR",
        help=f"With --backend local: the BM25 index directory (`{invocation.PROGRAM} index build`).",
        default_text="$SEARCHR1_INDEX; offline: the shipped corpus's index")
    topk: int | None = setting(None, flag="--search-topk", at_least=1, at_most=100,
                               help="Passages per search for the local and retriever backends.", default_text="3")

    def __post_init__(self) -> None:
        check_settings(self)

    @property
    def cache_enabled(self) -> bool:
        return self.cache.strip().lower() != "off" and self.cassette is None


def backend_specific_options(options: SearchOptions) -> BackendSettings:
    """The flags that apply to the chosen backend (unset ones left out)."""
    extra: BackendSettings = {}
    if options.backend == "deepseek":
        if options.model:
            extra["model"] = options.model
        if options.tool_type:
            extra["tool_type"] = options.tool_type
    elif options.backend == "retriever" and options.retriever_url:
        extra["url"] = options.retriever_url
    elif options.backend == "local" and options.index is not None:
        extra["index"] = Path(options.index)
    if options.backend in ("retriever", "local") and options.topk is not None:
        extra["topk"] = options.topk
    elif options.backend == "wikipedia" and options.wikipedia_contact:
        extra["contact"] = options.wikipedia_contact
    return extra


def build_search_backend(options: SearchOptions,
                         **overrides: Unpack[SearchSettings]) -> HttpSearchBackend | ReplayBackend:
    """A backend from the flags: replayed from ``--cassette`` (no cache, virtual time), or live
    with the persistent cache unless ``--search-cache off``. ``overrides`` go to the factory."""
    settings: SearchSettings = {**backend_specific_options(options), **overrides}
    if options.concurrency is not None:
        settings["concurrency"] = options.concurrency
    if options.timeout is not None:
        settings["timeout"] = options.timeout
    if options.total_timeout is not None:
        settings["total_timeout"] = options.total_timeout
    if options.cassette is not None:
        return open_replay_backend(options.backend, options.cassette, **settings)
    if options.cache_enabled:
        ttl = options.cache_ttl_hours * 3600.0 if options.cache_ttl_hours else None
        settings.setdefault("cache", QueryCache(Path(options.cache), ttl_seconds=ttl))
    backend = create_search_backend(options.backend, env_file=options.env_file, **settings)
    if options.backend == "wikipedia" and getattr(backend, "contact", None) is None:
        log.warning(
            "wikipedia: no contact in the User-Agent (set --wikipedia-contact or SEARCHR1_CONTACT); "
            "Wikimedia may refuse anonymous clients"
        )
    return backend
