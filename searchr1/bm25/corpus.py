"""Reading a retrieval corpus: JSONL rows ``{"id": ..., "contents": "\\"Title\\"\\ntext"}``
(the wiki-18 format of the Search-R1 release), one at a time.

:func:`iter_corpus` streams the file (never holding it whole) and hashes it on the way, so an
index can record which corpus it was built from. A row that is not such an object, or one
longer than :data:`MAX_PASSAGE_BYTES`, stops the read with :class:`CorpusError` naming the file
and the line (the rules of every JSON file we read: ``searchr1.basics.jsonl``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from searchr1.core.errors import UserError
from searchr1.basics.jsonl import JsonLines, decode_json

# One passage's row, at most. A wiki-18 passage is about 100 words (under 1 KiB); a longer row
# is not a passage and would cost its size several times over while it is tokenized and indexed.
MAX_PASSAGE_BYTES = 1024 * 1024


class CorpusError(UserError, ValueError):
    """A corpus row is malformed; the message names the file and the line."""


@dataclass(frozen=True)
class Passage:
    line: int
    id: str
    contents: str


class CorpusReader:
    """Iterate the passages of ``path``; afterwards ``sha256``, ``rows`` and ``bytes_read``
    describe what was read (the hash is of the whole file once iteration finished)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise CorpusError(f"corpus {self.path} does not exist or is not a file")
        self.size = self.path.stat().st_size
        self.rows = 0
        self._hash = hashlib.sha256()
        self._lines = JsonLines(self.path, error=CorpusError, max_line_bytes=MAX_PASSAGE_BYTES, digest=self._hash)
        self.finished = False

    @property
    def bytes_read(self) -> int:
        return self._lines.bytes_read

    @property
    def sha256(self) -> str:
        if not self.finished:
            raise RuntimeError("the corpus hash is known only after the whole file was read")
        return self._hash.hexdigest()

    def __iter__(self) -> Iterator[Passage]:
        for number, row in self._lines:
            passage = passage_of(row, f"{self.path}:{number}", number)
            self.rows += 1
            yield passage
        if self.rows == 0:
            raise CorpusError(f"corpus {self.path} holds no passages")
        self.finished = True


def parse_row(raw: bytes, line: int, path: Path | str = "<corpus>") -> Passage:
    """One row as a :class:`Passage`; :class:`CorpusError` says what is wrong with it."""
    where = f"{path}:{line}"
    if len(raw) > MAX_PASSAGE_BYTES:
        raise CorpusError(f"{where}: the row is longer than {MAX_PASSAGE_BYTES // (1024 * 1024)} MiB, "
                          "the most one passage may hold")
    return passage_of(decode_json(raw, where=where, error=CorpusError), where, line)


def passage_of(row: object, where: str, line: int) -> Passage:
    """A decoded row as a :class:`Passage`; :class:`CorpusError` says what is wrong with it."""
    if not isinstance(row, dict):
        raise CorpusError(f"{where}: expected a JSON object with 'id' and 'contents', got {type(row).__name__}")
    contents = row.get("contents")
    if not isinstance(contents, str):
        raise CorpusError(f"{where}: missing string field 'contents'")
    if not contents.strip():
        raise CorpusError(f"{where}: 'contents' is empty")
    ident = row.get("id")
    if isinstance(ident, bool) or not isinstance(ident, (str, int)) or ident == "":
        raise CorpusError(f"{where}: missing field 'id' (a string or an integer)")
    return Passage(line=line, id=str(ident), contents=contents)


def split_contents(contents: str) -> tuple[str, str]:
    """``(title, text)`` of a passage's contents: the first line (quotes dropped) and the rest."""
    first, _, rest = contents.strip().partition("\n")
    title = first.strip()
    if len(title) >= 2 and title[0] == title[-1] == '"':
        title = title[1:-1].strip()
    return title, rest.strip()


def passage_row(ident: str, title: str, text: str) -> str:
    """One corpus line in the wiki-18 layout (title quoted on the first line)."""
    return json.dumps({"id": ident, "contents": f'"{title}"\n{text}'}, ensure_ascii=False) + "\n"
