"""Fetching the wiki-18 corpus (``prepare-data --corpus``) as Search-R1 publishes it: one gzipped
JSONL file on the Hugging Face hub (``PeterJinGo/wiki-18-corpus``, ``wiki-18.jsonl.gz``, about
21M passages; ``HF_ENDPOINT`` selects a mirror, ``--corpus-url`` any other place).

The body is decompressed while it streams into a hidden file beside the destination, which is
renamed into place only when the download completed and its first rows parsed as corpus rows; a
failure (or Ctrl-C) removes the partial file and says in one line what happened
(:class:`~searchr1.data.dataset.DataError`, as the dataset download does). ``source=`` takes a local
``.jsonl`` or ``.jsonl.gz`` through the same path, which is how it is tested offline.
"""

from __future__ import annotations

import os
import tempfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from searchr1.data.dataset import DataError
from searchr1.bm25.corpus import CorpusError, parse_row
from searchr1.run.fileio import removing_new_directories

CORPUS_REPO = "PeterJinGo/wiki-18-corpus"
CORPUS_FILE = "wiki-18.jsonl.gz"
DEFAULT_ENDPOINT = "https://huggingface.co"
CHECKED_ROWS = 1000
CHUNK = 1 << 20
OFFLINE_HINT = "use --corpus-source FILE (a wiki-18.jsonl or .jsonl.gz downloaded elsewhere) instead"


def corpus_url() -> str:
    endpoint = (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    return f"{endpoint}/datasets/{CORPUS_REPO}/resolve/main/{CORPUS_FILE}"


def _gunzip(chunks: Iterator[bytes], gzipped: bool) -> Iterator[bytes]:
    if not gzipped:
        yield from chunks
        return
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    for chunk in chunks:
        data = inflater.decompress(chunk)
        if data:
            yield data
    tail = inflater.flush()
    if tail:
        yield tail
    if not inflater.eof:
        raise DataError("the corpus download ended inside the gzip stream (truncated)")


def _file_chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            yield chunk


def fetch_corpus(dest: str | os.PathLike[str], *, url: str | None = None, source: str | os.PathLike[str] | None = None,
                 transport: httpx.BaseTransport | None = None,
                 progress: Callable[[int], None] | None = None) -> dict[str, int | str]:
    """Write the corpus to ``dest`` (a ``.jsonl``); returns ``{"rows", "bytes", "from"}``."""
    dest = Path(dest)
    where = str(source) if source is not None else (url or corpus_url())
    with removing_new_directories(dest.parent):
        dest.parent.mkdir(parents=True, exist_ok=True)
        handle, staging_name = tempfile.mkstemp(prefix=f".{dest.name}.download-", dir=dest.parent)
        staging = Path(staging_name)
        try:
            with os.fdopen(handle, "wb") as out:
                if source is not None:
                    path = Path(source)
                    if not path.is_file():
                        raise DataError(f"--corpus-source {path} does not exist")
                    written, rows = _copy(_gunzip(_file_chunks(path), path.suffix == ".gz"), out, where, progress)
                else:
                    written, rows = _download(where, out, transport, progress)
                out.flush()
                os.fsync(out.fileno())
            if rows == 0:
                raise DataError(f"the corpus from {where} holds no passages")
            os.replace(staging, dest)
            return {"rows": rows, "bytes": written, "from": where}
        except BaseException:
            staging.unlink(missing_ok=True)
            raise


def _download(url: str, out, transport: httpx.BaseTransport | None, progress) -> tuple[int, int]:
    host = urlsplit(url).hostname or url
    try:
        with httpx.Client(transport=transport, follow_redirects=True, timeout=httpx.Timeout(60.0)) as client:
            with client.stream("GET", url) as response:
                if response.status_code != 200:
                    raise DataError(f"download of the wiki-18 corpus from {url} failed (HTTP {response.status_code}); "
                                    f"{OFFLINE_HINT}")
                gzipped = url.split("?", 1)[0].endswith(".gz")
                return _copy(_gunzip(response.iter_raw(CHUNK), gzipped), out, url, progress)
    except httpx.TransportError as error:
        raise DataError(f"cannot reach {host} ({type(error).__name__}); {OFFLINE_HINT}") from None
    except zlib.error as error:
        raise DataError(f"the corpus from {url} is not valid gzip ({error}); {OFFLINE_HINT}") from None


def _copy(chunks: Iterator[bytes], out, where: str, progress) -> tuple[int, int]:
    """Write ``chunks``; returns ``(bytes, rows)``. The first ``CHECKED_ROWS`` rows must parse as
    corpus rows (a wrong file fails early, naming the line)."""
    written = newlines = 0
    head, checked, last = b"", False, b"\n"
    for chunk in chunks:
        out.write(chunk)
        written += len(chunk)
        newlines += chunk.count(b"\n")
        last = chunk[-1:] or last
        if not checked:
            head += chunk
            if head.count(b"\n") >= CHECKED_ROWS:
                _check_head(head.split(b"\n")[:CHECKED_ROWS], where)
                checked, head = True, b""
        if progress is not None:
            progress(written)
    if not checked:
        _check_head(head.split(b"\n"), where)
    return written, newlines + (1 if written and last != b"\n" else 0)


def _check_head(lines: list[bytes], where: str) -> None:
    for number, line in enumerate(lines, start=1):
        if line.strip():
            try:
                parse_row(line, number, where)
            except CorpusError as error:
                raise DataError(f"not a wiki-18 corpus: {error}") from None
