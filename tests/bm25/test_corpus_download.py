"""`prepare-data --corpus`: the wiki-18 fetch, tested on local bodies (the download itself
cannot be reached from here)."""

from __future__ import annotations

import gzip
import hashlib
import json

import httpx
import pytest
from click.testing import CliRunner

from searchr1.bm25.download import corpus_url, fetch_corpus
from searchr1.cli import main
from searchr1.data.dataset import DataError

ROWS = "".join(json.dumps({"id": str(i), "contents": f'"Title {i}"\nText of passage {i}.'}) + "\n" for i in range(1500))
URL = "https://hub.example/datasets/PeterJinGo/wiki-18-corpus/resolve/main/wiki-18.jsonl.gz"


def serving(body: bytes, status: int = 200) -> httpx.MockTransport:
    return httpx.MockTransport(lambda request: httpx.Response(status, stream=httpx.ByteStream(body)))


def test_a_gzipped_corpus_is_streamed_decompressed_and_counted(tmp_path):
    fetched = fetch_corpus(tmp_path / "data" / "wiki-18.jsonl", url=URL, transport=serving(gzip.compress(ROWS.encode())))
    assert (tmp_path / "data" / "wiki-18.jsonl").read_text() == ROWS
    assert fetched["rows"] == 1500 and fetched["bytes"] == len(ROWS.encode())


@pytest.mark.parametrize("transport, message", [
    (httpx.MockTransport(lambda request: (_ for _ in ()).throw(httpx.ConnectError("down"))),
     "cannot reach hub.example (ConnectError); use --corpus-source FILE"),
    (serving(b"", 404), "failed (HTTP 404); use --corpus-source FILE"),
    (serving(gzip.compress(ROWS.encode())[:2000]), "truncated"),
    (serving(b"plain text, not gzip"), "is not valid gzip"),
    (serving(gzip.compress(b'{"id": 1, "text": "no contents"}\n')), "not a wiki-18 corpus: " + URL + ":1: missing"),
])
def test_a_failed_download_says_why_in_one_line_and_leaves_nothing(tmp_path, transport, message):
    with pytest.raises(DataError) as caught:
        fetch_corpus(tmp_path / "data" / "wiki-18.jsonl", url=URL, transport=transport)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_the_default_url_is_search_r1s_corpus_and_honours_hf_endpoint(monkeypatch):
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    assert corpus_url() == "https://huggingface.co/datasets/PeterJinGo/wiki-18-corpus/resolve/main/wiki-18.jsonl.gz"
    monkeypatch.setenv("HF_ENDPOINT", "https://hf-mirror.com/")
    assert corpus_url().startswith("https://hf-mirror.com/datasets/PeterJinGo/")


def test_prepare_data_corpus_takes_a_local_file_and_says_what_to_do_next(tmp_path):
    source = tmp_path / "wiki-18.jsonl.gz"
    source.write_bytes(gzip.compress(ROWS.encode()))
    result = CliRunner().invoke(main, ["prepare-data", "--corpus", "--corpus-source", str(source),
                                       "--output-dir", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "wiki-18.jsonl").read_text() == ROWS
    assert "1500 passages" in result.output and "index build" in result.output
    result = CliRunner().invoke(main, ["prepare-data", "--corpus-source", str(source)])
    assert result.exit_code == 2 and "only apply with --corpus" in result.output


class _Dropping(httpx.SyncByteStream):
    """A body that stops with a dropped connection after ``keep`` bytes."""

    def __init__(self, body: bytes, keep: int) -> None:
        self.body, self.keep = body, keep

    def __iter__(self):
        yield self.body[:self.keep]
        raise httpx.ReadError("connection reset")


def ranged(body: bytes, *, drop_after: int | None = None, etag: str = '"v1"') -> tuple[httpx.MockTransport, list]:
    """A server of ``body`` that honours ``Range`` while ``If-Range`` matches its ETag."""
    seen: list[dict[str, str]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(dict(request.headers))
        start = 0
        wanted = request.headers.get("range")
        if wanted and request.headers.get("if-range") == etag:
            start = int(wanted.removeprefix("bytes=").rstrip("-"))
        status = 206 if start else 200
        rest = body[start:]
        stream = _Dropping(rest, drop_after) if drop_after is not None else httpx.ByteStream(rest)
        return httpx.Response(status, headers={"ETag": etag}, stream=stream)

    return httpx.MockTransport(handle), seen


def test_a_dropped_download_resumes_where_it_stopped_and_gives_the_whole_corpus(tmp_path):
    body = gzip.compress(ROWS.encode())
    dest = tmp_path / "data" / "wiki-18.jsonl"
    first, _ = ranged(body, drop_after=len(body) // 2)
    with pytest.raises(DataError, match="bytes downloaded are kept and the next run continues them"):
        fetch_corpus(dest, url=URL, transport=first)
    assert not dest.exists()
    second, seen = ranged(body)
    fetched = fetch_corpus(dest, url=URL, transport=second, sha256=hashlib.sha256(body).hexdigest())
    assert seen[0]["range"] == f"bytes={len(body) // 2}-" and fetched["resumed_from"] == len(body) // 2
    assert dest.read_text() == ROWS and fetched["rows"] == 1500
    assert sorted(p.name for p in dest.parent.iterdir()) == ["wiki-18.jsonl"]  # the download is gone


def test_a_changed_file_is_fetched_afresh_and_a_wrong_checksum_is_refused_and_removed(tmp_path):
    body = gzip.compress(ROWS.encode())
    dest = tmp_path / "data" / "wiki-18.jsonl"
    first, _ = ranged(body, drop_after=100)
    with pytest.raises(DataError):
        fetch_corpus(dest, url=URL, transport=first)
    changed, seen = ranged(body, etag='"v2"')  # If-Range no longer matches: the whole file comes back
    fetched = fetch_corpus(dest, url=URL, transport=changed)
    assert fetched["resumed_from"] == 0 and dest.read_text() == ROWS
    dest.unlink()
    with pytest.raises(DataError, match="expected 0{64}; the download was removed") as caught:
        fetch_corpus(dest, url=URL, transport=ranged(body)[0], sha256="0" * 64)
    assert "\n" not in str(caught.value)
    assert list(dest.parent.iterdir()) == []
    lfs, _ = ranged(body, etag=f'"{"1" * 64}"')  # the hub's ETag of an LFS file is its sha256
    with pytest.raises(DataError, match="expected 1{64}"):
        fetch_corpus(dest, url=URL, transport=lfs)
