"""`prepare-data --corpus`: the wiki-18 fetch, tested on local bodies (the download itself
cannot be reached from here)."""

from __future__ import annotations

import gzip
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
