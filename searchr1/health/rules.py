"""Health rules, the collapse guard and the last healthy checkpoint (pure functions).

Every step's metrics line is judged by :data:`DEFAULT_RULES` (thresholds overridable with
``train --health-rule NAME=VALUE`` or ``NAME=off``). A step that breaks any rule is
*unhealthy*: its line records ``health/unhealthy = 1`` and one text per broken rule under
``health/warnings``, and the trainer prints one warning line. ``--stop-on-collapse N`` stops
the run after N consecutive unhealthy steps (:class:`CollapseGuard`), and
:func:`last_healthy_checkpoint` says where to restart from.

Low entropy alone is not collapse: a policy that is certain and right samples with entropy
near 0 too. The ``entropy`` rule therefore counts only on a *falling* step, one whose
``reward/mean`` or ``reward/format`` lies more than :data:`FALL_MARGIN` below the best
``REWARD_WINDOW``-step rolling mean of the steps before it (``health/reward_drop``,
``health/format_drop``). The collapse reports behind the rules (reward rises, then falls;
format validity drops first; entropy collapses toward 0) describe entropy falling *with* the
reward, never on its own. A non-finite entropy counts on any step.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from searchr1.core.settings import key_value
from searchr1.basics import invocation
from searchr1.basics.json_types import as_int

REWARD_WINDOW = 5  # steps in the rolling mean the reward_drop rule compares against
FALL_MARGIN = 0.1  # a step falls when its reward or format is this far below the best rolling mean
FALLING_METRICS = ("health/reward_drop", "health/format_drop")

Entry = TypeVar("Entry", bound=Mapping[str, object])  # a checkpoints.jsonl record, handed back as it came


@dataclass(frozen=True)
class HealthRule:
    name: str
    metric: str  # the metrics-line key it reads
    direction: str  # "below": unhealthy when value < threshold; "above": when value > threshold
    threshold: float
    meaning: str
    only_when_falling: bool = False  # counts only on a step whose reward or format falls (FALL_MARGIN)

    def broken_by(self, value: float) -> bool:
        if not math.isfinite(value):
            return True
        return value < self.threshold if self.direction == "below" else value > self.threshold


def is_falling(metrics: Mapping[str, object]) -> bool:
    """Whether the step's reward or format lies more than :data:`FALL_MARGIN` below the best
    rolling mean of the steps before it (False before there are ``REWARD_WINDOW`` of them)."""
    drops = (metrics.get(name) for name in FALLING_METRICS)
    return any(isinstance(drop, (int, float)) and float(drop) > FALL_MARGIN for drop in drops)


DEFAULT_RULES: tuple[HealthRule, ...] = (
    HealthRule("format_valid_rate", "reward/format", "below", 0.1,
               "share of trajectories whose final reply has one Answer: line"),
    HealthRule("answer_rate", "rollout/termination/answer", "below", 0.1,
               "share of trajectories that ended with a scorable answer (not a reply without one, a budget or an "
               "invalid call)"),
    HealthRule("entropy", "health/entropy", "below", 1e-4,
               "mean -logprob of the sampled action tokens, nats per token; counts only while reward or "
               f"format falls more than {FALL_MARGIN:g} below its best {REWARD_WINDOW}-step mean",
               only_when_falling=True),
    HealthRule("mismatch_k3", "health/mismatch_k3", "above", 0.1,
               "k3 estimate of KL(sampler || learner) over the trained tokens"),
    HealthRule("repeated_turns", "health/repeated_turn_share", "above", 0.5,
               "share of assistant turns that repeat an earlier turn of their trajectory"),
    HealthRule("reward_drop", "health/reward_drop", "above", 0.5,
               f"best {REWARD_WINDOW}-step rolling mean of reward/mean so far minus this step's reward/mean"),
)
RULE_NAMES = tuple(rule.name for rule in DEFAULT_RULES)


def configured_rules(overrides: Mapping[str, float | None]) -> tuple[HealthRule, ...]:
    """The default rules with thresholds replaced (a value) or the rule turned off (None)."""
    unknown = sorted(set(overrides) - set(RULE_NAMES))
    if unknown:
        raise ValueError(f"unknown health rule {unknown[0]!r}; the rules are {', '.join(RULE_NAMES)}")
    rules = []
    for rule in DEFAULT_RULES:
        if rule.name not in overrides:
            rules.append(rule)
        elif (threshold := overrides[rule.name]) is not None:
            rules.append(dataclasses.replace(rule, threshold=float(threshold)))
    return tuple(rules)


def parse_rule_override(text: str) -> tuple[str, float | None]:
    """``NAME=VALUE`` or ``NAME=off`` (the ``--health-rule`` flag)."""
    name, value = key_value(text, "--health-rule", "NAME=VALUE or NAME=off")
    if name not in RULE_NAMES:
        raise ValueError(f"--health-rule {text!r}: unknown rule {name!r}; the rules are {', '.join(RULE_NAMES)}")
    if value.lower() == "off":
        return name, None
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"--health-rule {text!r}: {value!r} is neither a number nor 'off'") from None
    if not math.isfinite(number):
        raise ValueError(f"--health-rule {text!r}: the threshold must be finite")
    return name, number


def best_rolling_mean(values: Sequence[float], window: int = REWARD_WINDOW) -> float | None:
    """The largest mean of ``window`` consecutive values (None when there are fewer)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if len(values) < window:
        return None
    return max(math.fsum(values[i:i + window]) / window for i in range(len(values) - window + 1))


def reward_drop(previous_rewards: Sequence[float], reward: float, window: int = REWARD_WINDOW) -> float | None:
    """How far this step's reward is below the best rolling mean of the steps before it."""
    best = best_rolling_mean(previous_rewards, window)
    return None if best is None else best - reward


@dataclass(frozen=True)
class Violation:
    rule: HealthRule
    value: float

    def describe(self) -> str:
        sign = "<" if self.rule.direction == "below" else ">"
        text = f"{self.rule.name} {self.value:.4g} {sign} {self.rule.threshold:g} ({self.rule.metric})"
        return text + (" while reward or format falls" if self.rule.only_when_falling and math.isfinite(self.value)
                       else "")


def check_health(metrics: Mapping[str, object], rules: Sequence[HealthRule]) -> list[Violation]:
    """The rules the metrics break; a rule whose metric is absent (e.g. no update ran, so no
    mismatch was measured) is not evaluated, and a finite value of an ``only_when_falling`` rule
    counts only on a falling step (:func:`is_falling`)."""
    found = []
    falling = is_falling(metrics)
    for rule in rules:
        value = metrics.get(rule.metric)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not rule.broken_by(float(value)):
            continue
        if rule.only_when_falling and math.isfinite(value) and not falling:
            continue
        found.append(Violation(rule, float(value)))
    return found


def is_unhealthy(line: Mapping[str, object]) -> bool:
    """Whether a metrics line was judged unhealthy (lines from before the guard count as healthy)."""
    return bool(line.get("health/unhealthy"))


@dataclass
class HealthVerdict:
    violations: list[Violation]
    streak: int  # consecutive unhealthy steps ending with this one
    stop: bool  # the guard asks the run to stop

    @property
    def unhealthy(self) -> bool:
        return bool(self.violations)

    def metrics(self) -> dict[str, float]:
        return {"health/unhealthy": float(self.unhealthy), "health/unhealthy_streak": float(self.streak)}

    def warnings(self) -> list[str]:
        return [v.describe() for v in self.violations]


class CollapseGuard:
    """Judges each step and counts consecutive unhealthy ones; ``stop_after`` (0: never) of
    them in a row make :attr:`HealthVerdict.stop` true. ``history`` is the metrics lines of the
    steps before the first one it will see (a resumed run's earlier steps)."""

    def __init__(self, rules: Sequence[HealthRule], *, stop_after: int = 0,
                 history: Sequence[Mapping[str, object]] = ()) -> None:
        if stop_after < 0:
            raise ValueError(f"stop_after must be >= 0, got {stop_after}")
        self.rules = tuple(rules)
        self.stop_after = stop_after
        self.rewards = [float(value) for value in (line.get("reward/mean") for line in history)
                        if isinstance(value, (int, float))]
        self.formats = [float(value) for value in (line.get("reward/format") for line in history)
                        if isinstance(value, (int, float))]
        self.streak = 0
        for line in history:
            self.streak = self.streak + 1 if is_unhealthy(line) else 0

    def observe(self, metrics: dict[str, float]) -> HealthVerdict:
        """Judge one step; adds ``health/reward_drop`` and ``health/format_drop`` to ``metrics``
        once there is history."""
        for source, drop_name, seen in (("reward/mean", "health/reward_drop", self.rewards),
                                        ("reward/format", "health/format_drop", self.formats)):
            value = metrics.get(source)
            if isinstance(value, (int, float)):
                drop = reward_drop(seen, float(value))
                if drop is not None:
                    metrics[drop_name] = drop
                seen.append(float(value))
        violations = check_health(metrics, self.rules)
        self.streak = self.streak + 1 if violations else 0
        return HealthVerdict(violations, self.streak, bool(self.stop_after) and self.streak >= self.stop_after)


def last_healthy_checkpoint(
    checkpoints: Sequence[Entry], lines: Sequence[Mapping[str, object]], *, before_step: int,
    max_steps_off_policy: int = 0,
) -> Entry | None:
    """The latest checkpoint whose weights sampled only healthy batches before ``before_step``
    (the first step of the unhealthy streak). The weights after K steps first sample the batch
    of step ``K + max_steps_off_policy``, so that step must come before the streak and have
    been healthy."""
    by_step = {step: line for line in lines if isinstance(step := line.get("step"), int)}
    best: Entry | None = None
    for entry in checkpoints:
        if not entry.get("state_path"):
            continue
        first_sampled = as_int(entry["step"], "step") + max_steps_off_policy
        if first_sampled >= before_step:
            continue
        if first_sampled in by_step and is_unhealthy(by_step[first_sampled]):
            continue
        if best is None or as_int(entry["step"], "step") >= as_int(best["step"], "step"):
            best = entry
    return best


def collapse_report(run_path: Path | str, *, completed: int, streak: int, stop_on_collapse: int,
                    healthy: Mapping[str, object] | None) -> tuple[str, int | None]:
    """What ``--stop-on-collapse`` prints when it stops a run after ``completed`` steps, the last
    ``streak`` of them unhealthy, and the step to restart from (None without a healthy checkpoint)."""
    first_bad = completed - streak
    message = (f"collapse guard: steps {first_bad}..{completed - 1} were unhealthy ({streak} in a row, "
               f"--stop-on-collapse {stop_on_collapse}); stopped after step {completed - 1} and saved "
               f"a checkpoint of step {completed} in {run_path}.\n"
               f"What the model did: {invocation.command(f'show {run_path} --step {first_bad}')}\n")
    if healthy is None:
        return message + ("no checkpoint before the unhealthy steps was saved (a smaller --save-every keeps more); "
                          "start a new run with other settings"), None
    restart = as_int(healthy["step"], "step")
    return message + (f"last healthy checkpoint: {healthy['name']} (step {restart}); continue from it "
                      f"(add flags to change, e.g. --learning-rate) with:\n"
                      + invocation.command(f"train --resume {run_path} --from-step {restart}")), restart
