"""Pages of an indexed corpus: the passages of one article, in corpus order, found by title or by id.

A wiki-18 passage is a 100-word piece of a Wikipedia article, and every piece carries the
article's title on its first line (``"Title"\\ntext``, :func:`~searchr1.bm25.corpus.split_contents`).
``open_page`` reads an article back as those pieces. At 21M passages a lookup must not scan the
corpus, so an index holds two key tables, written when it is built:

* ``pages/titles.keys.npy`` / ``pages/titles.rows.npy``: every passage's title key, sorted, with
  the passage's row beside it (rows ascending within a key, so a page's passages come in corpus
  order);
* ``pages/ids.keys.npy`` / ``pages/ids.rows.npy``: the same for passage ids.

A key is the first 8 bytes of the BLAKE2b digest of the text in UTF-8, read as an unsigned 64-bit
integer. A lookup is a binary search over the memory-mapped keys; the passages it finds are then
compared by their real title (or id), so two texts that share a key never mix. Each table costs
16 bytes a passage: about 0.34 GB each for wiki-18's 21,015,324 passages.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

TABLES = ("titles", "ids")
TABLE_FILES = tuple(f"pages/{table}.{part}.npy" for table in TABLES for part in ("keys", "rows"))


def text_key(text: str) -> int:
    """The 64-bit key of ``text`` (the first 8 bytes of its BLAKE2b digest, little-endian)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def text_keys(texts: Iterable[str]) -> np.ndarray:
    """The keys of ``texts``, in order, as ``uint64``."""
    return np.fromiter((text_key(text) for text in texts), dtype=np.uint64)


def sorted_table(keys_by_shard: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``(keys, rows)``: the keys of every passage (shard after shard, so the position is the
    row) sorted, and each one's row; equal keys keep their rows ascending."""
    keys = np.concatenate(keys_by_shard) if keys_by_shard else np.zeros(0, np.uint64)
    rows = np.argsort(keys, kind="stable").astype(np.int64)
    return keys[rows], rows


class KeyTable:
    """A sorted key table read back memory-mapped: :meth:`rows_of` gives the rows whose key is
    that of a text, ascending (callers compare the real text: a key may be shared)."""

    def __init__(self, keys: np.ndarray, rows: np.ndarray) -> None:
        self.keys = keys
        self.rows = rows

    def rows_of(self, text: str) -> np.ndarray:
        key = np.uint64(text_key(text))
        start = int(np.searchsorted(self.keys, key, side="left"))
        end = int(np.searchsorted(self.keys, key, side="right"))
        return np.asarray(self.rows[start:end])


def table_paths(directory: Path, table: str) -> tuple[Path, Path]:
    return directory / "pages" / f"{table}.keys.npy", directory / "pages" / f"{table}.rows.npy"
