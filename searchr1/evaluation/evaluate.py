"""The evaluation runner: roll out every chosen question once (``group_size=1`` by default),
write one record per question as soon as it finishes, and close the file with a summary.

File layout (JSONL, one object per line)::

    {"type": "eval_config", "config": {...}}         # what produced the records (for resuming)
    {"type": "trajectory", "id": ..., ...}           # one per question (per sample), see
    ...                                              #   eval_metrics.trajectory_record
    {"type": "summary", "partial": false, ...}       # eval_metrics.summary_record + extras

Crash safety and resuming:

* each finished question is appended, flushed and fsync'ed at once, so an interrupted run
  (Ctrl-C, a failing sampler, a missing cassette entry, any exception) keeps every finished
  record; on the way out a summary of what is there is written, marked ``partial``;
* rerunning with the same output skips the questions already recorded (by id), evaluates the
  rest and rewrites the file atomically: the header, the trajectory records in dataset order,
  and exactly one summary (stale summaries are dropped, never accumulated);
* a rerun whose binding configuration (model, search backend and its comparable settings,
  sampling parameters and budgets, dataset sha256, offline scenario) differs from the stored
  one is refused; ``overwrite=True`` starts a fresh file instead. Records are never deleted
  otherwise. A torn last line (the process died while writing it) is dropped with a note.

Seeds: question ``i`` (its position in the *whole* dataset file, not in the ``--limit``
selection) is rolled out alone as ``rollout_batch_async(..., [example], step=i)``, so its
sampling seeds are ``sampling_seed(seed, i, 0, sample, turn)``: distinct for every question
(the lab port reused them per chunk) and independent of ``--limit``, concurrency, completion order
and of how many sessions the evaluation took. A resumed evaluation therefore produces the same
records as an uninterrupted one.

A question whose sampling failed for good (``sampler_error``) is not recorded, so that a flaky
service does not count as wrong answers: the summary is marked partial and names it, and a
rerun retries it. Too many such failures (at least 3, and more than
``max_sampler_failure_fraction`` of the questions tried) stop the run.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from searchr1.core.errors import UserError
from searchr1.core.reward import score_trajectories
from searchr1.core.tools import ToolBackend
from searchr1.core.types import SamplingClient, SearchExample, Tokenizer
from searchr1.data.dataset import DataError, spread_across_sources
from searchr1.evaluation.judge import Judge
from searchr1.evaluation.metrics import EvalFileError, EvalSummary, summary_record, trajectory_record
from searchr1.evaluation.numbers import float_of, int_of
from searchr1.basics.json_types import JsonObject, as_list, as_object
from searchr1.basics.fileio import append_text, write_text_atomically
from searchr1.basics.jsonl import JsonLines, Surrogates, TornLines
from searchr1.run.costs import PriceTable
from searchr1.run.usage import MeteredSampler, MeteredSearch, Usage, metered_tools, question_usage_metrics
from searchr1.core.rollout import RolloutConfig, SamplerFailureError, rollout_batch_async, run_all
from searchr1.search.tool import SearchBackend, with_search

HEADER_TYPE = "eval_config"
MIN_FAILURES_TO_ABORT = 3

# Config keys that may change between sessions of one evaluation file (everything else binds).
NON_BINDING_KEYS = frozenset({
    "limit", "code_version", "chat_template", "search_cache", "dataset", "offline_home",
    "trained_with",  # follows from model_path, which binds
    "judge",  # judging is added to the records afterwards; it never changes a rollout
})
# Rollout fields that schedule work but do not change what a question's rollout is.
NON_BINDING_ROLLOUT_KEYS = frozenset({
    "sampling_concurrency", "sample_timeout", "sample_retries", "sample_retry_backoff",
    "max_sampler_failure_fraction",
})
# Search metrics that add up over sessions; the others are request-weighted means.
SUMMED_SEARCH_METRICS = frozenset({
    "search/requests", "search/deduplicated", "search/input_tokens",
    "search/cache_read_input_tokens", "search/output_tokens", "search/web_search_requests",
})


class EvalResumeError(UserError, ValueError):
    """The output file holds an evaluation that this run cannot continue (another config,
    records of unknown origin); the message names the file and what differs."""


class EvalProgress(Protocol):
    def start(self, total: int, done: int) -> None: ...

    def advance(self, count: int = 1) -> None: ...


@dataclass
class EvalOutcome:
    path: Path
    planned: int                      # questions chosen for this evaluation (after --limit)
    skipped: int                      # of those, already recorded before this session
    evaluated: int = 0                # questions recorded in this session
    judged: int = 0                   # questions given a judgement in this session (kept ones included)
    failed: list[str] = field(default_factory=list)  # ids whose sampling failed for good
    notes: list[str] = field(default_factory=list)
    summary: EvalSummary | None = None

    @property
    def partial(self) -> bool:
        return bool(self.summary and self.summary.get("partial"))


# --- pure helpers -------------------------------------------------------------------------


def plan_questions(examples: Sequence[SearchExample], limit: int | None) -> list[tuple[int, SearchExample]]:
    """``(position in the dataset, example)`` of the questions to evaluate: all of them, or
    ``limit`` spread evenly across sources (round-robin, see ``spread_across_sources``).
    Duplicate ids are refused: resuming keys on them."""
    position: dict[str, int] = {}
    for index, example in enumerate(examples):
        if example.id in position:
            raise DataError(f"question id {example.id!r} appears twice in the dataset "
                            f"(rows {position[example.id] + 1} and {index + 1}); ids must be unique")
        position[example.id] = index
    chosen = examples if limit is None else spread_across_sources(examples, limit)
    return [(position[e.id], e) for e in chosen]


def binding_config(config: Mapping[str, object]) -> dict[str, object]:
    """The part of a run config that must not change when an evaluation is resumed."""
    view = {k: v for k, v in config.items() if k not in NON_BINDING_KEYS}
    rollout = view.get("rollout")
    if isinstance(rollout, Mapping):
        view["rollout"] = {k: v for k, v in rollout.items() if k not in NON_BINDING_ROLLOUT_KEYS}
    return view


def _flatten(config: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    flat: dict[str, object] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def config_differences(stored: Mapping[str, object], current: Mapping[str, object]) -> list[str]:
    """``"key: stored -> current"`` for every binding key that differs (sorted), both read as the
    summary's JSON holds them (a tuple of tool names is a list there)."""
    old, new = (_flatten(binding_config(json.loads(json.dumps(config)))) for config in (stored, current))
    return [f"{key}: {old.get(key)!r} -> {new.get(key)!r}"
            for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)]


def merge_search_metrics(sessions: Iterable[Mapping[str, object]]) -> dict[str, float]:
    """Search metrics over several sessions: counts summed, rates and means weighted by each
    session's ``search/requests`` (latency percentiles become a request-weighted mean of the
    sessions' percentiles, exact only for one session)."""
    sessions = [s for s in sessions if s]
    total = sum(float_of(s.get("search/requests", 0.0), "search/requests") for s in sessions)
    merged: dict[str, float] = {}
    for key in sorted({k for s in sessions for k in s}):
        values = [(float_of(s.get("search/requests", 0.0), "search/requests"), float_of(s[key], key))
                  for s in sessions if key in s]
        if key in SUMMED_SEARCH_METRICS:
            merged[key] = sum(v for _, v in values)
        else:
            merged[key] = sum(w * v for w, v in values) / total if total else 0.0
    return merged


def _record_order(position: Mapping[str, int]) -> Callable[[Mapping[str, object]], tuple[int, str, int]]:
    def key(record: Mapping[str, object]) -> tuple[int, str, int]:
        stored = record.get("index")
        index = stored if isinstance(stored, int) else position.get(str(record.get("id")), len(position))
        return index, str(record.get("id")), int_of(record.get("group_index") or 0, "group_index")

    return key


# --- the file -------------------------------------------------------------------------------


@dataclass
class ExistingEval:
    header: JsonObject | None
    records: list[JsonObject]
    summary: JsonObject | None
    torn_line: bool


def read_existing(path: Path) -> ExistingEval:
    """Parse an eval file leniently only where a crash explains it: an unparsable *last* line
    without a trailing newline is a torn write and is dropped; any other bad line is an
    EvalFileError naming path:line."""
    header: JsonObject | None = None
    summary: JsonObject | None = None
    records: list[JsonObject] = []
    lines = JsonLines(path, error=EvalFileError, torn=TornLines.LAST, surrogates=Surrogates.MEND)
    for number, record in lines:
        if not isinstance(record, dict):
            raise EvalFileError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
        kind = record.get("type", "trajectory")
        if kind == HEADER_TYPE:
            header = header or record
        elif kind == "summary":
            summary = record  # the last one wins
        elif kind == "trajectory":
            records.append(record)
    return ExistingEval(header, records, summary, bool(lines.torn_lines))


def _dumps(record: Mapping[str, object]) -> str:
    return json.dumps(record, ensure_ascii=False, allow_nan=False)


def append_records(path: Path, records: Sequence[Mapping[str, object]]) -> None:
    """Append and make durable before returning (a crash right after keeps them)."""
    append_text(path, "".join(_dumps(r) + "\n" for r in records))


def rewrite_file(path: Path, lines: Sequence[Mapping[str, object]]) -> None:
    """Replace ``path`` atomically (temporary file beside it, fsync, rename)."""
    write_text_atomically(path, "".join(_dumps(r) + "\n" for r in lines))


def _search_stats(search_backend: SearchBackend) -> dict[str, float]:
    stats = getattr(search_backend, "stats", None)
    if stats is not None and hasattr(stats, "peek"):
        return dict(stats.peek())
    return {}


# --- the runner -----------------------------------------------------------------------------


@dataclass
class _KeptRecords:
    """What earlier sessions left in the output for this one to continue: their records, their
    sessions (from the last summary) and notes on what was dropped or replaced."""
    records: list[dict[str, object]] = field(default_factory=list)
    sessions: list[Mapping[str, object]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _kept_records(path: Path, run_config: Mapping[str, object], *, overwrite: bool) -> _KeptRecords:
    """The records ``path`` holds for an evaluation of ``run_config`` (none with ``overwrite``);
    refused when it holds records of another configuration, or of none."""
    kept = _KeptRecords()
    if path.exists() and not overwrite:
        existing = read_existing(path)
        stored = (existing.header or {}).get("config") or (existing.summary or {}).get("config")
        if stored is None and existing.records:
            raise EvalResumeError(f"{path} holds {len(existing.records)} records but no configuration to "
                                  "check them against; use another --output, or --overwrite to start afresh")
        if stored is not None:
            differences = config_differences(as_object(stored, "config"), run_config)
            if differences:
                raise EvalResumeError(f"{path} holds an evaluation with another configuration ("
                                      + "; ".join(differences)
                                      + "); use another --output, or --overwrite to start afresh")
        if existing.torn_line:
            kept.notes.append(f"{path}: dropped an incomplete last line (the previous run died while writing it)")
        kept.records = [{**record} for record in existing.records]
        if existing.summary is not None:
            kept.sessions = [as_object(session, "sessions[]")
                             for session in as_list(existing.summary.get("sessions") or [], "sessions")]
    elif path.exists():
        kept.notes.append(f"{path}: --overwrite: previous contents replaced")
    return kept


@dataclass
class _Questions:
    """One session's questions: each rolled out alone with its usage metered, scored, judged and
    appended to ``path`` (and ``records``) as soon as it finishes. A question whose sampling
    failed for good is not recorded; too many such failures stop the session."""
    sampling_client: SamplingClient
    tokenizer: Tokenizer
    search_backend: SearchBackend
    tool_backends: Mapping[str, ToolBackend] | None
    config: RolloutConfig
    path: Path
    records: list[dict[str, object]]
    outcome: EvalOutcome
    clock: Callable[[], float]
    judge: Judge | None
    progress: EvalProgress | None
    attempted: int = 0

    def __post_init__(self) -> None:
        self.question_config = replace(self.config, max_sampler_failure_fraction=1.0)  # failures handled here
        self.slots = asyncio.Semaphore(max(1, self.config.sampling_concurrency // self.config.group_size))

    async def evaluate(self, index: int, example: SearchExample) -> None:
        async with self.slots:
            started = self.clock()
            usage = Usage()
            trajectories = await rollout_batch_async(
                MeteredSampler(self.sampling_client, usage), self.tokenizer,
                with_search(MeteredSearch(self.search_backend, usage), metered_tools(self.tool_backends, usage)),
                [example], self.question_config, step=index,
            )
            elapsed = self.clock() - started
        score_trajectories(trajectories)
        self.attempted += 1
        if any(t.sampler_error for t in trajectories):
            self._sampling_failed(example.id)
            return
        new = [{**trajectory_record(t), "index": index, "elapsed_seconds": round(elapsed, 6)}
               for t in trajectories]
        if self.judge is not None and await self.judge.annotate(new):
            self.outcome.judged += 1
        if new:
            new[0]["usage"] = usage.kinds()  # the question's requests, shared by its samples
        append_records(self.path, new)
        self.records.extend(new)
        self.outcome.evaluated += 1
        if self.progress is not None:
            self.progress.advance(1)

    def _sampling_failed(self, question_id: str) -> None:
        """Count a question whose sampling failed for good; stop once too many have."""
        self.outcome.failed.append(question_id)
        failed = len(self.outcome.failed)
        fraction = self.config.max_sampler_failure_fraction
        if failed >= MIN_FAILURES_TO_ABORT and failed > fraction * self.attempted:
            raise SamplerFailureError(
                f"sampling failed for {failed} of {self.attempted} questions tried (more than "
                f"max_sampler_failure_fraction={fraction}); "
                "the sampling service looks unhealthy"
            )


def _summary(ordered: list[dict[str, object]], *, run_config: Mapping[str, object],
             sessions: list[Mapping[str, object]], partial: bool, planned: int, missing: int, failed: list[str],
             position: Mapping[str, int], prices: PriceTable | None) -> EvalSummary:
    """The closing summary line of the records in file order: their metrics, the search metrics of
    every session, the usage of every recorded question and, with ``prices``, its cost."""
    summary = summary_record(
        ordered, config=run_config,
        search_metrics=merge_search_metrics(as_object(s["search"] or {}, "search") for s in sessions),
        partial=partial,
    )
    used, questions, usage_keys = question_usage_metrics(ordered)
    summary["metrics"].update(usage_keys)
    if prices is not None:
        summary["metrics"].update({f"cost/total_{kind}": value for kind, value in prices.costs(used).items()})
        summary["metrics"]["cost/total"] = prices.cost(used)
        summary["metrics"]["cost/per_question"] = prices.cost(used) / questions if questions else 0.0
        summary["currency"] = prices.currency
    summary["questions_planned"] = planned
    summary["questions_missing"] = missing
    summary["failed_questions"] = sorted(failed, key=lambda i: position.get(i, -1))
    summary["sessions"] = sessions
    return summary


async def evaluate(
    sampling_client: SamplingClient,
    tokenizer: Tokenizer,
    search_backend: SearchBackend,
    examples: Sequence[SearchExample],
    config: RolloutConfig,
    output: str | os.PathLike[str],
    run_config: Mapping[str, object],
    *,
    limit: int | None = None,
    overwrite: bool = False,
    progress: EvalProgress | None = None,
    clock: Callable[[], float] = time.monotonic,
    judge: Judge | None = None,
    prices: PriceTable | None = None,
    tool_backends: Mapping[str, ToolBackend] | None = None,
) -> EvalOutcome:
    """Evaluate ``examples`` (the whole dataset; ``limit`` picks a source-balanced subset)
    into ``output``; see the module docstring for the file, resuming and seeds.

    ``run_config`` is stored in the header and the summary as the run's exact configuration
    (plain JSON; nothing secret). Returns the outcome; on any exception the file keeps every
    finished record plus a partial summary, and the exception propagates.

    With ``judge`` (a :class:`~searchr1.evaluation.judge.Judge`) every record gets its
    judgement before it is written, records kept from an earlier session included.

    Each question's usage (:mod:`searchr1.run.usage`) is kept in the record of its first sample,
    so the summary's ``usage/...`` totals cover every recorded question, across resumes; with
    ``prices`` (a :class:`~searchr1.run.costs.PriceTable`) the summary carries ``cost/...`` too."""
    path = Path(output)
    run_config = dict(run_config)
    json.dumps(run_config, allow_nan=False)  # fail before touching the file
    planned = plan_questions(examples, limit)
    position = {e.id: i for i, e in enumerate(examples)}
    header: dict[str, object] = {"type": HEADER_TYPE, "config": run_config}
    kept = _kept_records(path, run_config, overwrite=overwrite)
    records = kept.records

    judged_kept = 0  # questions kept from an earlier session that get their judgement now
    if judge is not None and records:
        judged_kept = len({str(r.get("id")) for r in records if not judge.judged(r)})
        await judge.annotate(records)
    done_ids = {str(r.get("id")) for r in records}
    todo = [(i, e) for i, e in planned if e.id not in done_ids]
    outcome = EvalOutcome(path=path, planned=len(planned), skipped=len(planned) - len(todo), notes=kept.notes,
                          judged=judged_kept)
    # Start from a clean file: header, the kept records, no stale summary.
    rewrite_file(path, [header, *sorted(records, key=_record_order(position))])
    if progress is not None:
        progress.start(len(planned), outcome.skipped)

    questions = _Questions(sampling_client, tokenizer, search_backend, tool_backends, config, path, records, outcome,
                           clock, judge, progress)
    session_started = time.time()
    finished = False
    try:
        await run_all(questions.evaluate(i, e) for i, e in todo)
        finished = True
    finally:
        session = {
            "started_at": round(session_started, 3),
            "questions_evaluated": outcome.evaluated,
            "questions_failed": len(outcome.failed),
            "code_version": run_config.get("code_version"),
            "search": _search_stats(search_backend),
        }
        sessions = kept.sessions + ([session] if todo else [])
        recorded = {str(r.get("id")) for r in records}
        missing = [e.id for _, e in planned if e.id not in recorded]
        ordered = sorted(records, key=_record_order(position))  # file order, not finishing order
        lines: list[Mapping[str, object]] = [header, *ordered]
        if records:
            outcome.summary = _summary(ordered, run_config=run_config, sessions=sessions,
                                       partial=not finished or bool(missing), planned=len(planned),
                                       missing=len(missing), failed=outcome.failed, position=position, prices=prices)
            lines.append(outcome.summary)
        rewrite_file(path, lines)
    return outcome
