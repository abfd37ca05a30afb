"""The BM25 index: built from a corpus stream with a manifest, refused when unfinished, and
answering queries best first."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchr1.bm25.corpus import CorpusError, passage_row
from searchr1.bm25.index import BM25Index, BM25IndexError, build_index
from searchr1.cli import main

PASSAGES = [
    ("Hamlet", "Hamlet is a tragedy written by William Shakespeare around 1600."),
    ("Paris", "Paris is the capital and largest city of France, on the Seine."),
    ("Danube", "The Danube flows through Budapest, dividing Buda from Pest."),
    ("Mona Lisa", "The Mona Lisa is a portrait painted by Leonardo da Vinci."),
]


def write_corpus(path: Path, passages=PASSAGES, extra: str = "") -> Path:
    path.write_text("".join(passage_row(f"doc-{i}", t, x) for i, (t, x) in enumerate(passages)) + extra, "utf-8")
    return path


def leftovers(directory: Path) -> list[str]:
    """What a build left beside its corpus (its lock file, held only while building, aside)."""
    return sorted(p.name for p in directory.iterdir() if p.name != "corpus.jsonl" and not p.name.endswith(".lock"))


def test_an_index_finds_the_passage_a_query_is_about_and_its_manifest_names_the_corpus(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    manifest = build_index(corpus, tmp_path / "index")
    assert manifest["corpus"]["sha256"] == hashlib.sha256(corpus.read_bytes()).hexdigest()
    assert manifest["corpus"]["rows"] == len(PASSAGES)
    assert manifest["tokenizer"]["stopwords"] == "en" and "english" in manifest["tokenizer"]["stemmer"]
    assert manifest["scorer"]["method"] == "lucene" and (manifest["scorer"]["k1"], manifest["scorer"]["b"]) == (0.9, 0.4)
    on_disk = json.loads((tmp_path / "index" / "manifest.json").read_text())
    assert on_disk == manifest
    index = BM25Index(tmp_path / "index")
    (hamlet,), (danube,) = [hits[:1] for hits in index.search(["who wrote Hamlet", "rivers of Budapest"], k=3)]
    assert hamlet.id == "doc-0" and hamlet.contents.startswith('"Hamlet"\n')
    assert danube.id == "doc-2"
    assert index.search(["the of and"], k=3) == [[]]  # stopwords only: no hit rather than arbitrary ones


@pytest.mark.parametrize("bad, message", [
    ("{not json\n", ":5: invalid JSON"),
    ('{"id": "x"}\n', ":5: missing string field 'contents'"),
    ('["a list"]\n', ":5: expected a JSON object"),
    ('{"contents": "\\"T\\"\\ntext"}\n', ":5: missing field 'id'"),
])
def test_a_bad_row_is_named_by_its_line_and_nothing_is_left_behind(tmp_path, bad, message):
    corpus = write_corpus(tmp_path / "corpus.jsonl", extra=bad)
    with pytest.raises(CorpusError, match=message):
        build_index(corpus, tmp_path / "index")
    assert leftovers(tmp_path) == []


def test_an_interrupted_build_resumes_from_its_last_shard_and_an_unfinished_directory_is_refused(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    whole = build_index(corpus, tmp_path / "whole", shard_passages=1)
    seen: list[str] = []

    def interrupt(phase, passages, done, total):
        seen.append(phase)
        if len(seen) == 2:  # after two finished shards
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_index(corpus, tmp_path / "index", shard_passages=1, progress=interrupt)
    assert not (tmp_path / "index").exists()  # nothing that --backend local would open
    resumed = build_index(corpus, tmp_path / "index", shard_passages=1)
    assert resumed["resumed_shards"] == 2
    assert {n: f["sha256"] for n, f in resumed["files"].items()} == {n: f["sha256"] for n, f in whole["files"].items()}
    assert leftovers(tmp_path) == ["index", "whole"]
    # What a build killed outright would leave: files without the manifest, which is written last.
    (tmp_path / "index" / "manifest.json").unlink()
    with pytest.raises(BM25IndexError, match="no manifest.json: not a finished index"):
        BM25Index(tmp_path / "index")


def test_an_existing_index_is_replaced_only_with_overwrite(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    build_index(corpus, tmp_path / "index")
    with pytest.raises(BM25IndexError, match="already exists; pass --overwrite"):
        build_index(corpus, tmp_path / "index")
    smaller = write_corpus(tmp_path / "corpus.jsonl", PASSAGES[:2])
    build_index(smaller, tmp_path / "index", overwrite=True)
    assert len(BM25Index(tmp_path / "index")) == 2
    assert leftovers(tmp_path) == ["index"]


def test_index_build_reports_a_bad_row_in_one_line_without_a_traceback(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.jsonl", extra="oops\n")
    result = CliRunner().invoke(main, ["index", "build", str(corpus), "--out", str(tmp_path / "index"), "--quiet"])
    assert result.exit_code == 1
    assert f"{corpus}:5: invalid JSON" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(main, ["index", "build", str(write_corpus(corpus)), "--out", str(tmp_path / "index")])
    assert result.exit_code == 0 and "indexed 4 passages" in result.output


WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]


@pytest.mark.slow  # builds an index per example (a second)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(docs=st.lists(st.lists(st.sampled_from(WORDS), min_size=1, max_size=12), min_size=1, max_size=25),
       query=st.lists(st.sampled_from(WORDS + ["the", "zulu"]), min_size=1, max_size=4),
       k=st.integers(1, 6))
def test_hits_are_distinct_positive_best_first_and_share_a_term_with_the_query(tmp_path_factory, docs, query, k):
    directory = tmp_path_factory.mktemp("prop")
    corpus = write_corpus(directory / "corpus.jsonl", [(f"T{i}", " ".join(d)) for i, d in enumerate(docs)])
    build_index(corpus, directory / "index")
    (hits,) = BM25Index(directory / "index").search([" ".join(query)], k=k)
    assert len(hits) <= k and len({h.row for h in hits}) == len(hits)
    assert all(h.score > 0 for h in hits)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    for hit in hits:
        assert set(docs[hit.row]) & set(query)
    matching = sum(1 for d in docs if set(d) & set(query))
    assert len(hits) == min(k, matching)


@settings(max_examples=200, deadline=None)
@given(scores=st.lists(st.sampled_from([0.0, 0.0, 0.0, 0.5, 1.0, 1.5, 2.25]) | st.floats(0.0, 10.0, width=32),
                       min_size=1, max_size=60),
       k=st.integers(1, 40))
def test_top_rows_are_the_k_best_positive_scores_with_lower_rows_first_on_ties(scores, k):
    import numpy as np

    from searchr1.bm25.index import top_rows

    array = np.array(scores, dtype=np.float32)
    expected = sorted(((row, float(s)) for row, s in enumerate(array) if s > 0), key=lambda p: (-p[1], p[0]))[:k]
    assert top_rows(array, k) == expected
