"""Both servers under a bounded hostile load on 127.0.0.1 (large uploads at once plus many
clients sending one header line at a time), scaled down to a few seconds: the server's RSS
stays within its documented bound and every slow client is dropped within the request
deadline. ``python -m searchr1.bench.hostile_load load ...`` runs the full load."""

from __future__ import annotations

from searchr1.bench.hostile_load import MIB, LoadShape, measure
from searchr1.bm25.corpus import passage_row
from searchr1.bm25.index import build_index

DEADLINE = 1.0  # the servers' request deadline in this test (seconds)
SHAPE = LoadShape(uploads=8, upload_bytes=8 * MIB, slow_clients=100, header_every=0.3, run_for=15.0)
TWIN_BUDGET = 8 * MIB  # the twin's total body budget (and cap per body) in this test


def assert_slow_clients_dropped_in_time(report) -> None:
    assert report.slow_held == 0, report
    assert report.slow_dropped == SHAPE.slow_clients
    assert report.slowest_drop < DEADLINE + 2.0, report


def test_the_retriever_keeps_its_memory_bound_and_drops_slow_clients(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(passage_row(f"d{i}", f"T{i}", f"passage {i}") for i in range(20)), "utf-8")
    build_index(corpus, tmp_path / "index")
    report = measure("retriever", SHAPE, request_timeout=DEADLINE, body_budget=0, index=tmp_path / "index")
    assert set(report.upload_answers) == {"HTTP/1.1 413 Request Entity Too Large"}, report
    assert report.rss_growth < 48 * MIB, report  # 8 bodies of at most 1 MiB, plus connection buffers
    assert_slow_clients_dropped_in_time(report)


def test_the_twin_keeps_its_memory_within_its_body_budget_and_drops_slow_clients():
    report = measure("twin", SHAPE, request_timeout=DEADLINE, body_budget=TWIN_BUDGET)
    assert len(report.upload_answers) == SHAPE.uploads
    refusals = {answer.split(" ")[1] for answer in report.upload_answers if answer != "closed"}
    assert refusals <= {"400", "503"}, report
    assert report.rss_growth < 2 * TWIN_BUDGET + 48 * MIB, report  # a body and its decoded text
    assert_slow_clients_dropped_in_time(report)
