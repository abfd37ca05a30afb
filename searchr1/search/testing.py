"""Helpers for tests and scripted runs: backends wired to an in-process HTTP handler.

``mock_backend(name, handler)`` builds a real backend whose requests go to ``handler``
(an ``httpx.MockTransport`` handler, sync or async), with virtual time and placeholder keys;
``scripted_backend(name, {query: [response, ...]})`` does the same with the fake service and
the spec vocabulary of :mod:`searchr1.search.fake_service`. No network, no cassette.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from searchr1.search.base import HttpSearchBackend
from searchr1.search.clock import VirtualClock
from searchr1.search.factory import create_search_backend
from searchr1.search.fake_service import FakeSearchService
from searchr1.search.limits import Backoff

TEST_DEEPSEEK_KEY = "sk-test-deepseek-key"
TEST_ZHIHU_KEYS = ("test-zhihu-key-1", "test-zhihu-key-2")


def mock_backend(name: str, handler: Callable[[httpx.Request], Any], **options: Any) -> HttpSearchBackend:
    """A real backend talking to ``handler``; ``options`` override the test defaults."""
    settings: dict[str, Any] = {
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
    name: str, script: Mapping[str, Sequence[Mapping[str, Any]]], **options: Any
) -> tuple[HttpSearchBackend, FakeSearchService]:
    """A real backend served by the fake service from ``script`` (see the spec vocabulary)."""
    service = FakeSearchService(name, script)
    return mock_backend(name, service.handler, **options), service
