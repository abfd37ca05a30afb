"""The judge of ``--judge MODEL --judge-weight W`` as the core step's plug-in
(:data:`searchr1.core.trainer.JudgeAnswers`): it sets each answered trajectory's
:class:`~searchr1.core.types.Verdict`, which :func:`searchr1.core.shaping.assign_judge_rewards`
mixes into its reward.

The judge is :mod:`searchr1.evaluation.judge`'s, with its prompt, its cache and its backends (the
twin's rule offline through the real pytrio client, DeepSeek, or a PyTRIO model). A step asks once
per distinct (question, gold answers, answer); the cache answers what any earlier step, resume or
eval asked already. A judge that fails on an answer (:class:`~searchr1.evaluation.judge.JudgeError`,
or the service failing) gives that answer a verdict with its ``error``: an environment failure,
whose group the step leaves out, never a reward. What the judge did is counted per step
(:class:`~searchr1.run.usage.JudgeUsage`: answers judged, requests sent, their tokens).
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict

from searchr1.core.types import Trajectory, Verdict
from searchr1.basics.json_types import JsonObject
from searchr1.evaluation.judge import Judge, JudgeError
from searchr1.run.usage import JudgeUsage, Usage
from searchr1.runtime.failures import describe_failure, is_service_failure


class AnswerJudge:
    """Sets the judge's verdict on answered trajectories; :meth:`take_usage` gives what it used."""

    def __init__(self, judge: Judge) -> None:
        self.judge = judge
        self.calls = 0

    async def __call__(self, trajectories: list[Trajectory]) -> None:
        distinct: dict[tuple[str, tuple[str, ...], str], list[Trajectory]] = {}
        for trajectory in trajectories:
            answer = trajectory.score.answer
            if answer is not None:
                example = trajectory.example
                distinct.setdefault((example.question, example.answers, answer), []).append(trajectory)
        verdicts = await asyncio.gather(*(self.verdict(*key) for key in distinct))
        for group, verdict in zip(distinct.values(), verdicts, strict=True):
            for trajectory in group:
                trajectory.verdict = verdict
            self.calls += len(group)

    async def verdict(self, question: str, gold: tuple[str, ...], answer: str) -> Verdict:
        """The judge's verdict on one answer, or the failure that kept it from one."""
        try:
            judgement = await self.judge.judge(question, gold, answer)
        except Exception as error:
            if not isinstance(error, JudgeError) and not is_service_failure(error):
                raise
            why = str(error) if isinstance(error, JudgeError) else f"the judge failed ({describe_failure(error)})"
            failed: JsonObject = {"model": self.judge.model, "error": why}
            return Verdict(False, error=why, record=failed)
        record: JsonObject = {key: value for key, value in asdict(judgement).items()
                              if isinstance(value, str | bool | int)}
        return Verdict(judgement.correct, record=record)

    def take_usage(self) -> Usage:
        """What the judge did since the last call: answers judged, requests sent and their tokens."""
        backend = self.judge.backend
        used = JudgeUsage(calls=self.calls)
        used.add(backend.usage)
        self.calls, backend.usage = 0, JudgeUsage()
        usage = Usage()
        usage.judge[backend.service] = used
        return usage
