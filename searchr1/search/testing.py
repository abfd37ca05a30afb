"""Helpers for tests and scripted runs: backends wired to an in-process HTTP handler.

``mock_backend(name, handler)`` builds a real backend whose requests go to ``handler``
(an ``httpx.MockTransport`` handler, sync or async), with virtual time and placeholder keys;
``scripted_backend(name, {query: [response, ...]})`` does the same with the fake service and
the spec vocabulary of :mod:`searchr1.search.fake_service`. No network, no cassette.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import TypeAlias, Unpack

import httpx

from searchr1.search.base import HttpSearchBackend
from searchr1.search.clock import VirtualClock
from searchr1.search.factory import FactoryOptions, create_search_backend
from searchr1.search.fake_service import FakeSearchService, ScriptedResponse
from searchr1.search.limits import Backoff

TEST_DEEPSEEK_KEY = "sk-test-deepseek-key"
TEST_ZHIHU_KEYS = ("test-zhihu-key-1", "test-zhihu-key-2")


class MockOptions(FactoryOptions, total=False):
    """What :func:`mock_backend` passes to the factory over its defaults."""

    concurrency: int | None
    timeout: float | None


# What httpx.MockTransport takes: a function from a request to its response, sync or async.
Handler: TypeAlias = (Callable[[httpx.Request], httpx.Response]
                      | Callable[[httpx.Request], Coroutine[None, None, httpx.Response]])


def mock_backend(name: str, handler: Handler, **options: Unpack[MockOptions]) -> HttpSearchBackend:
    """A real backend talking to ``handler``; ``options`` override the test defaults."""
    settings: MockOptions = {
        "clock": VirtualClock(),
        "backoff": Backoff(rng=random.Random(0)),
        "transport": httpx.MockTransport(handler),
    }
    if name == "deepseek":
        settings["api_key"] = TEST_DEEPSEEK_KEY
    elif name == "zhihu":
        settings["keys"] = TEST_ZHIHU_KEYS[:1]
    elif name == "wikipedia":
        settings["contact"] = "tests@searchr1.invalid"
    settings.update(options)
    return create_search_backend(name, **settings)


def scripted_backend(
    name: str, script: Mapping[str, Sequence[ScriptedResponse]], **options: Unpack[MockOptions]
) -> tuple[HttpSearchBackend, FakeSearchService]:
    """A real backend served by the fake service from ``script`` (see the spec vocabulary)."""
    service = FakeSearchService(name, script)
    return mock_backend(name, service.handler, **options), service
