"""The judge of --judge-weight as the step's plug-in: one question per distinct answer, a failure
a verdict with its error (never a reward), a bug a bug, and its usage counted per step."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from searchr1.core.types import RewardResult, SearchExample, Termination, Trajectory
from searchr1.evaluation.judge import Judge, JudgeCache, JudgeError
from searchr1.run.usage import JudgeUsage
from searchr1.training.judging import AnswerJudge


class Backend:
    model = "fake"
    service = "deepseek"

    def __init__(self, fail: Exception | None = None) -> None:
        self.usage = JudgeUsage()
        self.asked: list[str] = []
        self.fail = fail

    async def ask(self, prompt: str) -> str:
        self.asked.append(prompt)
        if self.fail is not None:
            raise self.fail
        self.usage.requests += 1
        self.usage.prompt_tokens += 10
        return "yes" if "PREDICTION: Paris" in prompt else "no"


def answered(question: str, answer: str | None, sample: int = 0) -> Trajectory:
    trajectory = Trajectory(SearchExample(question, f"{question}?", ("Paris",), "nq"), 0, sample, [])
    trajectory.finish(Termination.ANSWER)
    trajectory.reward_result = RewardResult(0.0, answer is not None, False, answer)
    return trajectory


def test_each_distinct_answer_is_asked_once_and_every_trajectory_gets_its_verdict():
    backend = Backend()
    judge = AnswerJudge(Judge(backend, JudgeCache(None)))
    batch = [answered("q", "Paris", 0), answered("q", "Paris", 1), answered("q", "Lyon", 2), answered("q", None, 3)]
    asyncio.run(judge(batch))
    assert len(backend.asked) == 2
    assert [t.verdict.correct if t.verdict else None for t in batch] == [True, True, False, None]
    assert batch[0].verdict.record["model"] == "fake" and batch[0].verdict.error is None
    usage = judge.take_usage()
    assert usage.judge["deepseek"] == JudgeUsage(calls=3, requests=2, prompt_tokens=20)
    assert judge.take_usage().judge["deepseek"] == JudgeUsage()  # taken once
    asyncio.run(judge([answered("q", "Paris")]))  # the cache answers
    assert len(backend.asked) == 2 and judge.take_usage().judge["deepseek"] == JudgeUsage(calls=1)


@pytest.mark.parametrize("failure", [JudgeError("the DeepSeek judge answered HTTP 503"),
                                     httpx.ConnectError("connection refused")])
def test_a_judge_that_fails_gives_a_verdict_with_its_error_and_no_verdict_is_cached(failure):
    backend = Backend(fail=failure)
    cache = JudgeCache(None)
    judge = AnswerJudge(Judge(backend, cache))
    trajectory = answered("q", "Paris")
    asyncio.run(judge([trajectory]))
    assert trajectory.judge_failed and trajectory.env_error
    assert trajectory.verdict.error and "\n" not in trajectory.verdict.error
    assert trajectory.verdict.record == {"model": "fake", "error": trajectory.verdict.error}
    assert cache.entries == {}


def test_a_bug_in_the_judge_is_not_taken_for_a_failure_of_the_service():
    judge = AnswerJudge(Judge(Backend(fail=KeyError("bug")), JudgeCache(None)))
    with pytest.raises(KeyError):
        asyncio.run(judge([answered("q", "Paris")]))
