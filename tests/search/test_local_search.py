"""The local backend (BM25 in process) through the common search pipeline, its batching, the
shipped offline corpus, and train/eval --offline --backend local end to end."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from click.testing import CliRunner

from searchr1.bm25.batcher import QueryBatcher
from searchr1.bm25.corpus import passage_row
from searchr1.bm25.index import BM25IndexError, Hit, build_index
from searchr1.cli import main
from searchr1.search.cache import QueryCache
from searchr1.search.factory import create_search_backend
from searchr1.core.observation.text import format_item

PASSAGES = [("Hamlet", "Hamlet is a tragedy written by William Shakespeare."),
            ("Paris", "Paris is the capital of France."),
            ("Hamlet (film)", "Hamlet is a 1996 film directed by Kenneth Branagh."),
            ("Berlin", "Berlin is the capital of Germany.")]


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("local")
    corpus = directory / "corpus.jsonl"
    corpus.write_text("".join(passage_row(f"d{i}", t, x) for i, (t, x) in enumerate(PASSAGES)), "utf-8")
    build_index(corpus, directory / "index")
    return directory / "index"


async def test_local_search_returns_titled_passages_through_the_cache_and_stats(index_dir, tmp_path):
    cache = QueryCache(tmp_path / "cache.sqlite")
    async with create_search_backend("local", index=index_dir, topk=1, cache=cache) as backend:
        first = await backend.search("Who wrote Hamlet?")
        again = await backend.search("  Who wrote Hamlet?")
        empty = await backend.search("   ")
    assert first.ok and [(i.title, i.source) for i in first.items] == [("Hamlet", "wiki-18")]
    assert format_item(first.items[0], 1).startswith("[1] Title: Hamlet\n    Id: d0\n    Content: Hamlet is a tragedy")
    assert again.items == first.items  # the same query once normalised: answered by the cache, id and all
    assert not empty.ok and empty.error == "empty query"
    metrics = backend.stats.peek()
    assert metrics["search/requests"] == 3.0
    assert metrics["search/cache_hit_rate"] == pytest.approx(1 / 3)
    assert metrics["search/success_rate"] == pytest.approx(2 / 3)


async def test_every_requested_passage_comes_back_and_no_more(index_dir):
    async with create_search_backend("local", index=index_dir, topk=3) as backend:
        result = await backend.search("capital")
    assert sorted(item.title for item in result.items) == ["Berlin", "Paris"]


def test_the_local_backend_without_an_index_says_which_flag_to_pass(monkeypatch, tmp_path):
    monkeypatch.delenv("SEARCHR1_INDEX", raising=False)
    with pytest.raises(BM25IndexError, match="--index DIR"):
        create_search_backend("local", env_file=tmp_path / "none.env")
    with pytest.raises(BM25IndexError, match="does not exist; build one"):
        create_search_backend("local", index=tmp_path / "missing")


class _GatedIndex:
    """An index whose first search waits until the test opens the gate (so later submissions
    queue up behind it deterministically)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.calls: list[list[str]] = []

    def search(self, queries, k):
        if not self.calls:
            self.calls.append(list(queries))
            self.gate.wait(10)
        else:
            self.calls.append(list(queries))
        return [[Hit(row=0, id=q, contents=q, score=1.0)] * k for q in queries]


async def test_queries_submitted_while_the_worker_is_busy_share_one_batch():
    index = _GatedIndex()
    batcher = QueryBatcher(index, max_batch=100)
    try:
        first = asyncio.ensure_future(batcher.search(["q0"], 1))
        while not index.calls:
            await asyncio.sleep(0.001)
        rest = [asyncio.ensure_future(batcher.search([f"q{i}"], 2)) for i in range(1, 11)]
        await asyncio.sleep(0.01)
        index.gate.set()
        results = await asyncio.gather(first, *rest)
    finally:
        batcher.close()
    assert index.calls == [["q0"], [f"q{i}" for i in range(1, 11)]]
    assert [r[0][0].id for r in results] == [f"q{i}" for i in range(11)]
    assert [len(r[0]) for r in results] == [1] + [2] * 10  # each caller gets its own k


async def test_every_offline_hop_finds_its_passage_in_the_shipped_corpus_top3():
    """What the offline policies need from the local backend: a hop counts as found when its
    passage is in the observation."""
    from searchr1.bm25.shipped import offline_index
    from searchr1.twin.offline_world import load_world

    async with create_search_backend("local", index=offline_index()) as backend:
        for question in load_world():
            for hop in question.hops:
                result = await backend.search(hop.query)
                assert (hop.title, hop.text) in [(i.title, i.content) for i in result.items], hop.query


def test_the_shipped_corpus_is_what_its_generator_produces():
    result = CliRunner().invoke(main, ["index", "offline-corpus", "--check"])
    assert result.exit_code == 0, result.output


@pytest.mark.slow
def test_eval_offline_local_under_the_search_r1_protocol_prints_published_numbers_beside_ours(tmp_path):
    output = tmp_path / "eval.jsonl"
    result = CliRunner().invoke(main, ["eval", "--offline", "--offline-policy", "scripted", "--backend", "local",
                                       "--protocol", "search-r1", "--quiet", "--output", str(output)])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in output.read_text().splitlines()]
    summary = lines[-1]
    assert summary["config"]["search_backend"] == "local" and summary["config"]["protocol"] == "search-r1"
    assert summary["config"]["search_index"].startswith("shipped:corpus.jsonl@")
    assert summary["config"]["rollout"]["max_search_calls"] == 4 and summary["config"]["sampling"]["temperature"] == 0
    searched = [t for t in lines if t.get("type") == "trajectory" and t.get("search_calls")]
    assert searched, "no question searched"
    assert "Search-R1 paper, GRPO *" in result.output and "0.336" in result.output
    assert "Qwen2.5-3B-Instruct" in result.output and "another model" in result.output
    # the offline row is the twin's policy, never the model a live run samples
    assert "ours: twin scripted policy (untrained)" in result.output and "Qwen3.5" not in result.output
    assert "ours (offline, not comparable)" in result.output


@pytest.mark.slow
def test_train_offline_local_runs_on_the_shipped_index_and_finds_hops(tmp_path):
    run = tmp_path / "run"
    result = CliRunner().invoke(main, ["train", "--offline", "--backend", "local", "--max-steps", "3",
                                       "--run-dir", str(run), "--quiet"])
    assert result.exit_code == 0, result.output
    config = json.loads((run / "config.json").read_text())
    assert config["search"]["backend"] == "local" and config["search"]["cassette"] is None
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 3
    assert sum(m["rollout/search_calls"] for m in metrics) > 0
    assert all(m["search/success_rate"] == 1.0 for m in metrics if m["search/requests"])


@pytest.mark.parametrize("flags, message", [
    (["--backend", "deepseek"], "use --backend local"),
    (["--backend", "local", "--temperature", "0.7"], "fixes --temperature 0; drop --temperature 0.7"),
    (["--backend", "local", "--search-topk", "5"], "fixes --search-topk 3"),
])
def test_the_search_r1_protocol_refuses_settings_that_are_not_the_papers(flags, message):
    result = CliRunner().invoke(main, ["eval", "--offline", "--protocol", "search-r1", "--quiet", *flags])
    assert result.exit_code == 2 and message in result.output
