"""A BM25 index over a passage corpus, built in shards of bounded memory and read back memory-mapped.

Scores are Lucene's BM25 (k1=0.9, b=0.4, pyserini's defaults) exactly as one ``bm25s`` index
computes them over the whole corpus: every shard is scored with the corpus-wide document
frequencies and average length, so a passage's score does not depend on how the corpus was cut.

An index directory holds:

* ``manifest.json``, written last: the format, the corpus (path, sha256, rows), the tokenizer,
  the scorer, the shards (first row, rows) and every other file's size and sha256;
* ``vocab.json``: the terms, a term's id being its position;
* ``shards/NNNNN/``: one shard's score matrix in CSC form (``data.npy`` the float32 scores,
  ``indices.npy`` the shard-local rows, ``indptr.npy`` a term's range, one entry per term
  plus one), and its passages (``docs.bin`` / ``docs.offsets.npy``: every ``contents`` in
  UTF-8 back to back; ``ids.bin`` / ``ids.offsets.npy``: every ``id``);
* ``pages/``: the title and id key tables that find a page's passages (:mod:`searchr1.bm25.pages`).

Building (:func:`build_index`) reads the corpus as a stream. Pass one tokenises shard after shard
and spills each shard's token ids, its own vocabulary and document frequencies into a staging
directory beside ``out``; pass two merges the vocabularies and writes each shard's scores. Every
finished step of a shard is renamed into place, so an interrupted build started again with the
same corpus and shard size resumes from the last finished shard. Peak memory is one shard's
working set plus the vocabulary, whatever the corpus size. The staging directory is renamed to
``out`` only when complete: a directory without a manifest is never opened.

Opening (:class:`BM25Index`) checks, before any search is served, that every file the manifest
names is a regular file inside the directory (never a link), has the size recorded, and holds
values in range (offsets, term ranges, rows). ``index verify`` also checks every sha256.
Every defect is a :class:`BM25IndexError` naming the file.
"""

from __future__ import annotations

import bisect
import errno
import json
import math
import os
import shutil
import stat
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol, TypedDict, TypeVar, cast

import numpy as np

from searchr1.bm25.corpus import CorpusError, CorpusReader, split_contents
from searchr1.bm25.pages import TABLE_FILES, TABLES, KeyTable, sorted_table, table_paths, text_keys
from searchr1.core.errors import UserError
from searchr1.basics.fileio import WRITE_FAILURES, exclusive_lock, file_sha256, write_json_atomically
from searchr1.basics.jsonl import read_json_document
from searchr1.basics import invocation

FORMAT = "searchr1-bm25-index"
FORMAT_VERSION = 3
MANIFEST_NAME = "manifest.json"
VOCAB_NAME = "vocab.json"
# The tokenizer and scorer. k1=0.9, b=0.4 are pyserini's (Lucene) defaults, which Search-R1's
# BM25 baseline uses; "lucene" is Lucene's BM25 idf and length normalisation.
TOKEN_PATTERN = r"(?u)\b\w\w+\b"
STOPWORDS = "en"
STEMMER_LANGUAGE = "english"
METHOD = "lucene"
K1 = 0.9
B = 0.4
# A shard's working set while its scores are computed is about 40 bytes per token: 250,000
# wiki-18 passages (about 130 tokens each) stay near 1.3 GB, so two workers and the vocabulary
# stay under the 6 GB build bound.
DEFAULT_SHARD_PASSAGES = 250_000
SHARD_FILES = ("data.npy", "indices.npy", "indptr.npy", "docs.bin", "docs.offsets.npy", "ids.bin", "ids.offsets.npy")
_CHUNK = 1 << 22  # elements per slice when range-checking a memory-mapped array
_PASSAGE_READERS = 8  # threads reading a batch's passages (disk reads in flight at once)


if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor

T = TypeVar("T")


class BM25IndexError(UserError, ValueError):
    """An index directory cannot be built or opened; the message names the file and says why."""


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


class CorpusTokenizer(Protocol):
    """What the index asks of bm25s's tokenizer (lowercase, stopwords, stems)."""

    def streaming_tokenize(self, texts: list[str]) -> Iterator[list[int]]: ...

    def get_vocab_dict(self) -> dict[str, int]: ...

    def tokenize(self, texts: list[str], *, update_vocab: bool, return_as: str,
                 show_progress: bool) -> list[list[str]]: ...


class TokenizerInfo(TypedDict):
    pattern: str
    lowercase: bool
    stopwords: str
    stemmer: str
    pystemmer_version: str


class CorpusInfo(TypedDict):
    path: str
    sha256: str
    rows: int
    bytes: int


# "as" is a keyword: this TypedDict is spelled as a call.
ScorerInfo = TypedDict("ScorerInfo", {"method": str, "k1": float, "b": float, "idf": str, "avg_length": float,
                                      "as": str})


class ShardInfo(TypedDict):
    first_row: int
    rows: int


class FileInfo(TypedDict):
    bytes: int
    sha256: str


class IndexManifest(TypedDict):
    """``manifest.json`` of an index directory (:func:`read_manifest` checks the fields an open reads)."""

    format: str
    format_version: int
    corpus: CorpusInfo
    tokenizer: TokenizerInfo
    scorer: ScorerInfo
    tokens: int
    vocabulary: int
    shards: list[ShardInfo]
    shard_passages: int
    resumed_shards: int
    files: dict[str, FileInfo]
    build_seconds: float
    tokenize_seconds: float


class BuildKey(TypedDict):
    """``build.json`` of a staging directory: what a build must match to resume it."""

    format_version: int
    corpus: str
    bytes: int
    mtime_ns: int
    shard_passages: int
    tokenizer: TokenizerInfo


def make_tokenizer() -> CorpusTokenizer:
    import bm25s
    import Stemmer

    return bm25s.tokenization.Tokenizer(
        lower=True, splitter=TOKEN_PATTERN, stopwords=STOPWORDS, stemmer=Stemmer.Stemmer(STEMMER_LANGUAGE)
    )


def tokenizer_description() -> TokenizerInfo:
    return {"pattern": TOKEN_PATTERN, "lowercase": True, "stopwords": STOPWORDS,
            "stemmer": f"PyStemmer {STEMMER_LANGUAGE} (Snowball)", "pystemmer_version": _version("PyStemmer")}


def idf(df: np.ndarray, n_docs: int) -> np.ndarray:
    """Lucene's idf, ``log(1 + (N - df + 0.5) / (df + 0.5))``, computed as bm25s does (float64,
    stored as float32)."""
    values = np.array([math.log(1 + (n_docs - d + 0.5) / (d + 0.5)) for d in df.tolist()], dtype=np.float32)
    return values


def shard_scores(token_ids: np.ndarray, lengths: np.ndarray, idf_of_term: np.ndarray,
                 avg_length: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One shard's CSC score matrix ``(data, indices, indptr)`` from its token ids (global term
    ids, documents back to back with ``lengths``).

    Each (document, term) pair scores ``idf * tf / (k1 * (1 - b + b * len / avg_len) + tf)`` in
    float32, the operations and rounding of bm25s's ``lucene`` method."""
    n_docs = len(lengths)
    doc_of_token = np.repeat(np.arange(n_docs, dtype=np.int64), lengths)
    key = doc_of_token * len(idf_of_term) + token_ids.astype(np.int64)
    pairs, tf = np.unique(key, return_counts=True)  # sorted by document, then term
    del key, doc_of_token
    docs = (pairs // len(idf_of_term)).astype(np.int64)
    terms = (pairs % len(idf_of_term)).astype(np.int64)
    del pairs
    length_norm = K1 * ((1 - B) + B * lengths.astype(np.float64) / avg_length)  # per document, float64
    tf32 = tf.astype(np.float32)
    tfc = tf32 / (length_norm[docs].astype(np.float32) + tf32)
    data = idf_of_term[terms] * tfc
    order = np.argsort(terms, kind="stable")  # by term, documents ascending within a term
    indptr = np.zeros(len(idf_of_term) + 1, dtype=np.int64)
    np.cumsum(np.bincount(terms, minlength=len(idf_of_term)), out=indptr[1:])
    return data[order].astype(np.float32), docs[order].astype(np.int32), indptr


# -- building --------------------------------------------------------------------------------

Progress = Callable[[str, int, int, int], None]  # (phase "tokenize" | "score", passages, done, total)
# "tokenize" counts corpus bytes read of the file's size; "score" counts passages scored of all.


class _Blob:
    """Strings appended to a file back to back, with their byte offsets."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle = path.open("wb")
        self.offsets = [0]

    def add(self, text: str) -> None:
        data = text.encode("utf-8")
        self._handle.write(data)
        self.offsets.append(self.offsets[-1] + len(data))

    def close(self) -> None:
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._handle.close()
        _save(self.path.with_name(self.path.name.replace(".bin", ".offsets.npy")), np.asarray(self.offsets, np.int64))


def _save(path: Path, array: np.ndarray) -> None:
    with path.open("wb") as handle:
        np.save(handle, array)
        handle.flush()
        os.fsync(handle.fileno())


def _build_key(corpus: Path, shard_passages: int) -> BuildKey:
    """What a staging directory must match to be resumed."""
    info = corpus.stat()
    return {"format_version": FORMAT_VERSION, "corpus": str(corpus.resolve()), "bytes": info.st_size,
            "mtime_ns": info.st_mtime_ns, "shard_passages": shard_passages, "tokenizer": tokenizer_description()}


def _staging_for(out: Path, key: BuildKey) -> Path:
    staging = out.parent / f".{out.name}.building"
    key_path = staging / "build.json"
    if staging.is_dir():
        try:
            same = json.loads(key_path.read_text("utf-8")) == key
        except (OSError, ValueError):
            same = False
        if same:
            return staging
        shutil.rmtree(staging)
    (staging / "shards").mkdir(parents=True)
    write_json_atomically(key_path, key)
    return staging


def _tokenize_shard(passages: Sequence[tuple[str, str]], directory: Path) -> None:
    """Pass one for one shard, into ``directory`` (renamed into place by the caller): the
    passages, the token ids under the shard's own vocabulary, its terms and their document
    frequencies."""
    tokenizer = make_tokenizer()
    docs, ids = _Blob(directory / "docs.bin"), _Blob(directory / "ids.bin")
    _save(directory / "titles.keys.npy", text_keys(split_contents(contents)[0] for _, contents in passages))
    _save(directory / "ids.keys.npy", text_keys(ident for ident, _ in passages))
    tokens: list[np.ndarray] = []
    for ident, contents in passages:
        (ids_of_doc,) = tokenizer.streaming_tokenize([contents])
        tokens.append(np.asarray(ids_of_doc, dtype=np.int32))
        docs.add(contents)
        ids.add(ident)
    docs.close()
    ids.close()
    vocab = tokenizer.get_vocab_dict()
    terms = [""] * len(vocab)
    for term, index in vocab.items():
        terms[index] = term
    flat = np.concatenate(tokens) if tokens else np.zeros(0, np.int32)
    df = np.zeros(len(terms), dtype=np.int64)
    for doc in tokens:
        df[np.unique(doc)] += 1
    _save(directory / "tokens.npy", flat)
    _save(directory / "lengths.npy", np.asarray([len(t) for t in tokens], dtype=np.int64))
    _save(directory / "df.npy", df)
    write_json_atomically(directory / "terms.json", terms)


def _shard_batches(reader: CorpusReader, shard_passages: int, skip: set[str]) -> Iterator[list[tuple[str, str]]]:
    """The corpus in shards of ``shard_passages``; the shards named in ``skip`` are read (for the
    corpus hash) but yielded as empty lists."""
    batch: list[tuple[str, str]] = []
    index = 0
    for passage in reader:
        if f"{index:05d}" not in skip:
            batch.append((passage.id, passage.contents))
        if reader.rows % shard_passages == 0:
            yield batch
            batch, index = [], index + 1
    if reader.rows % shard_passages:
        yield batch


def build_index(corpus: str | os.PathLike[str], out: str | os.PathLike[str], *, overwrite: bool = False,
                shard_passages: int = DEFAULT_SHARD_PASSAGES, workers: int = 1,
                progress: Progress | None = None) -> IndexManifest:
    """Build the index of ``corpus`` into the directory ``out``; returns the manifest.

    ``workers`` > 1 tokenises and scores that many shards at once in child processes (the
    index is byte-identical to one built by a single process).

    Refuses an existing ``out`` unless ``overwrite``. Corpus errors raise
    :class:`~searchr1.bm25.corpus.CorpusError` (file and line). An interrupted build leaves its
    finished shards in ``.OUT.building`` beside ``out``; the same call resumes from them."""
    if shard_passages < 1:
        raise BM25IndexError(f"--shard-passages must be at least 1, got {shard_passages}")
    if workers < 1:
        raise BM25IndexError(f"--workers must be at least 1, got {workers}")
    corpus, out = Path(corpus), Path(out)
    reader = CorpusReader(corpus)
    if out.exists() and not overwrite:
        raise BM25IndexError(f"{out} already exists; pass --overwrite to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(out.parent / f".{out.name}.building.lock", f"the index build of {out}"):
        try:
            with _Workers(workers) as pool:
                return _build(reader, corpus, out, shard_passages, pool, progress)
        except CorpusError:  # the corpus must change before a build can finish: nothing to resume
            shutil.rmtree(out.parent / f".{out.name}.building", ignore_errors=True)
            raise
        except OSError as error:  # a full disk: the finished shards stay for the resume
            if error.errno is None or error.errno in WRITE_FAILURES:
                raise _write_failure(error, out) from None
            raise


def _write_failure(error: OSError, out: Path) -> OSError:
    """A failed write anywhere in the build, as one error naming the index directory (the
    staging directory's files mean nothing to the reader). A short write that carries no errno
    (numpy's ``tofile``) is what a full disk looks like there."""
    if error.errno is None:
        return OSError(errno.ENOSPC, f"{error} (is the disk full?)", str(out))
    return OSError(error.errno, error.strerror, str(out))


def peak_memory_kib() -> int:
    """The peak resident memory of this process and of its live children (the build's
    workers), in KiB, from /proc (this process's own peak elsewhere)."""
    import resource

    def peak_of(pid: str) -> int:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        except OSError:
            pass
        return 0

    total = peak_of("self") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        for task in Path("/proc/self/task").iterdir():
            for child in (task / "children").read_text().split():
                total += peak_of(child)
    except OSError:
        pass
    return total


class _Workers:
    """Runs shard tasks in ``count`` child processes, at most ``count`` at once (or in this
    process when ``count`` is 1); :meth:`wait` returns once every task submitted has finished."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._pool: ProcessPoolExecutor | None = None
        self._pending: list[Future[None]] = []

    def __enter__(self) -> _Workers:
        if self.count > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self._pool = ProcessPoolExecutor(self.count, mp_context=multiprocessing.get_context("spawn"))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def submit(self, task: Callable[..., None], *args: object) -> None:
        if self._pool is None:
            task(*args)
            return
        while len(self._pending) >= self.count:  # bounded: each task holds a shard's working set
            self._reap(first=True)
        self._pending.append(self._pool.submit(task, *args))

    def _reap(self, *, first: bool) -> None:
        from concurrent.futures import FIRST_COMPLETED, wait

        done, _ = wait(self._pending, return_when=FIRST_COMPLETED if first else "ALL_COMPLETED")
        self._pending = [f for f in self._pending if f not in done]
        for future in done:
            future.result()  # a worker's error is raised here

    def wait(self) -> None:
        if self._pending:
            self._reap(first=False)


def _tokenize_into(passages: Sequence[tuple[str, str]], partial: Path, final: Path) -> None:
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    _tokenize_shard(passages, partial)
    os.rename(partial, final)


def _score_into(directory: Path, idf_of_term: np.ndarray, avg_length: float) -> None:
    """Pass two for one shard: its scores under the corpus-wide statistics, its token ids mapped
    to the corpus vocabulary through its ``mapping.npy``; data.npy is renamed into place last, so
    a shard with it is scored."""
    lengths = np.load(directory / "lengths.npy")
    mapping = np.load(directory / "mapping.npy")
    token_ids = mapping[np.load(directory / "tokens.npy")].astype(np.int64) if len(mapping) \
        else np.zeros(0, np.int64)
    data, indices, indptr = shard_scores(token_ids, lengths, idf_of_term, avg_length)
    for file, array in (("indptr.npy", indptr), ("indices.npy", indices), ("data.npy", data)):
        _save(directory / f".{file}", array)
        os.rename(directory / f".{file}", directory / file)


@dataclass
class _Vocabulary:
    """The shards' vocabularies merged: the corpus's terms (a term's id is the order it was first
    seen in), their document frequencies, each shard's rows, and the corpus's tokens."""

    terms: dict[str, int]
    df: np.ndarray
    shard_rows: list[int]
    tokens: int


def _build(reader: CorpusReader, corpus: Path, out: Path, shard_passages: int, pool: _Workers,
           progress: Progress | None) -> IndexManifest:
    """Build the index in a staging directory beside ``out`` (resuming the shards an interrupted
    build finished), then rename it to ``out``: tokenise, merge the vocabularies, score, then the
    page tables, the vocabulary and the manifest. Returns the manifest."""
    started = time.perf_counter()
    staging = _staging_for(out, _build_key(corpus, shard_passages))
    shards_dir = staging / "shards"
    finished = {p.name for p in shards_dir.iterdir() if p.is_dir() and not p.name.endswith(".tmp")}
    shard_names = _tokenize_pass(reader, shards_dir, shard_passages, finished, pool, progress)
    tokenized = time.perf_counter() - started
    vocabulary = _merge_vocabularies(staging, shard_names)
    rows = reader.rows
    avg_length = vocabulary.tokens / rows
    shards = _score_pass(shards_dir, shard_names, vocabulary.shard_rows, idf(vocabulary.df, rows), avg_length,
                         rows, pool, progress)
    _write_page_tables(staging, shard_names)
    _write_vocabulary(staging, vocabulary.terms)
    (staging / "build.json").unlink()
    files: dict[str, FileInfo] = {str(p.relative_to(staging)): {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
                                  for p in sorted(staging.rglob("*")) if p.is_file()}
    manifest: IndexManifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "corpus": {"path": str(corpus), "sha256": reader.sha256, "rows": rows, "bytes": reader.bytes_read},
        "tokenizer": tokenizer_description(),
        "scorer": {"method": METHOD, "k1": K1, "b": B, "idf": "lucene", "avg_length": avg_length,
                   "as": f"bm25s {_version('bm25s')} lucene"},
        "tokens": vocabulary.tokens,
        "vocabulary": len(vocabulary.terms),
        "shards": shards,
        "shard_passages": shard_passages,
        "resumed_shards": len(finished),
        "files": files,
        "build_seconds": round(time.perf_counter() - started, 3),
        "tokenize_seconds": round(tokenized, 3),
    }
    write_json_atomically(staging / MANIFEST_NAME, manifest)
    _move_into_place(staging, out)
    return manifest


def _tokenize_pass(reader: CorpusReader, shards_dir: Path, shard_passages: int, finished: set[str],
                   pool: _Workers, progress: Progress | None) -> list[str]:
    """Pass one: tokenise the shards not yet on disk (``finished`` are). Returns every shard's name."""
    count = 0
    for number, batch in enumerate(_shard_batches(reader, shard_passages, finished)):
        count = number + 1
        name = f"{number:05d}"
        if name in finished:
            continue
        pool.submit(_tokenize_into, batch, shards_dir / f"{name}.tmp", shards_dir / name)
        if progress is not None:
            progress("tokenize", reader.rows, reader.bytes_read, reader.size)
    pool.wait()
    return [f"{n:05d}" for n in range(count)]


def _merge_vocabularies(staging: Path, shard_names: list[str]) -> _Vocabulary:
    """Merge the vocabularies and the document frequencies. Each shard's map from its term ids to
    the corpus's goes to disk beside it (int32: the vocabulary stays under 2**31 terms), and the
    document frequencies are summed shard by shard, so the merge holds the vocabulary and one
    shard's terms, not a map per shard."""
    shards_dir = staging / "shards"
    vocab: dict[str, int] = {}
    df = np.zeros(0, dtype=np.int64)
    shard_rows: list[int] = []
    lengths_total = 0
    for name in shard_names:
        directory = shards_dir / name
        if (directory / "data.npy").exists() and not (directory / "terms.json").exists():
            raise BM25IndexError(f"{directory}: a scored shard without its terms; remove {staging} and build again")
        terms = json.loads((directory / "terms.json").read_text("utf-8"))
        mapping = np.fromiter((vocab.setdefault(t, len(vocab)) for t in terms), dtype=np.int32, count=len(terms))
        del terms
        if not (directory / "data.npy").exists():
            _save(directory / ".mapping.npy", mapping)
            os.rename(directory / ".mapping.npy", directory / "mapping.npy")
        if len(df) < len(vocab):
            df = np.concatenate([df, np.zeros(len(vocab) - len(df), dtype=np.int64)])
        np.add.at(df, mapping, np.load(directory / "df.npy"))
        lengths = np.load(directory / "lengths.npy")
        shard_rows.append(len(lengths))
        lengths_total += int(lengths.sum())
    return _Vocabulary(vocab, df, shard_rows, lengths_total)


def _score_pass(shards_dir: Path, shard_names: list[str], shard_rows: list[int], idf_of_term: np.ndarray,
                avg_length: float, rows: int, pool: _Workers, progress: Progress | None) -> list[ShardInfo]:
    """Pass two: score every shard not yet scored with the corpus-wide statistics (``rows`` in the
    corpus, for the progress). Returns each shard's first row and rows, for the manifest."""
    shards: list[ShardInfo] = []
    first_row = 0
    for name, count_of_rows in zip(shard_names, shard_rows):
        if not (shards_dir / name / "data.npy").exists():
            pool.submit(_score_into, shards_dir / name, idf_of_term, avg_length)
        shards.append({"first_row": first_row, "rows": count_of_rows})
        first_row += count_of_rows
        if progress is not None:
            progress("score", first_row, first_row, rows)
    pool.wait()
    return shards


def _write_page_tables(staging: Path, shard_names: list[str]) -> None:
    """The page tables: every passage's title and id key, sorted once over the whole corpus; then
    the shards' spilled working files are removed."""
    shards_dir = staging / "shards"
    (staging / "pages").mkdir(exist_ok=True)
    for table in TABLES:
        keys, table_rows = sorted_table([np.load(shards_dir / name / f"{table}.keys.npy") for name in shard_names])
        keys_path, rows_path = table_paths(staging, table)
        _save(keys_path, keys)
        _save(rows_path, table_rows)
        del keys, table_rows
    for name in shard_names:
        for spill in ("tokens.npy", "lengths.npy", "df.npy", "terms.json", "mapping.npy", "titles.keys.npy",
                      "ids.keys.npy"):
            (shards_dir / name / spill).unlink(missing_ok=True)


def _write_vocabulary(staging: Path, vocab: dict[str, int]) -> None:
    """``vocab.json``: the terms in the order of their ids."""
    terms_in_order = [""] * len(vocab)
    for term, index in vocab.items():
        terms_in_order[index] = term
    write_json_atomically(staging / VOCAB_NAME, terms_in_order)


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


# -- opening ---------------------------------------------------------------------------------


def _field(manifest: Mapping[str, object], where: str, *path: str, kind: type[T] | tuple[type[T], ...]) -> T:
    value: object = manifest
    for key in path:
        if not isinstance(value, dict) or key not in value:
            raise BM25IndexError(f"{where}: no {'.'.join(path)!r}")
        value = value[key]
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        raise BM25IndexError(f"{where}: {'.'.join(path)!r} is not {_kind_name(kind)}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {int: "a whole number", str: "a string", dict: "an object", list: "a list", float: "a number"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def read_manifest(directory: str | os.PathLike[str]) -> IndexManifest:
    """The manifest of the index in ``directory``, its fields checked for shape."""
    directory = Path(directory)
    if not directory.is_dir():
        raise BM25IndexError(f"index {directory} does not exist; build one with "
                             f"`{invocation.command(f'index build CORPUS.jsonl --out {directory}')}`")
    path = directory / MANIFEST_NAME
    if path.is_symlink() or not path.is_file():
        raise BM25IndexError(f"index {directory} has no {MANIFEST_NAME}: not a finished index "
                             f"(an interrupted build?); build it again with `{invocation.command('index build')}`")
    try:
        manifest = read_json_document(path, error=BM25IndexError)
    except OSError as error:
        raise BM25IndexError(f"{path}: unreadable ({error.strerror or error})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BM25IndexError(f"{path}: not a searchr1 BM25 index manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise BM25IndexError(f"{path}: format version {str(manifest.get('format_version'))[:20]!r}, this "
                             f"searchr1 reads {FORMAT_VERSION}; rebuild it with `{invocation.command('index build')}`")
    where = str(path)
    rows = _field(manifest, where, "corpus", "rows", kind=int)
    _field(manifest, where, "corpus", "sha256", kind=str)
    if _field(manifest, where, "tokenizer", "pattern", kind=str) != TOKEN_PATTERN:
        raise BM25IndexError(f"{path}: built with another tokenizer; rebuild it")
    _field(manifest, where, "scorer", "avg_length", kind=(int, float))
    vocabulary = _field(manifest, where, "vocabulary", kind=int)
    shards = _field(manifest, where, "shards", kind=list)
    files = _field(manifest, where, "files", kind=dict)
    if rows < 1:
        raise BM25IndexError(f"{path}: 'corpus.rows' must be at least 1")
    if vocabulary < 0:
        raise BM25IndexError(f"{path}: 'vocabulary' must not be negative")
    first = 0
    for number, shard in enumerate(shards):
        if not isinstance(shard, dict):
            raise BM25IndexError(f"{path}: shard {number} is not an object")
        start = _field(shard, where, "first_row", kind=int)
        count = _field(shard, where, "rows", kind=int)
        if start != first or count < 1:
            raise BM25IndexError(f"{path}: shard {number} does not follow the one before it")
        first += count
    if first != rows:
        raise BM25IndexError(f"{path}: its shards hold {first} passages, 'corpus.rows' says {rows}")
    for name, entry in files.items():
        if not isinstance(entry, dict):
            raise BM25IndexError(f"{path}: files[{name!r}] is not an object")
        _field(entry, where, "bytes", kind=int)
        _field(entry, where, "sha256", kind=str)
    needed = [VOCAB_NAME, *TABLE_FILES] + [f"shards/{n:05d}/{f}" for n in range(len(shards)) for f in SHARD_FILES]
    missing = [n for n in needed if n not in files]
    if missing:
        raise BM25IndexError(f"{path}: lists no {missing[0]}")
    return cast(IndexManifest, manifest)  # the fields an open reads are checked above


def _inside(directory: Path, name: str) -> Path:
    """``directory/name`` as a regular file inside ``directory``, never through a link."""
    path = directory / name
    if Path(name).is_absolute() or ".." in Path(name).parts:
        raise BM25IndexError(f"{path}: outside the index directory")
    current = directory
    for part in Path(name).parts:
        current = current / part
        try:
            info = os.lstat(current)
        except OSError:
            raise BM25IndexError(f"{path}: missing; build the index again") from None
        if stat.S_ISLNK(info.st_mode):
            raise BM25IndexError(f"{current}: a link; an index holds only its own files")
    if not stat.S_ISREG(info.st_mode):
        raise BM25IndexError(f"{path}: not a regular file")
    return path


def _check_sizes(directory: Path, manifest: IndexManifest) -> None:
    for name, entry in manifest["files"].items():
        path = _inside(directory, name)
        size = path.stat().st_size
        if size != entry["bytes"]:
            raise BM25IndexError(f"{path}: {size} bytes, the manifest says {entry['bytes']}; damaged, build again")


def verify_index(directory: str | os.PathLike[str]) -> IndexManifest:
    """Check every file's sha256 against the manifest (and everything an open checks); returns
    the manifest. Raises :class:`BM25IndexError` naming the first damaged file."""
    directory = Path(directory)
    index = BM25Index(directory)
    for name, entry in index.manifest["files"].items():
        path = _inside(directory, name)
        if file_sha256(path) != entry["sha256"]:
            raise BM25IndexError(f"{path}: sha256 differs from the manifest's; damaged, build again")
    return index.manifest


def _load(path: Path, dtype: type, ndim: int = 1) -> np.ndarray:
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as error:
        raise BM25IndexError(f"{path}: not a numpy array ({type(error).__name__})") from None
    if array.dtype != np.dtype(dtype) or array.ndim != ndim:
        raise BM25IndexError(f"{path}: holds {array.dtype} of {array.ndim} dimensions, expected {np.dtype(dtype)}")
    return array


def _check_offsets(path: Path, offsets: np.ndarray, count: int, size: int) -> None:
    if len(offsets) != count + 1 or int(offsets[0]) != 0 or int(offsets[-1]) != size:
        raise BM25IndexError(f"{path}: offsets do not cover its {size}-byte blob for {count} entries")
    _check_ascending(path, offsets)


def _check_ascending(path: Path, values: np.ndarray) -> None:
    for start in range(0, max(len(values) - 1, 0), _CHUNK):
        piece = np.asarray(values[start:start + _CHUNK + 1])
        if np.any(piece[1:] < piece[:-1]):
            raise BM25IndexError(f"{path}: values go backwards; damaged, build again")


def _check_range(path: Path, values: np.ndarray, limit: int) -> None:
    for start in range(0, len(values), _CHUNK):
        piece = np.asarray(values[start:start + _CHUNK])
        if len(piece) and (int(piece.min()) < 0 or int(piece.max()) >= limit):
            raise BM25IndexError(f"{path}: a row outside 0..{limit - 1}; damaged, build again")


class _Strings:
    """Read-only strings from a blob and its offsets. The offsets are memory-mapped; a string is
    read with ``os.pread``, which lets go of the GIL while the disk answers (a page fault in a
    memory-mapped slice holds it, stalling every thread), so reads from several threads overlap."""

    def __init__(self, path: Path, offsets_path: Path, count: int) -> None:
        self.offsets = _load(offsets_path, np.int64)
        size = path.stat().st_size
        _check_offsets(offsets_path, self.offsets, count, size)
        self.path = path
        self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        weakref.finalize(self, os.close, self._fd)

    def __getitem__(self, row: int) -> str:
        start, end = int(self.offsets[row]), int(self.offsets[row + 1])
        return os.pread(self._fd, end - start, start).decode("utf-8", errors="replace")


@dataclass
class _Shard:
    first_row: int
    rows: int
    data: np.ndarray
    indices: np.ndarray
    indptr: np.ndarray
    docs: _Strings
    ids: _Strings


class BM25Index:
    """An opened index: ``search(queries, k)`` gives each query's hits, best first (ties by row).
    Read-only, so concurrent readers are safe; a batch shares one tokenizer."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.manifest = read_manifest(self.directory)
        _check_sizes(self.directory, self.manifest)
        self.rows = int(self.manifest["corpus"]["rows"])
        vocab_path = _inside(self.directory, VOCAB_NAME)
        try:
            terms = json.loads(vocab_path.read_bytes().decode("utf-8"))
        except (ValueError, RecursionError) as error:
            raise BM25IndexError(f"{vocab_path}: unreadable ({type(error).__name__})") from None
        if not isinstance(terms, list) or len(terms) != self.manifest["vocabulary"] or \
                not all(isinstance(t, str) for t in terms):
            raise BM25IndexError(f"{vocab_path}: not the manifest's {self.manifest['vocabulary']} terms")
        self.vocab = {term: index for index, term in enumerate(terms)}
        self.shards = [self._open_shard(n, s) for n, s in enumerate(self.manifest["shards"])]
        self._first_rows = [shard.first_row for shard in self.shards]
        self.tables = {table: self._open_table(table) for table in TABLES}
        self._readers: ThreadPoolExecutor | None = None  # made at the first batch that needs it
        self._readers_pid = 0
        self._readers_lock = threading.Lock()

    def _open_table(self, table: str) -> KeyTable:
        keys_path, rows_path = (_inside(self.directory, str(p.relative_to(self.directory)))
                                for p in table_paths(self.directory, table))
        keys, rows = _load(keys_path, np.uint64), _load(rows_path, np.int64)
        if len(keys) != self.rows or len(rows) != self.rows:
            raise BM25IndexError(f"{keys_path}: {len(keys)} keys and {len(rows)} rows for {self.rows} passages")
        _check_ascending(keys_path, keys)
        _check_range(rows_path, rows, self.rows)
        return KeyTable(keys, rows)

    def _open_shard(self, number: int, shard: ShardInfo) -> _Shard:
        base = f"shards/{number:05d}"
        path = {f: _inside(self.directory, f"{base}/{f}") for f in SHARD_FILES}
        rows = shard["rows"]
        data = _load(path["data.npy"], np.float32)
        indices = _load(path["indices.npy"], np.int32)
        indptr = _load(path["indptr.npy"], np.int64)
        if len(indptr) != len(self.vocab) + 1 or int(indptr[0]) != 0 or int(indptr[-1]) != len(indices) \
                or len(indices) != len(data):
            raise BM25IndexError(f"{path['indptr.npy']}: term ranges do not match the vocabulary and scores")
        _check_ascending(path["indptr.npy"], indptr)
        _check_range(path["indices.npy"], indices, rows)
        docs = _Strings(path["docs.bin"], path["docs.offsets.npy"], rows)
        ids = _Strings(path["ids.bin"], path["ids.offsets.npy"], rows)
        # Plain arrays over the same mapped pages: a search slices them many times, and a memmap's
        # slices cost more to make and to compute on.
        return _Shard(shard["first_row"], rows, np.asarray(data), np.asarray(indices), np.asarray(indptr), docs, ids)

    def __len__(self) -> int:
        return self.rows

    def passage(self, row: int) -> Hit:
        """The passage at ``row`` (score 0)."""
        shard = self.shards[bisect.bisect_right(self._first_rows, row) - 1]
        local = row - shard.first_row
        return Hit(row=row, id=shard.ids[local], contents=shard.docs[local], score=0.0)

    def page(self, title: str) -> list[Hit]:
        """Every passage whose title is ``title``, in corpus order (none: an empty list)."""
        found = (self.passage(int(row)) for row in self.tables["titles"].rows_of(title))
        return [hit for hit in found if split_contents(hit.contents)[0] == title]

    def passage_of_id(self, ident: str) -> Hit | None:
        """The first passage whose id is ``ident``, or ``None``."""
        found = (self.passage(int(row)) for row in self.tables["ids"].rows_of(ident))
        return next((hit for hit in found if hit.id == ident), None)

    def query_terms(self, queries: Sequence[str]) -> list[list[str]]:
        """Each query as the index's terms (the corpus tokenizer: lowercase, stopwords, stems)."""
        tokenizer = make_tokenizer()
        return tokenizer.tokenize(list(queries), update_vocab=True, return_as="string", show_progress=False)

    def term_ids(self, terms: Sequence[str]) -> list[int]:
        """The ids of ``terms`` the index knows, repeats kept (a repeated query term counts twice)."""
        return [self.vocab[t] for t in terms if t and t in self.vocab]

    def search(self, queries: Sequence[str], k: int = 3) -> list[list[Hit]]:
        """Each query's hits, best first (equal scores: lower row first), only passages that
        share a term with the query. The shards are searched in row order, each query keeping its
        best ``k`` so far: once it has ``k``, their lowest score is a floor no later shard's
        passage needs to be scored below (it would rank after them, and ties go to the lower row)."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if not queries:
            return []
        term_ids = [self.term_ids(terms) for terms in self.query_terms(queries)]
        best: list[list[tuple[float, int, _Shard, int]]] = [[] for _ in term_ids]  # (-score, row, shard, local)
        for shard in self.shards:
            floors = [-found[k - 1][0] if len(found) == k else 0.0 for found in best]
            for number, top in enumerate(self._shard_top(shard, term_ids, k, floors)):
                if top:
                    found = best[number] + [(-score, shard.first_row + local, shard, local) for local, score in top]
                    found.sort(key=lambda c: (c[0], c[1]))
                    best[number] = found[:k]
        texts = iter(self._passages([(shard, local) for found in best for _, _, shard, local in found]))
        return [[Hit(row, *next(texts), score=-neg) for neg, row, _, _ in found] for found in best]

    def _passages(self, wanted: list[tuple[_Shard, int]]) -> list[tuple[str, str]]:
        """``(id, contents)`` of each ``(shard, local row)``, in order: read by a few threads at
        once, so that a batch's cold passages wait on the disk together rather than one by one."""
        def read(item: tuple[_Shard, int]) -> tuple[str, str]:
            shard, local = item
            return shard.ids[local], shard.docs[local]

        if len(wanted) < 4:
            return [read(item) for item in wanted]
        with self._readers_lock:
            if self._readers is None or self._readers_pid != os.getpid():  # none yet, or a fork's copy
                self._readers = ThreadPoolExecutor(_PASSAGE_READERS, thread_name_prefix="bm25-passages")
                self._readers_pid = os.getpid()
            readers = self._readers
        return list(readers.map(read, wanted))

    @staticmethod
    def _shard_top(shard: _Shard, term_ids: Sequence[Sequence[int]], k: int,
                   floors: Sequence[float] | None = None) -> list[list[tuple[int, float]]]:
        """The ``k`` best passages of ``shard`` for each query (its term ids), best first (ties by
        lower row), leaving out passages that score below the query's floor (default 0.0, none
        left out): see :func:`shard_query_top`."""
        floors = floors if floors is not None else [0.0] * len(term_ids)
        return [shard_query_top(shard, ids, k, floor) for ids, floor in zip(term_ids, floors)]


# -- searching one shard ---------------------------------------------------------------------
#
# A passage's score is the sum of its score-matrix entries for the query's terms, added in float64
# in the query's term order (a repeated term twice) and stored as float32; passages rank by that
# float32 score, then lower row. The search scores only the passages that can reach the top k: no
# entry of a list exceeds its largest, so a passage found only in lists whose largest entries sum
# below a score k passages are known to reach cannot be among the k best (MaxScore, Turtle and
# Flood 1995). The long lists of common terms are then only looked up (binary search) for the few
# passages of the rarer terms' lists, never summed whole; each list's largest entry is one pass of
# ``max`` over it, far cheaper.

# A passage's bound adds a few float64 numbers in another order than its score does: this
# relative margin covers that rounding many times over.
_BOUND_MARGIN = 1 + 1e-12
# The floor comes from lists of at most this many entries (a partition of each).
_FLOOR_POSTINGS = 4096
# Looking a passage of the essential lists up in every list costs about this many times as much as
# summing one posting into an array of the shard's rows (measured with numpy 2)...
_LOOKUP_COST = 7
# ...and making that array costs about as much as summing one posting per this many of its rows.
_ROWS_PER_POSTING = 32


class Postings(NamedTuple):
    """One query term's posting list in a shard: entries ``start`` onwards of the shard's arrays,
    ``rows`` ascending (each once) and their float32 ``weights``."""

    start: int
    rows: np.ndarray
    weights: np.ndarray


def shard_query_top(shard: _Shard, ids: Sequence[int], k: int, floor: float = 0.0) -> list[tuple[int, float]]:
    """The ``k`` best ``(row, score)`` of ``shard`` for one query's term ids, best first (equal
    scores: lower row first); only passages that hold a query term. The same hits and scores as
    summing every posting (:func:`dense_top`), with only the passages that can rank summed.
    ``floor`` is a float32 score that ``k`` passages elsewhere are known to reach: a passage
    that scores below it may be left out (none may, when every one does: an empty answer)."""
    lists = query_postings(shard, ids)
    if not lists:
        return []
    essential = essential_lists(lists, max(floor, score_floor(lists, k)))
    if not essential:
        return []
    if summing_is_cheaper(lists, essential, shard.rows):
        return dense_top(lists, shard.rows, k)
    candidates = union([lists[j].rows for j in essential])
    return ranked(candidates, scores_of(shard, lists, candidates), k)


def summing_is_cheaper(lists: Sequence[Postings], essential: Sequence[int], shard_rows: int) -> bool:
    """Whether summing every posting into an array of the shard's rows costs less than looking the
    essential lists' passages up in every list (when the essential lists are long)."""
    looked_up = sum(len(lists[j].rows) for j in essential)
    summed = sum(len(postings.rows) for postings in lists)
    return looked_up * _LOOKUP_COST > summed + shard_rows / _ROWS_PER_POSTING


def query_postings(shard: _Shard, ids: Sequence[int]) -> list[Postings]:
    """The posting lists of a query's terms in ``shard``, in the query's order (a repeated term
    once per occurrence); terms no passage of the shard holds are left out."""
    lists = []
    for term in ids:
        start, end = int(shard.indptr[term]), int(shard.indptr[term + 1])
        if end > start:
            lists.append(Postings(start, shard.indices[start:end], shard.data[start:end]))
    return lists


def score_floor(lists: Sequence[Postings], k: int) -> float:
    """A float32 score that ``k`` passages are known to reach, 0.0 if none is known: the largest
    ``k``-th best entry of a list (of at most ``_FLOOR_POSTINGS``). A passage's score is at least
    any one of its entries (the others add to it, and rounding keeps the order)."""
    floor = 0.0
    for postings in lists:
        size = len(postings.weights)
        if k <= size <= _FLOOR_POSTINGS:
            floor = max(floor, float(np.partition(postings.weights, size - k)[size - k]))
    return floor


def essential_lists(lists: Sequence[Postings], floor: float) -> list[int]:
    """The positions of the lists every passage that can rank is in at least one of: all but the
    most lists, taken by ascending largest entry, whose largest entries sum below the float32
    number just under ``floor``. A passage only in those scores below ``floor``, which ``k``
    passages reach, so it can neither rank above them nor tie them."""
    below = float(np.nextafter(np.float32(floor), np.float32(-np.inf)))
    bounds = [float(postings.weights.max()) for postings in lists]
    order = sorted(range(len(lists)), key=bounds.__getitem__)
    total, skipped = 0.0, 0
    for position in order:
        total += bounds[position]
        if not total * _BOUND_MARGIN < below:  # written so that a NaN keeps the list
            break
        skipped += 1
    return sorted(order[skipped:])


def union(row_lists: Sequence[np.ndarray]) -> np.ndarray:
    """The rows in any of ``row_lists`` (each ascending, no repeats), ascending, each once."""
    return row_lists[0] if len(row_lists) == 1 else distinct(np.concatenate(row_lists))


def distinct(rows: np.ndarray) -> np.ndarray:
    """``rows`` ascending, each once (a sort: ``np.unique`` hashes first, many times slower on a
    few thousand rows)."""
    rows = np.sort(rows)
    return rows[np.concatenate(([True], rows[1:] != rows[:-1]))]


def scores_of(shard: _Shard, lists: Sequence[Postings], rows: np.ndarray) -> np.ndarray:
    """The float64 scores of ``rows`` (ascending) over ``lists``: each list's entry for a row, 0.0
    where it has none, added to 0.0 in the lists' order, the very additions (and so the very
    roundings) that summing every posting into an array of the shard's rows makes."""
    at = np.empty((len(lists), len(rows)), dtype=np.int64)
    for number, postings in enumerate(lists):
        at[number] = np.searchsorted(postings.rows, rows)
    at += np.array([[p.start] for p in lists])
    np.minimum(at, np.array([[p.start + len(p.rows) - 1] for p in lists]), out=at)
    entries = np.where(shard.indices[at] == rows, shard.data[at], np.float32(0))
    total = np.zeros(len(rows))
    for row_of_entries in entries:
        total += row_of_entries
    return total


def dense_top(lists: Sequence[Postings], shard_rows: int, k: int) -> list[tuple[int, float]]:
    """The ``k`` best ``(row, score)`` by summing every posting into an array of the shard's rows.
    A passage appears at most once per list, so the best ``k * lists`` postings by their
    passage's score hold the best ``k`` passages (ties at the threshold all kept)."""
    rows = np.concatenate([postings.rows for postings in lists])
    weights = np.concatenate([postings.weights for postings in lists])
    dense = np.bincount(rows, weights=weights, minlength=shard_rows)
    scores = dense[rows]
    keep = k * len(lists)
    if len(scores) > keep:
        threshold = np.partition(scores, len(scores) - keep)[len(scores) - keep]
        rows = rows[scores >= threshold]
    touched = distinct(rows)
    return ranked(touched, dense[touched], k)


def ranked(rows: np.ndarray, scores: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The ``k`` best of ``rows`` (ascending) by their float64 ``scores`` stored as float32."""
    return [(int(rows[i]), score) for i, score in top_rows(scores.astype(np.float32), k)]


def top_rows(scores: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The ``k`` best ``(row, score)`` with a positive score, by score then lower row."""
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


__all__ = ["BM25Index", "CorpusError", "Hit", "BM25IndexError", "build_index", "open_index", "read_manifest",
           "verify_index"]
