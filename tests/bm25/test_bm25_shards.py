"""Sharded BM25: the same scores as one bm25s index over the whole corpus, less memory to build,
and index directories that cannot be turned against the user."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchr1.bm25.corpus import passage_row
from searchr1.bm25.index import BM25Index, BM25IndexError, build_index, make_tokenizer, verify_index
from searchr1.cli import main

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
         "kilo", "lima", "mike", "november"]


def write_corpus(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(passage_row(f"doc-{i}", f"T{i}", text) for i, text in enumerate(texts)), "utf-8")
    return path


def bm25s_top(texts: list[str], query: str, k: int) -> list[tuple[int, float]]:
    """The oracle: one bm25s index over the whole corpus, scored and ranked by bm25s itself
    (best first, lower row on ties), only passages sharing a term with the query."""
    import bm25s

    tokenizer = make_tokenizer()
    contents = [f'"T{i}"\n{text}' for i, text in enumerate(texts)]
    token_ids = [list(ids) for ids in tokenizer.streaming_tokenize(contents)]
    retriever = bm25s.BM25(method="lucene", k1=0.9, b=0.4)
    retriever.index((token_ids, tokenizer.get_vocab_dict()), show_progress=False)
    terms = make_tokenizer().tokenize([query], update_vocab=True, return_as="string", show_progress=False)[0]
    ids = [retriever.vocab_dict[t] for t in terms if t and t in retriever.vocab_dict]
    if not ids:
        return []
    scores = retriever.get_scores_from_ids(ids)
    ranked = sorted((row for row in range(len(texts)) if scores[row] > 0), key=lambda r: (-scores[r], r))
    return [(row, float(scores[row])) for row in ranked[:k]]


@pytest.mark.slow  # builds an index per example (seconds)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(docs=st.lists(st.lists(st.sampled_from(WORDS), min_size=1, max_size=15), min_size=1, max_size=30),
       query=st.lists(st.sampled_from(WORDS + ["zulu"]), min_size=1, max_size=5),
       shard=st.integers(1, 8), k=st.integers(1, 8))
def test_a_sharded_index_ranks_and_scores_as_one_bm25s_index_over_the_whole_corpus(tmp_path_factory, docs, query,
                                                                                   shard, k):
    """Invariant: for any corpus, shard size and query, the hits (ids, order) are bm25s's over the
    whole corpus, and every score equals bm25s's to 1e-6 relative."""
    directory = tmp_path_factory.mktemp("shards")
    texts = [" ".join(d) for d in docs]
    build_index(write_corpus(directory / "corpus.jsonl", texts), directory / "index", shard_passages=shard)
    (hits,) = BM25Index(directory / "index").search([" ".join(query)], k=k)
    expected = bm25s_top(texts, " ".join(query), k)
    assert [h.row for h in hits] == [row for row, _ in expected] or _tied(hits, expected)
    for hit, (_, score) in zip(hits, expected):
        assert hit.score == pytest.approx(score, rel=1e-6)
        assert hit.id == f"doc-{hit.row}"


def _tied(hits, expected) -> bool:
    """Orders that differ only among scores equal to float32 rounding (summation order)."""
    return [round(h.score, 5) for h in hits] == [round(s, 5) for _, s in expected]


PEAK = """
import json, sys, tracemalloc
from searchr1.bm25.index import build_index, make_tokenizer
make_tokenizer()  # imports done before the count starts
tracemalloc.start()
build_index(sys.argv[1], sys.argv[2], shard_passages=int(sys.argv[3]))
print(json.dumps(tracemalloc.get_traced_memory()[1] // 1024))  # the build's peak of Python and numpy memory
"""


@pytest.mark.slow  # two index builds under tracemalloc, in child processes (seconds)
def test_small_shards_build_the_same_index_in_much_less_memory(tmp_path):
    rng = np.random.default_rng(0)
    # An array, not a list: rng.choice converts a list of 3,000 strings to an array on every call
    # (two seconds for the corpus); the draws are the same.
    vocabulary = np.array([f"w{i}" for i in range(3000)])
    # 3,000 passages of 120 tokens in 8 shards of 375: the build's memory is then already mostly
    # per token (peaks near 28 MiB whole, 5 MiB sharded; 55 and 9 with twice the passages), so
    # the ratio the test asserts is the shards', at half the tokenising under tracemalloc.
    texts = [" ".join(rng.choice(vocabulary, size=120)) for _ in range(3_000)]
    corpus = write_corpus(tmp_path / "corpus.jsonl", texts)

    def start(shard: int, out: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", PEAK, str(corpus), str(tmp_path / out), str(shard)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def peak_kib(build: subprocess.Popen) -> int:
        stdout, stderr = build.communicate()
        assert build.returncode == 0, stderr
        return int(stdout.strip())

    # The two builds run at once, each in its own process: each counts only its own allocations.
    builds = start(len(texts), "whole"), start(len(texts) // 8, "sharded")
    whole, sharded = (peak_kib(build) for build in builds)
    print(f"peak memory of the build: whole {whole} KiB, sharded {sharded} KiB")
    assert sharded < whole / 3, (sharded, whole)
    a, b = BM25Index(tmp_path / "whole"), BM25Index(tmp_path / "sharded")
    queries = [" ".join(rng.choice(vocabulary, size=4)) for _ in range(20)]
    for left, right in zip(a.search(queries, k=5), b.search(queries, k=5)):
        assert [h.id for h in left] == [h.id for h in right]
        assert [h.score for h in left] == pytest.approx([h.score for h in right], rel=1e-6)


def test_shards_built_by_parallel_workers_are_byte_identical_to_one_process(tmp_path):
    rng = np.random.default_rng(1)
    texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 20)))) for _ in range(300)]
    corpus = write_corpus(tmp_path / "corpus.jsonl", texts)
    alone = build_index(corpus, tmp_path / "alone", shard_passages=40)
    together = build_index(corpus, tmp_path / "together", shard_passages=40, workers=2)
    assert {n: f["sha256"] for n, f in together["files"].items()} == {n: f["sha256"] for n, f in alone["files"].items()}


# -- hostile index directories ----------------------------------------------------------------


@pytest.fixture
def built(tmp_path) -> Path:
    texts = ["The Little Prince is a novella by Antoine de Saint-Exupery.", "Paris is the capital of France.",
             "The Danube flows through Budapest."]
    build_index(write_corpus(tmp_path / "corpus.jsonl", texts), tmp_path / "index", shard_passages=2)
    return tmp_path / "index"


def refused(directory: Path, match: str) -> None:
    with pytest.raises(BM25IndexError, match=match) as caught:
        BM25Index(directory)
    assert "\n" not in str(caught.value)


def manifest_edit(directory: Path, edit) -> None:
    path = directory / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


def test_a_file_linked_out_of_the_index_is_refused_before_any_byte_is_served(built, tmp_path):
    outside = tmp_path / "passwd"
    original = built / "shards/00000/docs.bin"
    outside.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n".ljust(original.stat().st_size, b"x"))
    original.unlink()
    original.symlink_to(outside)
    refused(built, r"shards/00000/docs.bin: a link")
    # a linked shard directory is refused the same way
    original.unlink()
    shutil.copy(outside, original)
    shard = built / "shards/00001"
    shard.rename(tmp_path / "elsewhere")
    shard.symlink_to(tmp_path / "elsewhere")
    refused(built, r"shards/00001: a link")


@pytest.mark.parametrize("edit, match", [
    (lambda m: m.pop("corpus"), "no 'corpus.rows'"),
    (lambda m: m.pop("tokenizer"), "no 'tokenizer.pattern'"),
    (lambda m: m["corpus"].__setitem__("rows", "abc"), "'corpus.rows' is not a whole number"),
    (lambda m: m.__setitem__("corpus", ["a", "list"]), "no 'corpus.rows'"),
    (lambda m: m["corpus"].__setitem__("rows", 99), "its shards hold 3 passages"),
    (lambda m: m["files"].pop("shards/00001/data.npy"), "lists no shards/00001/data.npy"),
    (lambda m: m["files"].__setitem__("../../etc/passwd", {"bytes": 1, "sha256": "0"}), "outside the index"),
])
def test_a_malformed_manifest_is_one_line_naming_it(built, edit, match):
    manifest_edit(built, edit)
    refused(built, match)


def test_out_of_range_rows_and_a_truncated_blob_are_refused_on_open(built):
    indices = built / "shards/00000/indices.npy"
    values = np.load(indices)
    values[0] = 10**6
    np.save(indices, values)
    refused(built, "indices.npy: a row outside")
    values[0] = 0
    np.save(indices, values)
    docs = built / "shards/00001/docs.bin"
    docs.write_bytes(docs.read_bytes()[:-3])
    refused(built, r"docs.bin: \d+ bytes, the manifest says")


def test_verify_names_a_file_changed_in_place_and_the_cli_says_it_in_one_line(built):
    assert verify_index(built)["corpus"]["rows"] == 3
    ok = CliRunner().invoke(main, ["index", "verify", str(built)])
    assert ok.exit_code == 0 and "intact" in ok.output
    docs = built / "shards/00000/docs.bin"
    data = bytearray(docs.read_bytes())
    data[:3] = b"XYZ"  # same size, shifted text: only the hash can tell
    docs.write_bytes(bytes(data))
    BM25Index(built)  # sizes and ranges still hold
    result = CliRunner().invoke(main, ["index", "verify", str(built)])
    assert result.exit_code == 1
    assert "shards/00000/docs.bin: sha256 differs" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                    max_leaves=8)
FIELDS = ["corpus", "tokenizer", "scorer", "vocabulary", "shards", "files", "format_version"]


@pytest.fixture(scope="module")
def pristine_index(tmp_path_factory) -> Path:
    """The index each example of the damage property damages a copy of (built once: a build
    takes 30 ms, a copy 2 ms; every example still starts from an intact index of its own)."""
    directory = tmp_path_factory.mktemp("pristine")
    texts = ["alpha bravo charlie", "delta echo alpha", "foxtrot golf hotel"]
    build_index(write_corpus(directory / "corpus.jsonl", texts), directory / "index", shard_passages=2)
    BM25Index(directory / "index")  # intact: it opens
    return directory / "index"


@pytest.mark.slow  # sixty damaged indexes opened and searched
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(FIELDS), value=JSON, name=st.sampled_from(
    ["vocab.json", "shards/00000/data.npy", "shards/00000/indptr.npy", "shards/00000/docs.offsets.npy",
     "shards/00001/indices.npy", "shards/00001/ids.bin"]), noise=st.binary(min_size=1, max_size=64))
def test_any_damage_to_an_index_is_a_one_line_refusal_or_a_search_that_serves_only_its_passages(
        tmp_path_factory, pristine_index, field, value, name, noise):
    """Invariant: a manifest field replaced by arbitrary JSON, or a file overwritten by arbitrary
    bytes, either opens to an index whose searches return only text from inside it, or is refused
    with one BM25IndexError line; nothing else is raised."""
    index_dir = tmp_path_factory.mktemp("hostile") / "index"
    shutil.copytree(pristine_index, index_dir)
    manifest_edit(index_dir, lambda m: m.__setitem__(field, value))
    with (index_dir / name).open("r+b") as handle:
        size = os.fstat(handle.fileno()).st_size
        handle.seek(max(0, size - len(noise)))
        handle.write(noise[:size])
    try:
        index = BM25Index(index_dir)
    except BM25IndexError as error:
        assert "\n" not in str(error)
        return
    for hits in index.search(["alpha", "golf hotel", "zulu"], k=3):
        for hit in hits:
            assert 0 <= hit.row < 3
