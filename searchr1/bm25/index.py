"""A BM25 index over a passage corpus, built with bm25s (+ PyStemmer) and read back memory-mapped.

An index directory holds:

* ``bm25/``: the bm25s score matrix and vocabulary (``BM25.save``),
* ``docs.bin`` / ``docs.offsets.npy``: every passage's ``contents`` (UTF-8), back to back,
* ``ids.bin`` / ``ids.offsets.npy``: every passage's ``id``,
* ``manifest.json``, written last: the format, the corpus (path, sha256, rows), the
  tokenizer (pattern, lowercasing, stopwords, stemmer and its version), the scorer (method,
  k1, b), the library versions and the build's duration.

:func:`build_index` streams the corpus once (only token ids are held per passage, never the
texts), builds in a hidden staging directory beside ``out`` and renames it into place only
when complete; on any error or interruption the staging directory is removed. A directory
without a readable manifest is never opened (:func:`open_index` says why), so a build killed
outright leaves nothing that ``--backend local`` would accept.
"""

from __future__ import annotations

import array
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from searchr1.core.errors import UserError
from searchr1.run.fileio import write_json_atomically
from searchr1.bm25.corpus import CorpusError, CorpusReader
from searchr1.run.jsonl import read_json_document

FORMAT = "searchr1-bm25-index"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
# The tokenizer and scorer. k1=0.9, b=0.4 are pyserini's (Lucene) defaults, which Search-R1's
# BM25 baseline uses; "lucene" is Lucene's BM25 idf and length normalisation.
TOKEN_PATTERN = r"(?u)\b\w\w+\b"
STOPWORDS = "en"
STEMMER_LANGUAGE = "english"
METHOD = "lucene"
K1 = 0.9
B = 0.4


class BM25IndexError(UserError, ValueError):
    """An index directory cannot be built or opened; the message names it and says why."""




@dataclass(frozen=True)
class Hit:
    """One retrieved passage: its row in the index, corpus id, contents and BM25 score."""

    row: int
    id: str
    contents: str
    score: float


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "unknown"


def make_tokenizer() -> Any:
    import bm25s
    import Stemmer

    return bm25s.tokenization.Tokenizer(
        lower=True, splitter=TOKEN_PATTERN, stopwords=STOPWORDS, stemmer=Stemmer.Stemmer(STEMMER_LANGUAGE)
    )


def tokenizer_description() -> dict[str, Any]:
    return {"pattern": TOKEN_PATTERN, "lowercase": True, "stopwords": STOPWORDS,
            "stemmer": f"PyStemmer {STEMMER_LANGUAGE} (Snowball)", "pystemmer_version": _version("PyStemmer")}


class _Blob:
    """Strings appended to a file back to back, with their byte offsets."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle = path.open("wb")
        self.offsets = array.array("q", [0])

    def add(self, text: str) -> None:
        data = text.encode("utf-8")
        self._handle.write(data)
        self.offsets.append(self.offsets[-1] + len(data))

    def close(self) -> None:
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._handle.close()
        np.save(self.path.with_suffix(".offsets.npy"), np.frombuffer(self.offsets, dtype=np.int64))


Progress = Callable[[int, int, int], None]  # (bytes read, total bytes, rows)


def build_index(corpus: str | os.PathLike[str], out: str | os.PathLike[str], *, overwrite: bool = False,
                progress: Progress | None = None, progress_every: int = 10_000) -> dict[str, Any]:
    """Build the index of ``corpus`` into the directory ``out``; returns the manifest.

    Refuses an existing ``out`` unless ``overwrite``. Corpus errors raise
    :class:`~searchr1.bm25.corpus.CorpusError` (file and line) and leave nothing behind."""
    import bm25s

    out = Path(out)
    reader = CorpusReader(corpus)
    if out.exists() and not overwrite:
        raise BM25IndexError(f"{out} already exists; pass --overwrite to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    started = time.perf_counter()
    try:
        tokenizer = make_tokenizer()
        docs, ids = _Blob(staging / "docs.bin"), _Blob(staging / "ids.bin")
        token_ids: list[array.array] = []
        tokens = 0
        for passage in reader:
            (ids_of_doc,) = tokenizer.streaming_tokenize([passage.contents])
            token_ids.append(array.array("i", ids_of_doc))
            tokens += len(ids_of_doc)
            docs.add(passage.contents)
            ids.add(passage.id)
            if progress is not None and reader.rows % progress_every == 0:
                progress(reader.bytes_read, reader.size, reader.rows)
        docs.close()
        ids.close()
        if progress is not None:
            progress(reader.bytes_read, reader.size, reader.rows)
        tokenized_seconds = time.perf_counter() - started
        retriever = bm25s.BM25(method=METHOD, k1=K1, b=B)
        retriever.index((token_ids, tokenizer.get_vocab_dict()), show_progress=False)
        del token_ids
        retriever.save(str(staging / "bm25"))
        _fsync_tree(staging)  # every file is on disk before the manifest says the index is whole
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "corpus": {"path": str(Path(corpus)), "sha256": reader.sha256, "rows": reader.rows,
                       "bytes": reader.bytes_read},
            "tokenizer": tokenizer_description(),
            "scorer": {"library": "bm25s", "version": _version("bm25s"), "method": METHOD, "k1": K1, "b": B},
            "tokens": tokens,
            "vocabulary": len(retriever.vocab_dict),
            "build_seconds": round(time.perf_counter() - started, 3),
            "tokenize_seconds": round(tokenized_seconds, 3),
        }
        write_json_atomically(staging / MANIFEST_NAME, manifest)
        _move_into_place(staging, out)
        return manifest
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _fsync_tree(directory: Path) -> None:
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())


def _move_into_place(staging: Path, out: Path) -> None:
    """Rename the finished ``staging`` to ``out``. An old ``out`` is renamed aside first and
    removed after: ``out`` is the old index, briefly absent, or the new one, never a mix."""
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}-{time.monotonic_ns()}"
        os.rename(out, old)
    os.rename(staging, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    directory = Path(directory)
    if not directory.is_dir():
        raise BM25IndexError(f"index {directory} does not exist; build one with "
                          f"`python cli.py index build CORPUS.jsonl --out {directory}`")
    path = directory / MANIFEST_NAME
    if not path.is_file():
        raise BM25IndexError(f"index {directory} has no {MANIFEST_NAME}: not a finished index "
                          "(an interrupted build?); build it again with `python cli.py index build`")
    try:
        manifest = read_json_document(path, error=BM25IndexError)
    except OSError as error:
        raise BM25IndexError(f"index {directory}: unreadable {MANIFEST_NAME} ({error.strerror or error})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BM25IndexError(f"index {directory}: {MANIFEST_NAME} is not a searchr1 BM25 index manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise BM25IndexError(f"index {directory}: format version {manifest.get('format_version')!r}, this "
                          f"searchr1 reads {FORMAT_VERSION}; rebuild it with `python cli.py index build`")
    corpus = manifest.get("corpus")
    rows = corpus.get("rows") if isinstance(corpus, dict) else None
    broken = ("corpus.rows" if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0 else
              "corpus.sha256" if not isinstance(corpus.get("sha256"), str) else
              next((name for name in ("tokenizer", "scorer") if not isinstance(manifest.get(name), dict)), None))
    if broken:
        raise BM25IndexError(f"index {directory}: {MANIFEST_NAME} has no valid {broken}; rebuild it with "
                             "`python cli.py index build`")
    return manifest


class _Strings:
    """Read-only strings from a blob and its offsets (memory-mapped)."""

    def __init__(self, path: Path) -> None:
        self.offsets = np.load(path.with_suffix(".offsets.npy"), mmap_mode="r")
        self.data = np.memmap(path, dtype=np.uint8, mode="r") if path.stat().st_size else np.zeros(0, np.uint8)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, row: int) -> str:
        start, end = int(self.offsets[row]), int(self.offsets[row + 1])
        return self.data[start:end].tobytes().decode("utf-8")


class BM25Index:
    """An opened index: ``search(queries, k)`` gives each query's hits, best first (ties by row).
    Read-only, so concurrent readers are safe; a batch shares one tokenizer and one call."""

    def __init__(self, directory: str | os.PathLike[str], *, mmap: bool = True) -> None:
        import bm25s

        self.directory = Path(directory)
        self.manifest = read_manifest(self.directory)
        rows = int(self.manifest["corpus"]["rows"])
        try:
            self._retriever = bm25s.BM25.load(str(self.directory / "bm25"), mmap=mmap)
            self._docs = _Strings(self.directory / "docs.bin")
            self._ids = _Strings(self.directory / "ids.bin")
        except (OSError, ValueError, KeyError) as error:
            raise BM25IndexError(f"index {self.directory}: damaged ({type(error).__name__}: {error}); "
                              "build it again") from None
        if len(self._docs) != rows or len(self._ids) != rows:
            raise BM25IndexError(f"index {self.directory}: holds {len(self._docs)} passages, its manifest "
                              f"says {rows}; build it again")
        self.rows = rows
        self._tokenizer_settings = self.manifest["tokenizer"]
        if self._tokenizer_settings.get("pattern") != TOKEN_PATTERN:
            raise BM25IndexError(f"index {self.directory}: built with another tokenizer; rebuild it")

    def __len__(self) -> int:
        return self.rows

    def query_terms(self, queries: Sequence[str]) -> list[list[str]]:
        """Each query as the index's terms (the corpus tokenizer: lowercase, stopwords, stems)."""
        tokenizer = make_tokenizer()
        return tokenizer.tokenize(list(queries), update_vocab=True, return_as="string", show_progress=False)

    def search(self, queries: Sequence[str], k: int = 3) -> list[list[Hit]]:
        """Each query's hits, best first (equal scores: lower row first), only documents that
        share a term with the query. bm25s scores every document; :func:`top_rows` picks."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if not queries:
            return []
        out: list[list[Hit]] = []
        for terms in self.query_terms(queries):
            ids = self._retriever.get_tokens_ids([t for t in terms if t])
            if not ids:
                out.append([])
                continue
            scores = self._retriever.get_scores_from_ids(ids)
            out.append([Hit(row=r, id=self._ids[r], contents=self._docs[r], score=s) for r, s in top_rows(scores, k)])
        return out


def top_rows(scores: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The ``k`` best ``(row, score)`` with a positive score, by score then lower row.

    Not ``np.argpartition`` over the whole array, which bm25s uses: most documents score 0, and
    numpy's selection degrades badly on so many equal values (20 ms for 200k documents, where
    this takes well under one). For a small ``k``, ``k`` passes of ``argmax`` (which returns the
    first maximum, hence the lower row on ties); otherwise a partition of the positive entries."""
    if k <= 16:
        work = np.array(scores, dtype=np.float64, copy=True)
        picked: list[tuple[int, float]] = []
        for _ in range(min(k, len(work))):
            row = int(np.argmax(work))
            if not work[row] > 0:
                break
            picked.append((row, float(scores[row])))
            work[row] = -np.inf
        return picked
    rows = np.flatnonzero(scores > 0)
    values = np.asarray(scores[rows], dtype=np.float64)
    if len(rows) > k:
        kth = np.partition(values, len(values) - k)[len(values) - k]
        keep = values >= kth
        rows, values = rows[keep], values[keep]
    order = np.lexsort((rows, -values))[:k]
    return [(int(rows[i]), float(values[i])) for i in order]


def open_index(directory: str | os.PathLike[str]) -> BM25Index:
    return BM25Index(directory)


__all__ = ["BM25Index", "CorpusError", "Hit", "BM25IndexError", "build_index", "open_index", "read_manifest"]
