"""Credit per turn: GiGPO's step-level advantage beside the group's episode-level one, and step
rewards for search. Both are opt-in; by default every turn carries its trajectory's advantage.

``--credit gigpo`` (Feng et al., "Group-in-Group Policy Optimization for LLM Agent Training",
NeurIPS 2025, arXiv 2505.10978; read in verl-agent's ``gigpo/core_gigpo.py``). Per turn ``t``:

    R_t  = r_t + γ R_(t+1)      r_t: the turn's step reward, plus the trajectory's reward on its last turn
    A_t  = A_E + ω A_S(t)       A_E: the trajectory's group-relative advantage (core.advantage)
                                A_S: R_t against the returns of its step group, by --advantage's rule

A step group is the turns of one question's group that start from the same *anchor state*: the
environment has shown them the same things, in the same order (each earlier call's tool, its
arguments normalised, and the observation it returned), whatever the model wrote around them. All
first turns share one (the question alone). A step group of one turn, or whose returns are all
equal, adds nothing (A_S = 0); a group that trains on nothing (degenerate, an environment failure,
a sampler error) stays at 0, as without step credit. ω (``--step-weight``) and γ (``--discount``)
default to verl-agent's search recipe: 1.0 and 0.95.

``--step-reward evidence`` (after StepSearch, arXiv 2505.15107, simplified to what a search agent
can tell without a retriever's scores): a turn whose tool result shows a reference answer for the
first time in its trajectory earns ``--evidence-bonus``; each call repeating an earlier call of
the trajectory (same tool, same normalised arguments) costs ``--repeat-penalty``. Step rewards
enter the returns above, so they move a turn's advantage only under ``--credit gigpo``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from searchr1.core.advantage import AdvantageMode, group_advantages, group_by_question
from searchr1.core.reward import normalize_answer
from searchr1.core.types import Trajectory


class Credit(StrEnum):
    """How a trajectory's reward is shared among its turns."""

    TRAJECTORY = "trajectory"  # every turn carries the trajectory's advantage (Search-R1, GRPO)
    GIGPO = "gigpo"  # plus the turn's step-level advantage within its anchor state's group


class StepReward(StrEnum):
    """What a turn earns on its own, besides the trajectory's final reward."""

    NONE = "none"
    EVIDENCE = "evidence"  # a first sight of a reference answer, less a penalty per repeated call


def call_key(tool: str, arguments: str) -> tuple[str, str]:
    """A call as its tool and its arguments as shown (a record's ``query``), case and spacing aside."""
    return tool, " ".join(arguments.casefold().split())


def anchor_state(trajectory: Trajectory, turn: int) -> Hashable:
    """What the environment has shown the trajectory before its ``turn``: each earlier call, as
    :func:`call_key`, with whether it succeeded and the observation it returned."""
    return tuple((*call_key(call.tool, call.query), call.ok, call.observation)
                 for earlier in trajectory.turns[:turn] for call in earlier.calls)


def shows_a_reference(observation: str, answers: Sequence[str]) -> bool:
    """A reference answer (normalised as the reward normalises it, and not empty) occurs in the
    normalised observation."""
    shown = normalize_answer(observation)
    return any((reference := normalize_answer(answer)) and reference in shown for answer in answers)


@dataclass
class StepRewards:
    """What the step rewards of a batch came to, for the metrics."""

    trajectories: int
    evidence: int = 0  # trajectories that saw a reference answer
    repeats: int = 0  # calls that repeated an earlier call of their trajectory
    total: float = 0.0  # every step reward, summed

    def metrics(self) -> dict[str, float]:
        """``reward/step`` (per trajectory), ``reward/step_evidence`` (share of trajectories) and
        ``reward/step_repeats`` (repeated calls per trajectory)."""
        n = max(self.trajectories, 1)
        return {"reward/step": self.total / n, "reward/step_evidence": self.evidence / n,
                "reward/step_repeats": self.repeats / n}


def assign_step_rewards(trajectories: Sequence[Trajectory], *, evidence_bonus: float,
                        repeat_penalty: float) -> StepRewards:
    """Set every turn's ``reward``: ``evidence_bonus`` for the first turn whose tool result shows a
    reference answer, minus ``repeat_penalty`` per call that repeats an earlier one (refused
    calls ran nothing: they count for neither)."""
    summary = StepRewards(len(trajectories))
    for trajectory in trajectories:
        made: set[tuple[str, str]] = set()
        found = False
        for turn in trajectory.turns:
            reward = 0.0
            for call in (call for call in turn.calls if not call.refused):
                key = call_key(call.tool, call.query)
                if key in made:
                    reward -= repeat_penalty
                    summary.repeats += 1
                made.add(key)
                if not found and call.ok and shows_a_reference(call.observation, trajectory.example.answers):
                    found = True
                    reward += evidence_bonus
            turn.reward = reward
            summary.total += reward
        summary.evidence += found
    return summary


def discounted_returns(trajectory: Trajectory, discount: float) -> list[float]:
    """``R_t = r_t + discount * R_(t+1)`` for every turn, the trajectory's reward counted on its
    last turn."""
    returns: list[float] = []
    ahead = 0.0
    for index in reversed(range(len(trajectory.turns))):
        earned = trajectory.turns[index].reward or 0.0
        ahead = earned + (trajectory.reward if index == len(trajectory.turns) - 1 else 0.0) + discount * ahead
        returns.append(ahead)
    return returns[::-1]


@dataclass(frozen=True)
class StepGroups:
    """How the step groups of a batch came out: turns that train, and how many shared a group."""

    turns: int
    grouped: int  # turns in a step group of two or more
    sizes: int  # the sum of each trained turn's step-group size

    def metrics(self) -> dict[str, float]:
        """``credit/step_group_share`` and ``credit/step_group_size`` (means over trained turns)."""
        if not self.turns:
            return {"credit/step_group_share": 0.0, "credit/step_group_size": 0.0}
        return {"credit/step_group_share": self.grouped / self.turns, "credit/step_group_size": self.sizes / self.turns}


def assign_step_advantages(trajectories: Sequence[Trajectory], *, mode: AdvantageMode, weight: float,
                           discount: float,
                           anchor: Callable[[Trajectory, int], Hashable] = anchor_state) -> StepGroups:
    """GiGPO: add ``weight`` times each turn's step-level advantage to the advantage it carries
    (its trajectory's, set by :func:`searchr1.core.advantage.assign_group_advantages` first), and
    record its step group's size. Step groups never cross questions: they are formed within each
    question's group, among the trajectories that train (``excluded`` is None)."""
    turns = grouped = sizes = 0
    for group in group_by_question(trajectories).values():
        steps: dict[Hashable, list[tuple[Trajectory, int, float]]] = {}
        for trajectory in (t for t in group if t.excluded is None):
            for index, value in enumerate(discounted_returns(trajectory, discount)):
                steps.setdefault(anchor(trajectory, index), []).append((trajectory, index, value))
        for members in steps.values():
            returns = [value for _, _, value in members]
            step = (group_advantages(returns, mode=mode) if len(members) > 1 and len(set(returns)) > 1
                    else [0.0] * len(members))
            for (trajectory, index, _), advantage in zip(members, step, strict=True):
                turn = trajectory.turns[index]
                turn.advantage = trajectory.advantage + weight * advantage
                turn.step_group = len(members)
            turns += len(members)
            grouped += len(members) if len(members) > 1 else 0
            sizes += len(members) ** 2
    return StepGroups(turns, grouped, sizes)
