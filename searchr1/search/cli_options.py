"""Click options shared by every command that searches (train, eval, demo, record).

``@search_options()`` adds the flags below and hands the command one ``search`` argument, a
:class:`SearchOptions`; ``build_search_backend(search)`` turns it into a backend (a replayed
one when ``--cassette`` is given). Example::

    @click.command()
    @search_options(default_backend="wikipedia")
    def eval(search: SearchOptions, ...):
        backend = build_search_backend(search)
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from searchr1.search.base import HttpSearchBackend
from searchr1.search.cache import QueryCache
from searchr1.search.factory import BACKEND_NAMES, create_search_backend
from searchr1.search.replay import ReplayBackend, open_replay_backend

DEFAULT_CACHE_PATH = Path("runs/search-cache.sqlite")
log = logging.getLogger("searchr1.search")
OPTION_NAMES = (
    "search_backend",
    "search_concurrency",
    "search_timeout",
    "search_total_timeout",
    "search_model",
    "search_tool_type",
    "search_cache",
    "search_cache_ttl",
    "cassette",
    "retriever_url",
    "wikipedia_contact",
    "search_env_file",
)


@dataclass(frozen=True)
class SearchOptions:
    backend: str
    concurrency: int | None = None
    timeout: float | None = None
    model: str | None = None
    tool_type: str | None = None
    cache: str = str(DEFAULT_CACHE_PATH)  # a path, or "off"
    cache_ttl_hours: float | None = None
    cassette: Path | None = None
    retriever_url: str | None = None
    wikipedia_contact: str | None = None
    env_file: Path | None = None
    total_timeout: float | None = None

    @property
    def cache_enabled(self) -> bool:
        return self.cache.strip().lower() != "off" and self.cassette is None


def _positive() -> Callable[[click.Context, click.Parameter, Any], Any]:
    def check(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is not None and value <= 0:
            raise click.BadParameter(f"must be > 0, got {value}")
        return value

    return check


def search_options(default_backend: str = "wikipedia", *, backend_alias: bool = True):
    """Decorator adding the search flags; the command receives ``search: SearchOptions``."""
    names = ["--search-backend", "--backend"] if backend_alias else ["--search-backend"]
    options = [
        click.option(
            *names,
            "search_backend",
            type=click.Choice(BACKEND_NAMES),
            default=default_backend,
            show_default=True,
            help="Search backend.",
        ),
        click.option(
            "--search-concurrency",
            type=int,
            default=None,
            callback=_positive(),
            help="Requests in flight at once [default: deepseek 16, wikipedia 3, zhihu 1, retriever 32].",
        ),
        click.option(
            "--search-timeout",
            type=float,
            default=None,
            callback=_positive(),
            help="Per-read timeout in seconds (connect, each read, each write) "
            "[default: deepseek 60, wikipedia 15, zhihu 15, retriever 30].",
        ),
        click.option(
            "--search-total-timeout",
            type=float,
            default=None,
            callback=_positive(),
            help="Wall-clock limit of one search request, a whole streamed answer included; the "
            "error says which limit fired [default: deepseek 300; others: the per-read timeout].",
        ),
        click.option(
            "--search-model", default=None, help="DeepSeek model name [default: deepseek-v4-flash]."
        ),
        click.option(
            "--search-tool-type",
            default=None,
            help="DeepSeek web-search tool type [default: web_search_20260209].",
        ),
        click.option(
            "--search-cache",
            default=str(DEFAULT_CACHE_PATH),
            show_default=True,
            metavar="PATH|off",
            help="Persistent SQLite query cache (successes only), or 'off'. Ignored with --cassette.",
        ),
        click.option(
            "--search-cache-ttl",
            "search_cache_ttl",
            type=float,
            default=None,
            callback=_positive(),
            metavar="HOURS",
            help="Ignore cache entries older than this.",
        ),
        click.option(
            "--cassette",
            type=click.Path(dir_okay=False, path_type=Path),
            default=None,
            help="Replay search from this cassette (offline, virtual time) instead of the live service.",
        ),
        click.option(
            "--retriever-url",
            default=None,
            help="Search-R1 retrieval server URL [default: $SEARCHR1_RETRIEVER_URL or http://127.0.0.1:8000/retrieve].",
        ),
        click.option(
            "--wikipedia-contact",
            default=None,
            help="Contact (URL or e-mail) for the Wikipedia User-Agent [default: $SEARCHR1_CONTACT].",
        ),
        click.option(
            "--search-env-file",
            type=click.Path(dir_okay=False, path_type=Path),
            default=None,
            help="dotenv file with DEEPSEEK_API_KEY / ZHIHU_SEARCH_KEYS [default: ./.env].",
        ),
    ]

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            kwargs["search"] = options_from_kwargs(kwargs)
            return command(*args, **kwargs)

        for option in reversed(options):
            wrapper = option(wrapper)
        return wrapper

    return decorate


def options_from_kwargs(kwargs: dict[str, Any]) -> SearchOptions:
    """Pop the search flags out of a command's kwargs."""
    values = {name: kwargs.pop(name) for name in OPTION_NAMES}
    return SearchOptions(
        backend=values["search_backend"],
        concurrency=values["search_concurrency"],
        timeout=values["search_timeout"],
        total_timeout=values["search_total_timeout"],
        model=values["search_model"],
        tool_type=values["search_tool_type"],
        cache=values["search_cache"],
        cache_ttl_hours=values["search_cache_ttl"],
        cassette=values["cassette"],
        retriever_url=values["retriever_url"],
        wikipedia_contact=values["wikipedia_contact"],
        env_file=values["search_env_file"],
    )


def backend_specific_options(options: SearchOptions) -> dict[str, Any]:
    """The flags that apply to the chosen backend (unset ones left out)."""
    extra: dict[str, Any] = {}
    if options.backend == "deepseek":
        if options.model:
            extra["model"] = options.model
        if options.tool_type:
            extra["tool_type"] = options.tool_type
    elif options.backend == "retriever" and options.retriever_url:
        extra["url"] = options.retriever_url
    elif options.backend == "wikipedia" and options.wikipedia_contact:
        extra["contact"] = options.wikipedia_contact
    return extra


def build_search_backend(options: SearchOptions, **overrides: Any) -> HttpSearchBackend | ReplayBackend:
    """A backend from the flags: replayed from ``--cassette`` (no cache, virtual time), or live
    with the persistent cache unless ``--search-cache off``. ``overrides`` go to the factory."""
    settings: dict[str, Any] = {**backend_specific_options(options), **overrides}
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
