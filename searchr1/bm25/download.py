"""Fetching the wiki-18 corpus (``prepare-data --corpus``) as Search-R1 publishes it: one gzipped
JSONL file on the Hugging Face hub (``PeterJinGo/wiki-18-corpus``, ``wiki-18.jsonl.gz``, about
21M passages; ``HF_ENDPOINT`` selects a mirror, ``--corpus-url`` any other place).

The download goes to a hidden ``.NAME.download`` file beside the destination, which survives a
failure or Ctrl-C: the next call asks the server for the rest (an HTTP range request, guarded by
the ETag the first response gave, so a changed file is fetched afresh). A finished download is
checked against its sha256 (``--corpus-sha256``, or the hub's ETag when it is one, as for files
stored with Git LFS), then decompressed into another hidden file that is renamed into place only
when complete and its first rows parsed as corpus rows. Every failure says in one line what
happened (:class:`~searchr1.data.dataset.DataError`, as the dataset download does). ``source=``
takes a local ``.jsonl`` or ``.jsonl.gz`` through the same path, which is how it is tested offline.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from searchr1.data.dataset import DataError
from searchr1.bm25.corpus import CorpusError, parse_row
from searchr1.basics.fileio import follow_umask, removing_new_directories

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
                 transport: httpx.BaseTransport | None = None, sha256: str | None = None,
                 progress: Callable[[int], None] | None = None) -> dict[str, int | str]:
    """Write the corpus to ``dest`` (a ``.jsonl``); returns ``{"rows", "bytes", "from"}`` (and
    ``"resumed_from"``, the bytes a previous call had already downloaded, and ``"sha256"``)."""
    dest = Path(dest)
    where = str(source) if source is not None else (url or corpus_url())
    with removing_new_directories(dest.parent):
        dest.parent.mkdir(parents=True, exist_ok=True)
        fetched: dict[str, int | str] = {}
        downloaded = dest.parent / f".{dest.name}.download"
        staging: Path | None = None
        try:
            if source is None:
                fetched = _download_resumably(where, downloaded, transport, sha256, progress)
                source = downloaded
            handle, staging_name = tempfile.mkstemp(prefix=f".{dest.name}.unpacking-", dir=dest.parent)
            staging = Path(staging_name)
            with os.fdopen(handle, "wb") as out:
                path = Path(source)
                if not path.is_file():
                    raise DataError(f"--corpus-source {path} does not exist")
                gzipped = path.suffix == ".gz" or (bool(fetched) and where.split("?", 1)[0].endswith(".gz"))
                try:
                    written, rows = _copy(_gunzip(_file_chunks(path), gzipped), out, where,
                                          None if fetched else progress)
                except zlib.error as error:
                    raise DataError(f"the corpus from {where} is not valid gzip ({error}); {OFFLINE_HINT}") from None
                out.flush()
                os.fsync(out.fileno())
            if rows == 0:
                raise DataError(f"the corpus from {where} holds no passages")
            follow_umask(staging)
            os.replace(staging, dest)
            if fetched:
                Path(source).unlink()
                _state_path(Path(source)).unlink(missing_ok=True)
            return {"rows": rows, "bytes": written, "from": where, **fetched}
        except BaseException as error:
            if staging is not None:
                staging.unlink(missing_ok=True)
            if not (isinstance(error, KeyboardInterrupt) or getattr(error, "resumable", False)):
                downloaded.unlink(missing_ok=True)  # what was fetched is not the corpus: start afresh next time
                _state_path(downloaded).unlink(missing_ok=True)
            if isinstance(error, OSError) and error.errno is not None and (
                    error.filename is None or str(error.filename) == str(staging)):
                raise OSError(error.errno, error.strerror, str(dest)) from None  # a full disk, named as the corpus
            raise


def _state_path(partial: Path) -> Path:
    return partial.with_name(partial.name + ".json")


SHA256 = re.compile(r"[0-9a-f]{64}")


def _download_resumably(url: str, partial: Path, transport: httpx.BaseTransport | None, expected: str | None,
                        progress: Callable[[int], None] | None) -> dict[str, int | str]:
    """Download ``url`` (its bytes as served) into ``partial``, continuing a previous partial
    download of the same file; check its sha256; returns ``{"resumed_from", "sha256"}``."""
    host = urlsplit(url).hostname or url
    state_path = _state_path(partial)
    try:
        state = json.loads(state_path.read_text("utf-8")) if state_path.is_file() else {}
    except (OSError, ValueError):
        state = {}
    have = partial.stat().st_size if partial.is_file() and state.get("url") == url else 0
    headers = {"Range": f"bytes={have}-", "If-Range": state["etag"]} if have and state.get("etag") else {}
    if not headers:
        have = 0
    try:
        with httpx.Client(transport=transport, follow_redirects=True, timeout=httpx.Timeout(60.0)) as client:
            with client.stream("GET", url, headers=headers) as response:
                if response.status_code == 416 and have:  # nothing left to send: the file is whole
                    resumed = have
                elif response.status_code not in (200, 206):
                    raise DataError(f"download of the wiki-18 corpus from {url} failed (HTTP {response.status_code}); "
                                    f"{OFFLINE_HINT}")
                else:
                    resumed = have if response.status_code == 206 else 0
                    state = {"url": url, "etag": response.headers.get("etag", ""),
                             "linked_etag": response.headers.get("x-linked-etag") or response.headers.get("etag", "")}
                    state_path.write_text(json.dumps(state), "utf-8")
                    with partial.open("ab" if resumed else "wb") as out:
                        done = resumed
                        for chunk in response.iter_raw():
                            out.write(chunk)
                            done += len(chunk)
                            if progress is not None:
                                progress(done)
                        out.flush()
                        os.fsync(out.fileno())
    except httpx.TransportError as error:
        kept = f"the {partial.stat().st_size:,} bytes downloaded are kept and the next run continues them; " \
            if partial.is_file() and partial.stat().st_size else ""
        failure = DataError(f"cannot reach {host} ({type(error).__name__}); {kept}{OFFLINE_HINT}")
        failure.resumable = True
        raise failure from None
    digest = hashlib.sha256()
    for chunk in _file_chunks(partial):
        digest.update(chunk)
    actual = digest.hexdigest()
    linked = str(state.get("linked_etag", "")).removeprefix("W/").strip('"')
    wanted = (expected or "").lower() or (linked if SHA256.fullmatch(linked) else "")
    if wanted and actual != wanted:
        partial.unlink()
        state_path.unlink(missing_ok=True)
        raise DataError(f"the corpus from {url} has sha256 {actual}, expected {wanted}; the download was removed, "
                        "run again to fetch it afresh")
    return {"resumed_from": resumed, "sha256": actual}


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
