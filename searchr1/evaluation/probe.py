"""The probe of a dataset (``probe-data``): how often a policy answers each question right
without any tool (closed-book) and with the run's tools, ``N`` attempts each.

Why: a question the policy already answers without searching teaches it nothing about search and
rewards guessing (the RLVR chapter's "hackable" prompts, Kimi k1.5: answered right within N = 8
tries without reasoning, removed); one it always solves with tools only takes room in the batch.
``train --probe FILE`` reads the file to drop such questions (:mod:`searchr1.training.filters`)
and to start its curriculum from the pass rates (:mod:`searchr1.training.curriculum`).

An attempt is *right* when its answer matches a reference exactly (EM, the Search-R1 metric). A
closed-book attempt is one turn with no tool offered (the system prompt says so:
:data:`searchr1.core.protocol.CLOSED_BOOK_PROMPT`); a call it makes anyway is refused. Attempts
whose search or tool failed are left out of the counts (``env_failures`` says how many).

File (JSONL; written beside the dataset unless ``--output`` says otherwise)::

    {"type": "probe_config", "config": {...}}     # the policy, its settings, the dataset's sha256
    {"type": "question", "id": ..., "closed_book": {"right": k, "attempts": n, ...},
     "with_tools": {...}, "usage": {...}}         # one per question, in dataset order
    {"type": "summary", ...}                      # counts, mean pass rates, usage (and cost)

Each question's line is appended and synced as soon as both its attempts are in, so a killed
probe keeps every finished question; the same command resumes it (questions recorded are
skipped; another configuration is refused unless ``overwrite``). Seeds: question ``i`` (its
position in the dataset) is rolled out as step ``i``, its closed-book attempts as question index
0 and its attempts with tools as index 1, so a resumed probe records what an uninterrupted one
would. Questions whose sampling failed are not recorded (a rerun retries them).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from searchr1.basics.json_types import JsonObject, as_float, as_int, as_object, as_str
from searchr1.core.budgets import InvalidCallPolicy
from searchr1.core.errors import UserError
from searchr1.core.reward import score_trajectories
from searchr1.core.rollout import RolloutConfig, rollout_batch_async
from searchr1.core.tools import ToolBackend
from searchr1.core.types import SamplingClient, SearchExample, Tokenizer, Trajectory
from searchr1.evaluation.evaluate import EvalProgress, append_records, rewrite_file
from searchr1.run.estimate import scaled
from searchr1.run.costs import Budget, BudgetVerdict, PriceTable, check_budget, mean_usage
from searchr1.run.usage import MeteredSampler, MeteredSearch, Usage, metered_tools
from searchr1.search.tool import SearchBackend, with_search

HEADER_TYPE, QUESTION_TYPE, SUMMARY_TYPE = "probe_config", "question", "summary"
CHUNK = 8  # questions rolled out together; the budget is checked before each chunk
NON_BINDING_KEYS = frozenset({"code_version", "limit", "prices", "budget"})  # may change on resume
CLOSED_BOOK_INDEX, WITH_TOOLS_INDEX = 0, 1  # the question index each mode's seeds use


class ProbeFileError(UserError, ValueError):
    """A probe file that cannot be read or resumed; the message names the file, the line and the field."""


@dataclass(frozen=True)
class PassRate:
    """``right`` of ``attempts`` attempts were right (attempts hit by a search failure left out)."""

    right: int
    attempts: int
    env_failures: int = 0

    @property
    def rate(self) -> float:
        return self.right / self.attempts if self.attempts else 0.0

    def to_json(self) -> JsonObject:
        return {"right": self.right, "attempts": self.attempts, "env_failures": self.env_failures}


@dataclass(frozen=True)
class ProbedQuestion:
    """One question's line: its pass rates closed-book and with tools."""

    id: str
    question: str
    closed_book: PassRate
    with_tools: PassRate


@dataclass(frozen=True)
class Probe:
    """A probe file read back: what produced it and each question's pass rates by id."""

    path: Path
    config: Mapping[str, object]
    questions: Mapping[str, ProbedQuestion]


def closed_book(rollout: RolloutConfig) -> RolloutConfig:
    """The closed-book attempt of ``rollout``: one turn, no tool offered, a call refused."""
    return replace(rollout, tools=(), max_search_calls=0, max_assistant_turns=1, invalid_calls=InvalidCallPolicy.END)


def pass_rate(trajectories: Sequence[Trajectory]) -> PassRate:
    """Right (exact match) among the scored attempts; attempts with a search failure left out."""
    clean = [t for t in trajectories if not t.env_error]
    return PassRate(sum(t.score.exact_match for t in clean), len(clean), len(trajectories) - len(clean))


# --- the file -----------------------------------------------------------------------------------


def _rate(record: Mapping[str, object], key: str, where: str) -> PassRate:
    held = as_object(record.get(key), f"{where}: {key}")
    rate = PassRate(as_int(held.get("right"), f"{where}: {key}.right"),
                    as_int(held.get("attempts"), f"{where}: {key}.attempts"),
                    as_int(held.get("env_failures", 0), f"{where}: {key}.env_failures"))
    if not 0 <= rate.right <= rate.attempts:
        raise ValueError(f"{where}: {key}.right must lie in 0..attempts, got {rate.right} of {rate.attempts}")
    return rate


def read_probe(path: str | Path) -> Probe:
    """A probe file (one line naming the file, the line and the field when it is not one)."""
    path = Path(path)
    try:
        lines = path.read_text("utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise ProbeFileError(f"cannot read probe file {path}: {getattr(error, 'strerror', None) or error}") from None
    config: Mapping[str, object] | None = None
    questions: dict[str, ProbedQuestion] = {}
    for number, line in enumerate(lines, 1):
        where = f"probe file {path}, line {number}"
        try:
            record = as_object(json.loads(line), where)
            kind = record.get("type")
            if kind == HEADER_TYPE:
                config = as_object(record.get("config"), f"{where}: config")
            elif kind == QUESTION_TYPE:
                question_id = as_str(record.get("id"), f"{where}: id")
                text = as_str(record.get("question"), f"{where}: question")
                questions[question_id] = ProbedQuestion(question_id, text, _rate(record, "closed_book", where),
                                                        _rate(record, "with_tools", where))
        except json.JSONDecodeError:
            if number == len(lines):
                break  # a torn last line: the probe was killed while writing it
            raise ProbeFileError(f"{where}: not JSON") from None
        except (TypeError, ValueError) as error:
            raise ProbeFileError(str(error) if str(error).startswith(where) else f"{where}: {error}") from None
    if config is None:
        raise ProbeFileError(f"probe file {path} has no probe_config line: written by `probe-data`?")
    return Probe(path, config, questions)


def _binding(config: Mapping[str, object]) -> dict[str, object]:
    return {key: value for key, value in config.items() if key not in NON_BINDING_KEYS}


def _kept_lines(path: Path, config: Mapping[str, object], *, overwrite: bool) -> dict[str, JsonObject]:
    """The question lines an earlier session of this probe wrote (none when starting afresh)."""
    if overwrite or not path.exists():
        return {}
    probe = read_probe(path)
    stored, current = _binding(probe.config), _binding(json.loads(json.dumps(config)))
    differing = sorted(key for key in stored.keys() | current.keys() if stored.get(key) != current.get(key))
    if differing:
        raise ProbeFileError(f"probe file {path} was written with other settings ({', '.join(differing)} differ): "
                             "rerun with --overwrite to start it afresh, or choose another --output")
    kept: dict[str, JsonObject] = {}
    for line in path.read_text("utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # the torn last line read_probe allowed
        if isinstance(record, dict) and record.get("type") == QUESTION_TYPE:
            kept[str(record["id"])] = record
    return kept


# --- the run ------------------------------------------------------------------------------------


@dataclass
class ProbeOutcome:
    path: Path
    planned: int
    skipped: int  # already in the file
    probed: int = 0
    failed: list[str] = field(default_factory=list)  # ids whose sampling failed
    budget: BudgetVerdict | None = None  # set when the budget stopped the probe
    usage: Usage = field(default_factory=Usage)  # every recorded question's, across sessions
    summary: JsonObject | None = None


@dataclass
class ProbeRunner:
    """What probing one question needs: the policy's sampler, the tools and both rollouts' settings."""

    sampler: SamplingClient
    tokenizer: Tokenizer
    search: SearchBackend
    others: Mapping[str, ToolBackend]  # the declared tools other than search, by name
    rollout: RolloutConfig
    slots: asyncio.Semaphore

    async def question(self, position: int, example: SearchExample) -> tuple[JsonObject, Usage] | None:
        """The question's line and usage, or None when its sampling failed."""
        usage = Usage()
        sampler = MeteredSampler(self.sampler, usage)
        tools = with_search(MeteredSearch(self.search, usage), metered_tools(self.others, usage))
        closed, with_tools = await asyncio.gather(
            rollout_batch_async(sampler, self.tokenizer, {}, [example], closed_book(self.rollout), step=position,
                                first_question_index=CLOSED_BOOK_INDEX, sampling_slots=self.slots),
            rollout_batch_async(sampler, self.tokenizer, tools, [example], self.rollout, step=position,
                                first_question_index=WITH_TOOLS_INDEX, sampling_slots=self.slots))
        if any(t.sampler_error for t in closed + with_tools):
            return None
        score_trajectories(closed + with_tools, reward="em")
        searches = [len(t.calls) for t in with_tools]
        line: JsonObject = {
            "type": QUESTION_TYPE, "id": example.id, "question": example.question, "data_source": example.data_source,
            "position": position, "closed_book": pass_rate(closed).to_json(),
            "with_tools": {**pass_rate(with_tools).to_json(), "searches_mean": sum(searches) / len(searches)},
            "usage": dict(usage.kinds())}
        return line, usage


def _summary(lines: Sequence[JsonObject], usage: Usage, prices: PriceTable | None, *, partial: bool,
             planned: int) -> JsonObject:
    rates = [(_rate(line, "closed_book", "summary"), _rate(line, "with_tools", "summary")) for line in lines]
    count = len(rates) or 1
    summary: JsonObject = {
        "type": SUMMARY_TYPE, "partial": partial, "questions": len(lines), "planned": planned,
        "closed_book_rate": sum(c.rate for c, _ in rates) / count,
        "with_tools_rate": sum(t.rate for _, t in rates) / count,
        "closed_book_any_right": sum(c.right > 0 for c, _ in rates),
        "with_tools_all_right": sum(t.attempts > 0 and t.right == t.attempts for _, t in rates),
        "usage": dict(usage.kinds())}
    if prices is not None:
        summary["cost"] = prices.cost(usage)
        summary["currency"] = prices.currency
    return summary


async def probe_dataset(runner: ProbeRunner, examples: Sequence[SearchExample], output: str | Path,
                        config: Mapping[str, object], *, planned: Sequence[tuple[int, SearchExample]] | None = None,
                        overwrite: bool = False, progress: EvalProgress | None = None,
                        prices: PriceTable | None = None, budget: Budget | None = None) -> ProbeOutcome:
    """Probe ``planned`` (``(position, example)``; default every example) into ``output``; see the
    module docstring. Before each chunk of questions the budget is checked against the mean
    question so far: a chunk projected to pass it is not started (``outcome.budget`` says so).
    The file always ends with a summary of what it holds (partial until every question is in)."""
    path = Path(output)
    budget = budget or Budget()
    planned = list(planned if planned is not None else enumerate(examples))
    kept = _kept_lines(path, config, overwrite=overwrite)
    order = {example.id: index for index, example in planned}
    header: JsonObject = {"type": HEADER_TYPE, "config": json.loads(json.dumps(config))}
    lines = {key: line for key, line in kept.items() if key in order}
    outcome = ProbeOutcome(path, len(planned), len(lines))
    for line in lines.values():
        outcome.usage.add(_usage_of(line))
    todo = [(index, example) for index, example in planned if example.id not in lines]
    if progress is not None:
        progress.start(len(planned), outcome.skipped)
    _rewrite(path, header, [*kept.values()], None)
    try:
        for start in range(0, len(todo), CHUNK):
            chunk = todo[start:start + CHUNK]
            done = len(lines)
            mean = mean_usage(outcome.usage, done)
            projected = None if mean is None else scaled(mean, len(chunk))
            verdict = check_budget(budget, prices, outcome.usage, projected)
            if budget.active and verdict.stop:
                outcome.budget = verdict
                break
            results = await asyncio.gather(*(runner.question(index, example) for index, example in chunk))
            for (_, example), result in zip(chunk, results):
                if result is None:
                    outcome.failed.append(example.id)
                    continue
                line, usage = result
                append_records(path, [line])
                lines[example.id] = line
                outcome.usage.add(usage)
                outcome.probed += 1
            if progress is not None:
                progress.advance(len(chunk))
    finally:
        ordered = sorted(lines.values(), key=lambda line: order.get(str(line["id"]), len(order)))
        others = [line for key, line in kept.items() if key not in order]  # of a larger --limit
        outcome.summary = _summary(ordered, outcome.usage, prices, planned=len(planned),
                                   partial=len(ordered) < len(planned))
        _rewrite(path, header, ordered + others, outcome.summary)
    return outcome


def _usage_of(line: Mapping[str, object]) -> Usage:
    held = as_object(line.get("usage", {}), "usage")
    return Usage.from_kinds({str(kind): as_float(value, f"usage.{kind}") for kind, value in held.items()})


def _rewrite(path: Path, header: JsonObject, lines: Sequence[JsonObject], summary: JsonObject | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rewrite_file(path, [header, *lines] + ([summary] if summary is not None else []))
