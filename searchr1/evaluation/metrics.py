"""Pure parts of evaluation: per-question records, aggregate metrics, the summary record, and
reading a summary back.

An eval JSONL file holds one ``type="trajectory"`` record per question (written as chunks
finish, so a crash keeps what was done) followed by one ``type="summary"`` record. A resumed or
interrupted run may append more than one summary; the last one wins.

Confidence intervals (``*_ci95_low`` / ``*_ci95_high``) are 95% intervals that keep a width at
a handful of questions (:mod:`searchr1.evaluation.intervals`): Wilson score with continuity
correction of the summed scores (0/1 or not), per source over its questions, micro over all
questions, macro at the effective size of its least favourable split over sources. They are
deterministic: the same records always give the same intervals.
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import NotRequired, TypedDict, TypeGuard

from searchr1.core.errors import UserError
from searchr1.core.types import Termination, Trajectory, Turn
from searchr1.evaluation.card import eval_card
from searchr1.evaluation.intervals import macro_interval, mean_interval
from searchr1.health.diagnostics import mean
from searchr1.evaluation.numbers import float_of
from searchr1.basics.json_types import JsonObject, as_list, as_object, as_str
from searchr1.basics.jsonl import iter_json_lines


# Summary-config fields that must agree for two evaluations to be comparable (plots refuse to
# mix files that differ in any of them). The eval runner writes its config under these names.
COMPARABLE_CONFIG_FIELDS = (
    "search_backend",
    "search_concurrency",
    "search_timeout",
    "search_model",
    "dataset_sha256",
    "system_prompt",
    "tool_description",
)


class EvalFileError(UserError, ValueError):
    """An eval JSONL file is unreadable or has no summary; the message names path(:line)."""


# --- records --------------------------------------------------------------------------------


def turn_record(turn: Turn) -> dict[str, object]:
    """A turn of :func:`trajectory_record`: its text, why it stopped, its prompt's and reply's token
    counts, and (``--context fold``, once folded) the context it was sampled in."""
    record: dict[str, object] = {"text": turn.text, "stop_reason": turn.stop_reason,
                                 "prompt_tokens": len(turn.prompt_tokens),
                                 "generated_tokens": len(turn.completion_tokens)}
    if turn.context:
        record["context"] = turn.context
    return record


def trajectory_record(trajectory: Trajectory) -> dict[str, object]:
    """One JSON-ready record per evaluated question, with the whole transcript so that queries,
    observations and the model's text can be audited after the fact (the lab port kept only the
    final text). ``turns[i]`` is the i-th assistant turn; ``searches[j]`` the j-th tool call, in
    the order they ran, with its tool, the turn that made it (1-based) and whether it was refused.
    Each turn carries its prompt's and its reply's token counts."""
    example = trajectory.example
    return {
        "type": "trajectory",
        "id": example.id,
        "question": example.question,
        "answers": list(example.answers),
        "data_source": example.data_source,
        "group_index": trajectory.group_index,
        "turns": [turn_record(t) for t in trajectory.turns],
        "searches": [
            {
                "query": call.query,
                "ok": call.ok,
                "error": call.error,
                "observation": call.observation,
                "items": call.items,
                "cached": call.cached,
                "truncated": call.truncated,
                "tool": call.tool,
                "refused": call.refused,
                "turn": number,
            }
            for number, turn in enumerate(trajectory.turns, 1) for call in turn.calls
        ],
        "final_text": trajectory.final_text,
        "termination": trajectory.termination,
        "reward": trajectory.reward,
        "exact_match": bool(trajectory.score.exact_match),
        "f1": float(trajectory.score.f1),
        "cover_em": bool(trajectory.score.cover_em),
        "valid_format": bool(trajectory.score.valid_format),
        "search_calls": trajectory.search_calls,
        "assistant_turns": len(trajectory.turns),
        "env_error": bool(trajectory.env_error),
    }


# --- aggregate metrics (pure) ---------------------------------------------------------------


ANSWER_METRICS = ("em", "f1", "cover_em")
JUDGE_METRIC = "judge"  # eval --judge: the judge's yes/no per question (searchr1.evaluation.judge)
SCORED_METRICS = (*ANSWER_METRICS, JUDGE_METRIC)


def judged(record: Mapping[str, object]) -> bool:
    """Whether a record holds a judgement (``record["judge"]["correct"]``)."""
    judge = record.get("judge")
    return isinstance(judge, Mapping) and isinstance(judge.get("correct"), bool)


def answer_score(record: Mapping[str, object], name: str) -> float:
    """A record's ``em``, ``f1``, ``cover_em`` or ``judge`` score. Records written before F1 and
    cover EM were recorded are scored from their final text (0 unless they ended by answering).
    A field of the wrong type is a TypeError naming it."""
    if name == JUDGE_METRIC:
        return 1.0 if as_object(record["judge"], "judge")["correct"] else 0.0
    if name == "em":
        return 1.0 if record["exact_match"] else 0.0
    if name in record:
        return float_of(record[name], name)
    if record.get("termination") != "answer":
        return 0.0
    from searchr1.core.reward import score_answer

    result = score_answer(str(record.get("final_text") or ""), [str(a) for a in as_list(record.get("answers", []),
                                                                                      "answers")])
    return result.f1 if name == "f1" else float(result.cover_em)


def _add_answer_metric(metrics: dict[str, float], name: str, trajectories: Sequence[Mapping[str, object]]) -> int:
    """``<name>/<source>``, ``<name>/macro``, ``<name>/micro`` and their intervals,
    ``questions/<source>``; returns the number of questions. Scores are averaged per question
    first."""
    question_scores: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in trajectories:
        question_scores[(str(r["data_source"]), str(r["id"]))].append(answer_score(r, name))
    by_source: dict[str, list[float]] = defaultdict(list)
    for (source, _), scores in question_scores.items():
        by_source[source].append(mean(scores))
    sources = sorted(by_source)
    for source in sources:
        scores = by_source[source]
        interval = mean_interval(scores)
        metrics[f"{name}/{source}"] = mean(scores)
        metrics[f"{name}_ci95_low/{source}"] = interval.low
        metrics[f"{name}_ci95_high/{source}"] = interval.high
        metrics[f"questions/{source}"] = len(scores)
    all_scores = [score for source in sources for score in by_source[source]]
    macro = macro_interval({source: by_source[source] for source in sources})
    metrics[f"{name}/macro"] = mean(metrics[f"{name}/{s}"] for s in sources)
    metrics[f"{name}/macro_ci95_low"], metrics[f"{name}/macro_ci95_high"] = macro.low, macro.high
    micro = mean_interval(all_scores)
    metrics[f"{name}/micro"] = mean(all_scores)
    metrics[f"{name}/micro_ci95_low"], metrics[f"{name}/micro_ci95_high"] = micro.low, micro.high
    return len(question_scores)


def evaluation_metrics(records: Iterable[Mapping[str, object]]) -> dict[str, float]:
    """Aggregate trajectory records (others, e.g. summaries, are ignored) into flat metrics.

    EM is computed per question: records of the same question (same data_source and id) are
    averaged first, so ``em/micro`` is over questions even if a runner ever samples a question
    more than once. Format, rollout and termination rates are over trajectories.

    Keys: ``em/<source>``, ``em/macro`` (unweighted mean over the sources present),
    ``em/micro``, their ``*_ci95_low/high``, ``em_ci95_low/<source>``, ``em_ci95_high/<source>``,
    the same for ``f1`` and ``cover_em`` (always, whatever the training reward) and for
    ``judge`` (only when every record holds a judgement),
    ``questions/<source>``, ``format/rate``, ``format/<source>``, ``reward/mean``,
    ``rollout/search_calls``, ``rollout/no_search_rate``, ``rollout/turns``,
    ``rollout/env_error_rate``, ``rollout/search_ok_rate``, ``rollout/search_cached_rate``,
    ``rollout/search_truncated_rate`` (only when there were searches),
    ``rollout/termination/<reason>`` (every known reason,
    plus any other seen; ``unfinished`` for a missing one), ``eval/questions``,
    ``eval/trajectories``, ``eval/sources``."""
    trajectories = [r for r in records if r.get("type", "trajectory") == "trajectory"]
    if not trajectories:
        raise ValueError("no trajectory records to aggregate")

    by_source_traj: dict[str, list[Mapping[str, object]]] = defaultdict(list)
    for r in trajectories:
        by_source_traj[str(r["data_source"])].append(r)
    sources = sorted(by_source_traj)
    metrics: dict[str, float] = {}
    for name in ANSWER_METRICS:
        question_count = _add_answer_metric(metrics, name, trajectories)
    if all(judged(r) for r in trajectories):
        _add_answer_metric(metrics, JUDGE_METRIC, trajectories)
    for source in sources:
        metrics[f"format/{source}"] = mean(1.0 if r["valid_format"] else 0.0 for r in by_source_traj[source])

    n = len(trajectories)
    searches = [as_object(s, "searches[]") for r in trajectories for s in as_list(r.get("searches", []), "searches")]
    metrics["format/rate"] = mean(1.0 if r["valid_format"] else 0.0 for r in trajectories)
    metrics["reward/mean"] = mean(float_of(r["reward"], "reward") for r in trajectories)
    metrics["rollout/search_calls"] = mean(float_of(r["search_calls"], "search_calls") for r in trajectories)
    metrics["rollout/no_search_rate"] = mean(1.0 if r["search_calls"] == 0 else 0.0 for r in trajectories)
    metrics["rollout/turns"] = mean(float_of(r["assistant_turns"], "assistant_turns") for r in trajectories)
    metrics["rollout/env_error_rate"] = mean(1.0 if r.get("env_error") else 0.0 for r in trajectories)
    if searches:  # rates over searches; absent (not 0) when the model never searched
        metrics["rollout/search_ok_rate"] = mean(1.0 if s.get("ok") else 0.0 for s in searches)
        metrics["rollout/search_cached_rate"] = mean(1.0 if s.get("cached") else 0.0 for s in searches)
        metrics["rollout/search_truncated_rate"] = mean(1.0 if s.get("truncated") else 0.0 for s in searches)

    reasons = [as_str(r.get("termination") or "unfinished", "termination") for r in trajectories]
    for reason in sorted(set(Termination) | set(reasons)):
        metrics[f"rollout/termination/{reason}"] = reasons.count(reason) / n

    metrics["eval/questions"] = question_count
    metrics["eval/trajectories"] = n
    metrics["eval/sources"] = len(sources)
    return metrics


class EvalSummary(TypedDict):
    """The closing line of an eval file: :func:`summary_record`'s keys, and those the runner adds
    (:func:`searchr1.evaluation.evaluate.evaluate`)."""

    type: str
    partial: bool
    evaluated_examples: int
    metrics: dict[str, float]
    config: dict[str, object]
    card: dict[str, object]
    currency: NotRequired[str]  # with a price table
    questions_planned: NotRequired[int]
    questions_missing: NotRequired[int]
    failed_questions: NotRequired[list[str]]
    sessions: NotRequired[list[Mapping[str, object]]]


def summary_record(
    records: Iterable[Mapping[str, object]],
    *,
    config: Mapping[str, object],
    search_metrics: Mapping[str, float],
    partial: bool,
) -> EvalSummary:
    """The closing line of an eval file.

    ``config`` is the exact configuration of the run (backend, search concurrency, timeout and
    model, sampling parameters, base_model, model_path, dataset path and sha256, code version;
    see COMPARABLE_CONFIG_FIELDS for the names plots compare) and is stored as given; it must be
    JSON-serialisable, checked here so the runner fails before writing a broken line.
    ``search_metrics`` (the search client's stats) join the metrics under ``search/``; ``card`` is
    the comparability card (:mod:`searchr1.evaluation.card`)."""
    records = list(records)
    metrics = evaluation_metrics(records)
    for key, value in search_metrics.items():
        metrics[key if key.startswith("search/") else f"search/{key}"] = value
    config = dict(config)
    try:
        json.dumps(config, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"summary config is not plain JSON: {exc}") from exc
    return {
        "type": "summary",
        "partial": bool(partial),
        "evaluated_examples": int(metrics["eval/questions"]),
        "metrics": metrics,
        "config": config,
        "card": eval_card(config, metrics),
    }


# --- reading eval files -------------------------------------------------------------------


def read_eval_records(path: str | os.PathLike[str]) -> list[JsonObject]:
    """Every JSON object of an eval JSONL file; a bad line raises EvalFileError(path:line)."""
    records: list[JsonObject] = []
    for number, record in iter_json_lines(path, error=EvalFileError):
        if not isinstance(record, dict):
            raise EvalFileError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
        records.append(record)
    return records


def _last_summary(records: Sequence[JsonObject], path: str | os.PathLike[str]) -> JsonObject:
    summaries = [r for r in records if r.get("type") == "summary"]
    if not summaries:
        raise EvalFileError(f"{path}: no summary record (the evaluation may have stopped before finishing)")
    summary = dict(summaries[-1])
    if not isinstance(summary.get("metrics"), dict):
        raise EvalFileError(f"{path}: the last summary record has no 'metrics' object")
    return summary


def load_summary(path: str | os.PathLike[str]) -> JsonObject:
    """The last ``type="summary"`` record of an eval file (later summaries supersede earlier
    ones, e.g. after a resumed run)."""
    return _last_summary(read_eval_records(path), path)


def load_summary_with_current_intervals(path: str | os.PathLike[str]) -> JsonObject:
    """:func:`load_summary`, its ``*_ci95_*`` metrics recomputed from the file's trajectory
    records by today's rules, so that a file written when the intervals were a percentile
    bootstrap (a point at one or two questions a source) draws the same intervals as a new one.
    Scores and every other field are kept as stored; a summary without trajectory records beside
    it (the lab port's format), or with records that no longer aggregate, keeps its own intervals."""
    records = read_eval_records(path)
    summary = _last_summary(records, path)
    trajectories = [r for r in records if r.get("type", "trajectory") == "trajectory"]
    try:
        current = evaluation_metrics(trajectories)
    except (KeyError, TypeError, ValueError):
        return summary
    intervals = {key: value for key, value in current.items() if "_ci95_" in key}
    stored = summary["metrics"]
    if isinstance(stored, dict):  # as _last_summary checked
        summary["metrics"] = {**stored, **intervals}
    return summary


def is_finite_number(value: object) -> TypeGuard[int | float]:
    """A finite int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
