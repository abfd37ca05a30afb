"""The eval judge: its prompt and verdicts, its cache, the twin's rule, DeepSeek record and replay."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from searchr1.evaluation.judge import (
    JUDGE_PROMPT_HEADER,
    JUDGE_PROMPT_VERSION,
    DeepSeekJudge,
    Judge,
    JudgeCache,
    cache_key,
    judge_prompt,
    parse_verdict,
    prediction_of,
)
from searchr1.evaluation.judge_recording import RecordingTransport
from searchr1.run.usage import JudgeUsage
from searchr1.evaluation.metrics import evaluation_metrics
from searchr1.search.replay import CassetteTransport
from searchr1.basics.secrets import Secret
from searchr1.twin import judge as twin_judge
from eval_records import record

KEY = "sk-judge-test-secret-0123456789"


class CountingJudge:
    model = "counting"
    service = "pytrio"

    def __init__(self, reply: str = "yes") -> None:
        self.asked: list[str] = []
        self.reply = reply
        self.usage = JudgeUsage()

    async def ask(self, prompt: str) -> str:
        self.asked.append(prompt)
        return self.reply


def test_the_twin_recognises_the_prompt_the_eval_sends():
    assert twin_judge.HEADER == JUDGE_PROMPT_HEADER
    assert judge_prompt("Q?", ["a"], "b").startswith(JUDGE_PROMPT_HEADER)


@pytest.mark.parametrize("gold, prediction, verdict", [
    (["Arnold Spielberg"], "Arnold Spielberg", True),
    (["Arnold Spielberg"], "Spielberg", True),
    (["Arnold Spielberg"], "Max Spielberg", False),
    (["Arnold Spielberg"], "Steven Spielberg's father, Arnold Spielberg", True),
    (["The Kenyan shilling", "shilling"], "Kenyan shillings", False),
    (["1969"], "in 1969", True),
    (["Paris"], "", False),
])
def test_the_twin_rule(gold, prediction, verdict):
    assert twin_judge.rule(gold, prediction) is verdict


@given(st.text(max_size=20))
def test_the_twin_rule_accepts_every_gold_answer_itself(answer):
    """Invariant: a prediction equal to a gold answer (with any normalised tokens) is judged yes."""
    from searchr1.core.reward import normalize_answer

    if normalize_answer(answer).split():
        assert twin_judge.rule([answer], answer)


@pytest.mark.parametrize("reply, verdict", [("yes", True), ("Yes.", True), (" YES - same", True), ("no", False),
                                            ("Not sure", False), ("", False), ("yesterday", False)])
def test_parse_verdict(reply, verdict):
    assert parse_verdict(reply) is verdict


def test_the_cache_key_changes_with_each_of_its_five_parts():
    base = ("q", ["g"], "p", "m", 1)
    keys = {cache_key(*base)}
    for index, other in enumerate(("q2", ["g2"], "p2", "m2", 2)):
        changed = list(base)
        changed[index] = other
        keys.add(cache_key(*changed))
    assert len(keys) == 6


def test_judgements_are_cached_and_an_unanswered_record_is_not_asked(tmp_path):
    records = [record("nq", 0, True, 1.0, True), record("nq", 1, False, 0.0, False)]
    records[1]["termination"] = "search_budget"
    backend = CountingJudge()
    cache_file = tmp_path / "cache.jsonl"
    asyncio.run(Judge(backend, JudgeCache(cache_file)).annotate(records))
    assert len(backend.asked) == 1
    assert records[0]["judge"]["correct"] is True and records[0]["judge"]["cached"] is False
    assert records[1]["judge"] == {"correct": False, "reply": "", "model": "counting",
                                   "prompt_version": JUDGE_PROMPT_VERSION, "cached": False, "asked": False}
    again = [dict(r, judge=None) for r in records]
    second = CountingJudge(reply="no")
    asyncio.run(Judge(second, JudgeCache(cache_file)).annotate(again))
    assert second.asked == [] and again[0]["judge"]["correct"] is True and again[0]["judge"]["cached"] is True


def test_judge_metrics_sit_beside_em_per_source_and_macro():
    records = [record("nq", i, True, 1.0, True) for i in range(4)] + [record("popqa", 9, False, 0.0, False)]
    for index, r in enumerate(records):
        r["judge"] = {"correct": index % 2 == 0, "model": "m", "prompt_version": 1}
    metrics = evaluation_metrics(records)
    assert metrics["judge/nq"] == 0.5 and metrics["judge/popqa"] == 1.0
    assert metrics["judge/macro"] == 0.75
    assert metrics["judge/macro_ci95_low"] <= 0.75 <= metrics["judge/macro_ci95_high"]
    del records[0]["judge"]
    assert "judge/macro" not in evaluation_metrics(records)


def test_prediction_of_takes_the_last_answer_line():
    r = record("nq", 0, True, 1.0, True)
    r["final_text"] = "thinking\nAnswer: first\nAnswer: second"
    assert prediction_of(r) == "second"


def fake_deepseek(request: httpx.Request) -> httpx.Response:
    assert request.headers["Authorization"] == f"Bearer {KEY}"
    prompt = json.loads(request.content)["messages"][0]["content"]
    verdict = "yes" if "PREDICTION: Paris" in prompt else "no"
    return httpx.Response(200, json={"choices": [{"message": {"role": "assistant", "content": verdict}}],
                                     "usage": {"prompt_tokens": 50, "completion_tokens": 1}})


def test_a_deepseek_judge_recorded_live_replays_offline_without_its_key(tmp_path):
    cassette = tmp_path / "judge.yaml"
    questions = [("Capital of France?", ["Paris"], "Paris"), ("Capital of Peru?", ["Lima"], "Cusco")]

    async def live() -> list[bool]:
        transport = RecordingTransport(cassette, secrets=[Secret(KEY)], inner=httpx.MockTransport(fake_deepseek))
        judge = Judge(DeepSeekJudge("deepseek-chat", httpx.AsyncClient(transport=transport), Secret(KEY)),
                      JudgeCache(None))
        verdicts = [(await judge.judge(*q)).correct for q in questions]
        await judge.backend.aclose()
        return verdicts

    async def replay() -> list[bool]:
        client = httpx.AsyncClient(transport=CassetteTransport(cassette))
        judge = Judge(DeepSeekJudge("deepseek-chat", client, None), JudgeCache(None))
        verdicts = [(await judge.judge(*q)).correct for q in questions]
        await judge.judge(*questions[0])  # cached: not a request
        await client.aclose()
        assert judge.backend.usage == JudgeUsage(requests=2, prompt_tokens=100, generated_tokens=2)
        return verdicts

    assert asyncio.run(live()) == [True, False]
    assert KEY not in cassette.read_text("utf-8")
    assert asyncio.run(replay()) == [True, False]


def test_a_second_recording_adds_to_the_cassette_and_a_miss_is_a_judge_error(tmp_path):
    """A resumed run records into the cassette its first part wrote: both parts' answers replay.
    A prompt the cassette never recorded is the judge's error (one line), not the replay's."""
    from searchr1.evaluation.judge import JudgeError
    from searchr1.search.replay import CassetteFormatError

    cassette = tmp_path / "judge.yaml"

    async def record_one(question: tuple[str, list[str], str]) -> None:
        transport = RecordingTransport(cassette, secrets=[Secret(KEY)], inner=httpx.MockTransport(fake_deepseek))
        judge = Judge(DeepSeekJudge("deepseek-chat", httpx.AsyncClient(transport=transport), Secret(KEY)),
                      JudgeCache(None))
        await judge.judge(*question)
        await judge.backend.aclose()

    async def replay(question: tuple[str, list[str], str]) -> bool:
        client = httpx.AsyncClient(transport=CassetteTransport(cassette))
        try:
            judge = Judge(DeepSeekJudge("deepseek-chat", client, None), JudgeCache(None))
            return (await judge.judge(*question)).correct
        finally:
            await client.aclose()

    first, second = ("Capital of France?", ["Paris"], "Paris"), ("Capital of Peru?", ["Lima"], "Cusco")
    asyncio.run(record_one(first))
    asyncio.run(record_one(second))
    assert [asyncio.run(replay(first)), asyncio.run(replay(second))] == [True, False]
    with pytest.raises(JudgeError, match="holds no answer to this prompt"):
        asyncio.run(replay(("Capital of Chile?", ["Santiago"], "Santiago")))
    cassette.write_text("not: [a cassette", "utf-8")
    with pytest.raises(CassetteFormatError, match="is not a cassette to add to"):
        RecordingTransport(cassette, secrets=[Secret(KEY)])


def test_an_http_error_from_deepseek_is_one_line_without_the_key():
    from searchr1.evaluation.judge import JudgeError

    client = httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(401, text=KEY)))
    with pytest.raises(JudgeError) as raised:
        asyncio.run(DeepSeekJudge("deepseek-chat", client, Secret(KEY)).ask("x"))
    assert KEY not in str(raised.value) and "401" in str(raised.value)


def test_the_judge_prompt_is_in_the_docs():
    docs = (Path(__file__).resolve().parents[2] / "docs" / "after-training.md").read_text("utf-8")
    assert judge_prompt("{question}", ["GOLD"], "{prediction}").split("\n")[0] in docs
