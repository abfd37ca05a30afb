"""Scripted training-step workloads and latency models shared by the figures.

A workload is a scenario for the twin's scripted policy (questions x group samples, each sample
a scripted conversation with 0..4 searches and reasoning of random length) plus the search
results its queries get. Everything is drawn from one seed, so both schedulers (and every
repetition) see exactly the same step.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from searchr1.core.rollout import RolloutConfig
from searchr1.core.types import SearchExample, SearchItem, SearchResult, Trajectory
from searchr1.twin.config import Latencies
from searchr1.twin.scenario import Scenario, parse_scenario

CALL = "<tool_call>\n<function=search>\n<parameter=query>\n{}\n</parameter>\n</function>\n</tool_call>"

# Common English words; each is one token (with its leading space) for the Qwen3.5 tokenizer,
# so a filler of n words is about n tokens of "reasoning".
WORDS = ["the", "river", "city", "first", "author", "novel", "year", "known", "found", "also", "which", "check",
         "need", "name", "born", "country", "capital", "french", "writer", "people", "state", "world", "after",
         "before", "between", "during", "under", "other", "about", "into", "through", "most", "some", "many", "more",
         "only", "still", "even", "well", "back", "time", "part", "place", "case", "point", "group", "number", "fact",
         "result", "source", "answer", "question", "page", "search", "look", "again", "maybe"]


@dataclass(frozen=True)
class WorkloadSpec:
    """Shape of one training step's rollout."""

    questions: int = 8
    group_size: int = 8
    # P(0, 1, 2, 3, 4 searches) for one trajectory.
    search_weights: tuple[float, ...] = (0.15, 0.25, 0.25, 0.20, 0.15)
    # Generated tokens of one assistant turn: lognormal, clipped.
    turn_tokens_median: float = 120.0
    turn_tokens_sigma: float = 0.8
    turn_tokens_min: int = 8
    turn_tokens_max: int = 700
    # Search results: items per result, words per item (uniform).
    items_per_result: int = 3
    item_words: tuple[int, int] = (40, 180)
    # Groups repeat first queries (figure 4): most samples of a group open with one query.
    shared_queries: bool = False
    correct_fraction: float = 0.5


def quick_spec(spec: WorkloadSpec | None = None) -> WorkloadSpec:
    """``spec`` (the default one if None) at the ``--quick`` size: 2 questions x 4 samples."""
    return dataclasses.replace(spec or WorkloadSpec(), questions=2, group_size=4)


@dataclass
class Workload:
    spec: WorkloadSpec
    scenario: Scenario
    results: dict[str, SearchResult]
    config: RolloutConfig
    raw: dict[str, object]  # the scenario as JSON, for a twin in another process

    @property
    def examples(self) -> list[SearchExample]:
        return self.scenario.examples

    def queries(self) -> list[str]:
        """Every query the scenario issues, one per tool turn (with repeats)."""
        out = []
        for question in self.scenario.questions:
            for sample in question.samples:
                for text in sample:
                    if "<tool_call>" in text:
                        out.append(text.split("<parameter=query>\n", 1)[1].split("\n</parameter>", 1)[0])
        return out


def filler(rng: np.random.Generator, n: int) -> str:
    return " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), size=max(1, n))).capitalize() + "."


def _turn_tokens(rng: np.random.Generator, spec: WorkloadSpec) -> int:
    value = rng.lognormal(math.log(spec.turn_tokens_median), spec.turn_tokens_sigma)
    return int(min(spec.turn_tokens_max, max(spec.turn_tokens_min, value)))


def make_result(rng: np.random.Generator, spec: WorkloadSpec, query: str) -> SearchResult:
    items = []
    for k in range(spec.items_per_result):
        words = int(rng.integers(spec.item_words[0], spec.item_words[1] + 1))
        title = f"{query.title()} ({k + 1})"
        items.append(SearchItem(title, filler(rng, words), "Wikipedia",
                                f"https://en.wikipedia.org/wiki/{title.replace(' ', '_')}"))
    return SearchResult(ok=True, items=tuple(items))


def build_workload(spec: WorkloadSpec, seed: int) -> Workload:
    """A deterministic scripted step: ``spec.questions`` x ``spec.group_size`` trajectories."""
    rng = np.random.default_rng(seed)
    weights = np.asarray(spec.search_weights, dtype=float)
    weights = weights / weights.sum()
    questions = []
    queries: list[str] = []
    for q in range(spec.questions):
        samples = []
        for j in range(spec.group_size):
            searches = int(rng.choice(len(weights), p=weights))
            turns = []
            for t in range(searches):
                if spec.shared_queries:
                    if t == 0:
                        query = f"topic {q} overview" if rng.random() < 0.75 else f"topic {q} background"
                    else:
                        query = f"topic {q} detail {int(rng.integers(0, 3))}"
                else:
                    query = f"q{q} s{j} t{t} {WORDS[int(rng.integers(0, len(WORDS)))]}"
                queries.append(query)
                # The reasoning differs per sample, so no two samples share a history (a scripted
                # policy must answer the same prompt the same way) even when their queries repeat.
                turns.append(f"Sample {j}. {filler(rng, _turn_tokens(rng, spec))}\n\n{CALL.format(query)}")
            answer = "Paris" if rng.random() < spec.correct_fraction else "Lyon"
            turns.append(f"Sample {j}. {filler(rng, _turn_tokens(rng, spec))}\n\nAnswer: {answer}")
            samples.append(turns)
        questions.append({
            "id": f"bench-{q}", "question": f"Bench question {q}: which city is meant?",
            "answers": ["Paris"], "data_source": "bench", "samples": samples,
        })
    raw: dict[str, object] = {"name": "bench", "questions": questions}
    results = {query: make_result(rng, spec, query) for query in dict.fromkeys(queries)}
    config = RolloutConfig(group_size=spec.group_size, max_search_calls=4, sample_retry_backoff=0.0)
    return Workload(spec, parse_scenario(raw), results, config, raw)


# ------------------------------------------------------------------------------- latencies


def _unit_hash(*parts: object) -> int:
    material = "/".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(material, digest_size=8).digest(), "big")


@dataclass(frozen=True)
class LatencyModel:
    """Service latencies in model seconds, played back ``scale`` times faster.

    Sampling: ``sample_base + sample_per_token x tokens`` of the longest sequence of the
    request (a request ends when its last sample does); the twin plays it back
    (:meth:`twin_latencies`). Search: lognormal (median
    ``search_median``, shape ``search_sigma``) capped at ``search_cap``, drawn from a hash of
    the query, so the same query always takes the same time whoever asks and in what order.
    """

    sample_base: float = 0.8
    sample_per_token: float = 0.02
    search_median: float = 1.0
    search_sigma: float = 1.2
    search_cap: float = 30.0
    scale: float = 0.1  # wall seconds per model second (1 s -> 100 ms)
    seed: int = 0

    def sampling(self, tokens_per_sequence: Iterable[Iterable[int] | int]) -> float:
        lengths = [t if isinstance(t, int) else len(list(t)) for t in tokens_per_sequence]
        return self.sample_base + self.sample_per_token * max(lengths, default=0)

    def search(self, query: str) -> float:
        rng = np.random.default_rng(_unit_hash(self.seed, "search", query))
        return float(min(self.search_cap, rng.lognormal(math.log(self.search_median), self.search_sigma)))

    def twin_latencies(self) -> Latencies:
        """The sampling latencies, scaled, as the twin models them."""
        return Latencies(sample_request=self.scale * self.sample_base, sampled_token=self.scale * self.sample_per_token)

    def search_latency(self) -> Callable[[str], float]:
        return lambda query: self.scale * self.search(query)

    def zero(self) -> LatencyModel:
        return dataclasses.replace(self, sample_base=0.0, sample_per_token=0.0, search_median=1e-12,
                                   search_cap=0.0)


@dataclass(frozen=True)
class LowerBound:
    """Model seconds no scheduler can beat for a finished batch."""

    longest_trajectory: float
    sampling_cap: float   # total sampling time / sampling concurrency
    search_cap: float     # total search time / search concurrency
    sampling_total: float
    search_total: float

    @property
    def value(self) -> float:
        return max(self.longest_trajectory, self.sampling_cap, self.search_cap)

    @property
    def binding(self) -> str:
        named = {"longest trajectory": self.longest_trajectory, "sampling cap": self.sampling_cap,
                 "search cap": self.search_cap}
        return max(named, key=named.__getitem__)


def searched_queries(trajectory: Trajectory) -> list[str]:
    """Queries this trajectory sent (a tool call ended by ``tool_overflow`` was searched too)."""
    queries = [s.query for s in trajectory.calls]
    if trajectory.termination == "tool_overflow" and trajectory.turns:
        from searchr1.core.protocol import parse_assistant

        parsed = parse_assistant(trajectory.turns[-1].text)
        if parsed.query:
            queries.append(parsed.query)
    return queries


def lower_bound(trajectories: list[Trajectory], model: LatencyModel, *, sampling_concurrency: int,
                search_concurrency: int) -> LowerBound:
    """The longest trajectory's own serial latency (its group's first request, then its own
    later turns and searches), raised to what the concurrency caps force."""
    groups: dict[int, list[Trajectory]] = {}
    for t in trajectories:
        groups.setdefault(t.question_index, []).append(t)
    longest = 0.0
    sampling_total = 0.0
    search_total = 0.0
    for group in groups.values():
        first = model.sampling([len(t.turns[0].completion_tokens) for t in group if t.turns])
        sampling_total += first
        for t in group:
            later = [model.sampling([len(turn.completion_tokens)]) for turn in t.turns[1:]]
            searches = [model.search(q) for q in searched_queries(t)]
            sampling_total += sum(later)
            search_total += sum(searches)
            longest = max(longest, first + sum(later) + sum(searches))
    return LowerBound(longest, sampling_total / sampling_concurrency, search_total / search_concurrency,
                      sampling_total, search_total)


# ------------------------------------------------------------------------------- sampler


def fingerprint(trajectories: list[Trajectory]) -> list[tuple[object, ...]]:
    """Everything that makes two rollouts the same: per trajectory, its termination, searches,
    every turn's prompt and completion tokens, reward and advantage."""
    return [
        (t.question_index, t.group_index, t.termination, t.search_calls, t.reward, t.advantage,
         tuple((tuple(turn.prompt_tokens), tuple(turn.completion_tokens)) for turn in t.turns),
         tuple(s.query for s in t.calls))
        for t in sorted(trajectories, key=lambda t: (t.question_index, t.group_index))
    ]


def summarize_counts(trajectories: list[Trajectory]) -> Mapping[str, float]:
    searches = [t.search_calls for t in trajectories]
    return {
        "trajectories": len(trajectories),
        "tool_turns": int(sum(searches)),
        "searches_per_trajectory_max": int(max(searches, default=0)),
        "assistant_turns": int(sum(len(t.turns) for t in trajectories)),
    }
