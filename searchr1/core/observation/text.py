"""How a tool's result becomes the text of the tool message (the lab port's layout for search results)."""

from __future__ import annotations

from searchr1.core.tools import DECLARED, SEARCH
from searchr1.core.types import SearchItem, SearchResult


def format_item(item: SearchItem, index: int) -> str:
    """One numbered item, in the lab port's layout.

    Evidence items (no source and no url, as DeepSeek returns) use ``Source:``/``Evidence:``;
    everything else uses ``Title:``/``Content:`` plus ``Id:`` (the passage id ``open_page``
    accepts), ``Source:`` and ``URL:`` lines when known.
    """
    if item.source is None and item.url is None:
        return f"[{index}] Source: {item.title}\n    Evidence: {item.content}"
    lines = [f"[{index}] Title: {item.title}"] + [f"    Id: {item.ident}"] * bool(item.ident)
    lines.append(f"    Content: {item.content}")
    if item.source:
        lines.append(f"    Source: {item.source}")
    if item.url:
        lines.append(f"    URL: {item.url}")
    return "\n".join(lines)


NO_RESULTS_TEXT = SEARCH.nothing


def error_text(result: SearchResult, tool: str = SEARCH.name) -> str:
    """The failed call's error under its tool's declared head (``Search error: …``), ``Tool error
    (open_page): …`` for a tool that declares none, ``Tool error: …`` when the call named none."""
    spec = DECLARED.get(tool)
    head = spec.error_head if spec and spec.error_head else f"Tool error ({tool})" if tool else "Tool error"
    return f"{head}: {result.error or 'unknown error'}"


def observation_candidates(result: SearchResult, tool: str = SEARCH.name) -> list[str]:
    """The pieces a tool message is assembled from, in order (items numbered from 1)."""
    if not result.ok:
        return [error_text(result, tool)]
    if not result.items:
        spec = DECLARED.get(tool)
        return [spec.nothing if spec and spec.nothing else f"{tool} returned nothing."]
    return [format_item(item, i) for i, item in enumerate(result.items, start=1)]


def format_observation(result: SearchResult) -> str:
    """The whole tool-message text for a result (items joined by a blank line)."""
    return "\n\n".join(observation_candidates(result))
