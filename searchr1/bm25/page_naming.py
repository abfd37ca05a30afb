"""What an ``open_page`` call asks of a corpus: the page it names (:func:`page_name`), where it
starts reading (:func:`page_offset`) and how many passages it gets at most (:data:`PAGE_WINDOW`);
and, in an index, every passage of the page it names (:func:`page_passages`).

Every page backend reads a call the same way: the local one (:mod:`searchr1.search.pages`), the
Wikipedia and retriever ones (:mod:`searchr1.search.wikipedia_pages`,
:mod:`searchr1.search.retriever_pages`) and ``retriever serve``'s ``POST /page``
(:mod:`searchr1.bm25.server`).
"""

from __future__ import annotations

from collections.abc import Mapping

from searchr1.bm25.corpus import split_contents
from searchr1.bm25.index import BM25Index, Hit
from searchr1.core.types import JsonValue

PAGE_WINDOW = 4  # passages one call returns at most (about 400 words of wiki-18)


def page_name(text: str) -> str:
    """The page a call names, as the model wrote it: trimmed, one pair of quotes dropped."""
    name = text.strip()
    if len(name) >= 2 and name[0] == name[-1] == '"':
        name = name[1:-1].strip()
    return name


def page_offset(arguments: Mapping[str, JsonValue]) -> int:
    """The passages a call skips: its ``offset`` when that is a positive whole number, else 0."""
    offset = arguments.get("offset", 0)
    return offset if isinstance(offset, int) and not isinstance(offset, bool) and offset > 0 else 0


def page_passages(index: BM25Index, name: str) -> list[Hit]:
    """Every passage of the page ``name`` names in ``index``: a passage id's page, else the page
    of that title."""
    by_id = index.passage_of_id(name)
    return index.page(split_contents(by_id.contents)[0] if by_id is not None else name)
