"""The probe runner and its file: one line per question as it finishes, resumed by id, refused
when other settings made it, stopped before a chunk that would pass the budget, read back by
``train --probe`` (one line naming the fault for anything else)."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchr1.core.types import SearchExample
from searchr1.evaluation.probe import CHUNK, ProbeFileError, probe_dataset, read_probe
from searchr1.run.costs import Budget
from searchr1.run.usage import Usage

CONFIG = {"policy": "twin learning policy (untrained)", "attempts": 4, "code_version": {"searchr1": "x"}}


class FakeRunner:
    """Answers question ``i`` closed-book right ``i % 5`` times of 4, and counts what it probed."""

    def __init__(self, fail: frozenset[str] = frozenset()) -> None:
        self.probed: list[str] = []
        self.fail = fail

    async def question(self, position: int, example: SearchExample) -> tuple[dict[str, object], Usage] | None:
        self.probed.append(example.id)
        if example.id in self.fail:
            return None
        usage = Usage(sample_requests=2, sample_prompt_tokens=100, sample_generated_tokens=20)
        line = {"type": "question", "id": example.id, "question": example.question, "position": position,
                "closed_book": {"right": position % 5, "attempts": 4, "env_failures": 0},
                "with_tools": {"right": 4, "attempts": 4, "env_failures": 0}, "usage": usage.kinds()}
        return line, usage


def examples(count: int) -> list[SearchExample]:
    return [SearchExample(f"q{i}", f"question {i}?", ("a",), "nq") for i in range(count)]


def run(runner: FakeRunner, data: list[SearchExample], path, **options) -> object:
    return asyncio.run(probe_dataset(runner, data, path, CONFIG, **options))  # type: ignore[arg-type]


def test_a_probe_writes_every_question_then_a_summary_and_reads_back(tmp_path):
    path = tmp_path / "p.jsonl"
    outcome = run(FakeRunner(), examples(11), path)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["type"] for line in lines] == ["probe_config"] + ["question"] * 11 + ["summary"]
    assert lines[-1]["partial"] is False and lines[-1]["usage"]["sample_requests"] == 22
    probe = read_probe(path)
    assert probe.config["policy"] == CONFIG["policy"] and probe.questions["q3"].closed_book.right == 3
    assert outcome.probed == 11


def test_a_resumed_probe_skips_what_it_holds_and_refuses_other_settings(tmp_path):
    path = tmp_path / "p.jsonl"
    first = FakeRunner(fail=frozenset({"q2", "q5"}))
    outcome = run(first, examples(6), path)
    assert outcome.failed == ["q2", "q5"] and json.loads(path.read_text().splitlines()[-1])["partial"] is True
    again = FakeRunner()
    run(again, examples(6), path)
    assert again.probed == ["q2", "q5"]
    assert list(read_probe(path).questions) == [f"q{i}" for i in range(6)]  # dataset order
    with pytest.raises(ProbeFileError, match=r"other settings \(attempts differ\)"):
        asyncio.run(probe_dataset(FakeRunner(), examples(6), path, {**CONFIG, "attempts": 8}))  # type: ignore[arg-type]


def test_the_budget_stops_before_a_chunk_projected_to_pass_it(tmp_path):
    """Each question costs 120 tokens: after the first chunk (CHUNK questions), a budget that leaves
    less than another chunk's worth stops the probe, every finished question kept."""
    path = tmp_path / "p.jsonl"
    budget = Budget(tokens=120 * CHUNK + 120 * CHUNK // 2)
    outcome = run(FakeRunner(), examples(3 * CHUNK), path, budget=budget)
    assert outcome.budget is not None and outcome.budget.what == "tokens"
    assert outcome.probed == CHUNK and len(read_probe(path).questions) == CHUNK


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=30), st.just('{"type": "question"}'),
                          st.just('{"type": "question", "id": "a", "question": "q", "closed_book": {"right": 9, '
                                  '"attempts": 4}, "with_tools": {"right": 0, "attempts": 4}}'),
                          st.just('{"type": "probe_config", "config": {}}')), max_size=5))
def test_a_bad_probe_file_is_one_line_naming_the_file(tmp_path_factory, lines):
    """Whatever the file holds, reading it gives a probe or a ProbeFileError naming the file."""
    path = tmp_path_factory.mktemp("probe") / "p.jsonl"
    path.write_text("\n".join(lines), "utf-8")
    try:
        read_probe(path)
    except ProbeFileError as error:
        assert str(path) in str(error) and "\n" not in str(error)
