"""The search tool: a search backend (one query in, one result out) runs the declared ``search``
tool, as any other tool's backend runs its calls (:class:`~searchr1.core.tools.ToolBackend`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from searchr1.core.tools import SEARCH, ToolBackend, ToolCall, shown_call
from searchr1.core.types import SearchResult


@runtime_checkable
class SearchBackend(Protocol):
    """What every search backend is (:mod:`searchr1.search`): a name, and a query's result."""

    @property
    def name(self) -> str: ...

    async def search(self, query: str) -> SearchResult: ...


@dataclass(frozen=True)
class SearchTool:
    """The ``search`` tool run by ``backend``: a call's query, stripped, is the backend's query."""

    backend: SearchBackend

    async def call(self, call: ToolCall) -> SearchResult:
        return await self.backend.search(shown_call(call))


def with_search(backend: SearchBackend, tools: Mapping[str, ToolBackend] | None = None) -> dict[str, ToolBackend]:
    """The backend of every declared tool of a rollout: search by ``backend``, the others by ``tools``."""
    return {SEARCH.name: SearchTool(backend), **(tools or {})}
