"""Paired comparison of two evaluations of the same questions (``compare EVAL_A EVAL_B``).

Only the questions both files answered count (paired by data source and id). Differences are
``B - A``:

* per source and macro (the unweighted mean of the per-source differences, i.e. macro B minus
  macro A on the paired questions), for EM, F1 and cover EM, with a paired 95% interval that
  keeps a width at one or two questions (:mod:`searchr1.evaluation.paired_intervals`: Tango's
  continuity-corrected score interval of the discordant counts, fractional for F1; the macro at
  Kish's effective sample size). Closed forms, so the same files always give the same intervals;
  sources with fewer than FEW_QUESTIONS paired questions are marked (``few_questions``);
* an exact McNemar test for the yes/no scores (EM, cover EM, and the judge's when both files
  have one): under "no difference" each discordant question (right in one file only) is equally
  likely to favour either, so the two-sided p value is the binomial tail
  ``min(1, 2 * P[X <= min(b, c)])``, ``X ~ Binomial(b + c, 1/2)``, computed exactly in integers;
* the questions that flipped each way, each with the ``show`` command that prints both
  transcripts.

:func:`comparability_problems` lists what makes two files incomparable (another question set,
protocol, search backend, top-k, decoding, or any field of their cards that changes the
numbers); the command refuses them.
"""

from __future__ import annotations

import math
import shlex
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Literal, NotRequired, TypedDict

from searchr1.basics.json_types import JsonObject, JsonValue, as_object
from searchr1.evaluation.card import card_differences, eval_card, table
from searchr1.evaluation.intervals import FEW_QUESTIONS, Interval, few_questions
from searchr1.evaluation.metrics import EvalFileError, answer_score, load_summary, read_eval_records
from searchr1.evaluation.paired_intervals import macro_paired_interval, paired_interval
from searchr1.basics.wording import plural
from searchr1.basics import invocation

Score = Literal["em", "f1", "cover_em", "judge"]
SCORES: tuple[Score, ...] = ("em", "f1", "cover_em")
BINARY_SCORES: tuple[Score, ...] = ("em", "cover_em")
JUDGE_SCORE: Literal["judge"] = "judge"
# Config fields that must agree (besides the cards): the question set and the sampling seed
# source are in the card too; these name the rest of "what was asked, how it was searched".
BINDING_CONFIG = ("dataset_sha256", "protocol", "search_backend", "search_topk", "search_index",
                  "search_cassette", "system_prompt", "tool_description")
DECODING_CONFIG = ("temperature", "top_p", "max_tokens")


class IncomparableEvals(ValueError):
    """Two evaluations that cannot be compared; the message says what differs."""


class Difference(TypedDict):
    """A paired difference ``b - a`` of one score, with its paired 95% interval."""

    a: float
    b: float
    difference: float
    ci95_low: float
    ci95_high: float
    interval_rule: str


class McNemar(TypedDict):
    b_only_right: int
    a_only_right: int
    p_value: float


class Flip(TypedDict):
    """A question right in one file only, with the ``show`` commands of its two transcripts."""

    data_source: str
    id: str
    question: JsonValue
    show: list[str]


class SourceComparison(TypedDict):
    """One source's paired questions: how many, and each score's difference and p value."""

    n: int
    few_questions: bool
    p_value: dict[str, float]
    em: NotRequired[Difference]
    f1: NotRequired[Difference]
    cover_em: NotRequired[Difference]
    judge: NotRequired[Difference]


class Comparison(TypedDict):
    """What :func:`compare_evals` finds (``compare --json`` prints it)."""

    a: str
    b: str
    model_a: object
    model_b: object
    produced_by_a: str
    produced_by_b: str
    paired_questions: int
    only_in_a: int
    only_in_b: int
    difference: str
    interval: str
    few_questions_under: int
    test: str
    sources: dict[str, SourceComparison]
    macro: dict[str, Difference]
    p_value: dict[str, float]
    mcnemar: dict[str, McNemar]
    flipped: dict[str, dict[str, list[Flip]]]


@dataclass(frozen=True)
class LoadedEval:
    path: Path
    config: Mapping[str, object]
    card: Mapping[str, object]
    records: dict[tuple[str, str], JsonObject]  # (data_source, id) -> the question's first record


def load_eval(path: str | Path) -> LoadedEval:
    """An eval file's configuration, card and records (the last summary's config; a file
    written before cards existed gets its card rebuilt from that config)."""
    path = Path(path)
    summary = load_summary(path)
    stored_config, stored_card = summary.get("config"), summary.get("card")
    config: JsonObject = stored_config if isinstance(stored_config, dict) else {}
    card: Mapping[str, object] = (stored_card if isinstance(stored_card, dict)
                                  else eval_card(config, as_object(summary["metrics"], "metrics")))
    records: dict[tuple[str, str], JsonObject] = {}
    for record in read_eval_records(path):
        if record.get("type", "trajectory") != "trajectory":
            continue
        try:
            key = (str(record["data_source"]), str(record["id"]))
        except KeyError as missing:
            raise EvalFileError(f"{path}: a trajectory record has no {missing.args[0]!r}") from None
        records.setdefault(key, record)
    if not records:
        raise EvalFileError(f"{path}: no trajectory records")
    return LoadedEval(path, config, card, records)


def comparability_problems(a: LoadedEval, b: LoadedEval) -> list[str]:
    """What differs between two evaluations in a way that changes the numbers (empty: comparable)."""
    problems = []
    for name in BINDING_CONFIG:
        if a.config.get(name) != b.config.get(name):
            problems.append(f"{name}: {a.config.get(name)!r} -> {b.config.get(name)!r}")
    sampling_a, sampling_b = table(a.config, "sampling"), table(b.config, "sampling")
    for name in DECODING_CONFIG:
        if sampling_a.get(name) != sampling_b.get(name):
            problems.append(f"decoding {name}: {sampling_a.get(name)!r} -> {sampling_b.get(name)!r}")
    seen = {p.split(":", 1)[0] for p in problems}
    problems.extend(f"card {p}" for p in card_differences(a.card, b.card) if p.split(":", 1)[0] not in seen)
    return problems


# --- statistics (pure) -----------------------------------------------------------------------


def mcnemar_exact(b_only: int, a_only: int) -> float:
    """Two-sided exact McNemar p value from the discordant counts (1.0 when there are none)."""
    n = b_only + a_only
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(b_only, a_only) + 1))
    return float(min(Fraction(1), Fraction(2 * tail, 2 ** n)))


def _entry(a: float, b: float, difference: float, interval: Interval) -> Difference:
    return {"a": a, "b": b, "difference": difference, "ci95_low": interval.low, "ci95_high": interval.high,
            "interval_rule": interval.rule.value}


def paired_difference(a: Sequence[float], b: Sequence[float]) -> Difference:
    """Mean of ``b - a`` over paired scores with its paired 95% interval."""
    difference = math.fsum(y - x for x, y in zip(a, b, strict=True)) / len(a)
    return _entry(math.fsum(a) / len(a), math.fsum(b) / len(b), difference, paired_interval(a, b))


def macro_difference(groups: Mapping[str, tuple[Sequence[float], Sequence[float]]]) -> Difference:
    """Macro ``b - a`` (unweighted mean over sources of the per-source mean differences), with
    its 95% interval at Kish's effective sample size."""
    sources = sorted(groups)

    def macro(side: int) -> float:
        return math.fsum(math.fsum(groups[s][side]) / len(groups[s][side]) for s in sources) / len(sources)

    difference = math.fsum(math.fsum(y - x for x, y in zip(*groups[s], strict=True)) / len(groups[s][0])
                           for s in sources) / len(sources)
    return _entry(macro(0), macro(1), difference, macro_paired_interval(groups))


def _judge_score(record: Mapping[str, object]) -> float | None:
    judge = record.get("judge")
    if isinstance(judge, Mapping) and isinstance(judge.get("correct"), bool):
        return 1.0 if judge["correct"] else 0.0
    return None


def _producer(config: Mapping[str, object]) -> str:
    """Who produced an evaluation's answers: the live service, or the offline twin's policy."""
    backend = str(config.get("sampling_backend") or "")
    if config.get("offline") or backend.startswith("offline-"):
        return f"the offline twin's {backend.removeprefix('offline-') or 'scripted'} policy, not the model"
    return "live PyTRIO sampling"


def _show_command(path: Path, question_id: str) -> str:
    return invocation.command(f"show {shlex.quote(str(path))} --id {shlex.quote(question_id)}")


def compare_evals(a: LoadedEval, b: LoadedEval) -> Comparison:
    """The whole comparison as plain JSON (see the module docstring). Raises
    :class:`IncomparableEvals` when the files are not comparable or share no question."""
    problems = comparability_problems(a, b)
    if problems:
        raise IncomparableEvals("; ".join(problems))
    paired = sorted(set(a.records) & set(b.records))
    if not paired:
        raise IncomparableEvals("the two evaluations share no answered question")
    scores: list[Score] = list(SCORES)
    if all(_judge_score(a.records[k]) is not None and _judge_score(b.records[k]) is not None for k in paired):
        scores.append(JUDGE_SCORE)

    def score(record: Mapping[str, object], name: Score) -> float:
        try:
            value = _judge_score(record) if name == JUDGE_SCORE else answer_score(record, name)
        except (TypeError, ValueError):
            value = None
        if value is None or not 0.0 <= value <= 1.0:  # NaN fails too
            path = a.path if any(record is r for r in a.records.values()) else b.path
            raise EvalFileError(f"{path}: question {record.get('id')!r} has no {name} score in [0, 1]")
        return value

    by_source: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for key in paired:
        by_source[key[0]].append(key)
    sources = sorted(by_source)
    result: Comparison = {
        "a": str(a.path), "b": str(b.path),
        "model_a": a.config.get("model_path") or a.config.get("base_model"),
        "model_b": b.config.get("model_path") or b.config.get("base_model"),
        "produced_by_a": _producer(a.config), "produced_by_b": _producer(b.config),
        "paired_questions": len(paired),
        "only_in_a": len(set(a.records) - set(b.records)),
        "only_in_b": len(set(b.records) - set(a.records)),
        "difference": "b - a",
        "interval": ("paired 95%: Tango's score interval with continuity correction of the discordant counts "
                     "(fractional for F1); macro at Kish's effective sample size"),
        "few_questions_under": FEW_QUESTIONS,
        "test": "exact McNemar (two-sided binomial on the discordant questions)",
        "sources": {}, "macro": {}, "p_value": {}, "mcnemar": {}, "flipped": {},
    }
    for name in scores:
        groups = {s: ([score(a.records[k], name) for k in by_source[s]],
                      [score(b.records[k], name) for k in by_source[s]]) for s in sources}
        result["macro"][name] = macro_difference(groups)
        for source in sources:
            n = len(by_source[source])
            entry = result["sources"].setdefault(source, {"n": n, "few_questions": few_questions(n), "p_value": {}})
            entry[name] = paired_difference(*groups[source])
        if name == "f1":
            continue
        better = [k for k in paired if score(b.records[k], name) > score(a.records[k], name)]
        worse = [k for k in paired if score(b.records[k], name) < score(a.records[k], name)]
        result["mcnemar"][name] = {"b_only_right": len(better), "a_only_right": len(worse),
                                   "p_value": mcnemar_exact(len(better), len(worse))}
        result["p_value"][name] = result["mcnemar"][name]["p_value"]
        for source in sources:
            up = sum(1 for k in better if k[0] == source)
            down = sum(1 for k in worse if k[0] == source)
            result["sources"][source]["p_value"][name] = mcnemar_exact(up, down)
        result["flipped"][name] = {
            direction: [{"data_source": k[0], "id": k[1], "question": a.records[k].get("question"),
                         "show": [_show_command(a.path, k[1]), _show_command(b.path, k[1])]} for k in keys]
            for direction, keys in (("better_in_b", better), ("worse_in_b", worse))
        }
    return result


def format_comparison(result: Comparison, *, flips_shown: int = 10) -> str:
    """The console view: macro and per-source differences with intervals, McNemar p values,
    and the flipped questions with their ``show`` commands."""
    names = [n for n in (*SCORES, JUDGE_SCORE) if n in result["macro"]]
    labels = {"em": "EM", "f1": "F1", "cover_em": "cover EM", JUDGE_SCORE: "judge"}
    lines = [f"A: {result['a']}  ({result['model_a']}; answers by {result['produced_by_a']})",
             f"B: {result['b']}  ({result['model_b']}; answers by {result['produced_by_b']})",
             f"{plural(result['paired_questions'], 'question')} answered in both"
             + (f" ({result['only_in_a']} only in A, {result['only_in_b']} only in B, left out)"
                if result["only_in_a"] or result["only_in_b"] else ""),
             f"B - A, {result['interval']}; p: {result['test']}"]

    def cell(entry: Difference) -> str:
        return (f"{entry['a']:.3f} -> {entry['b']:.3f}  {entry['difference']:+.3f} "
                f"[{entry['ci95_low']:+.3f}, {entry['ci95_high']:+.3f}]")

    for name in names:
        p = result["p_value"].get(name)
        lines.append(f"  macro {labels[name]:<9}{cell(result['macro'][name])}"
                     + (f"  p={p:.4g}" if p is not None else ""))
    marked = False
    for source, entry in result["sources"].items():
        few = few_questions(int(entry["n"]))
        marked = marked or few
        lines.append(f"  {source} (n={entry['n']}{'*' if few else ''})")
        for name in names:
            p = entry["p_value"].get(name)
            lines.append(f"    {labels[name]:<9}{cell(entry[name])}" + (f"  p={p:.4g}" if p is not None else ""))
    if marked:
        lines.append(f"  * fewer than {FEW_QUESTIONS} paired questions: a wide interval, read it with care")
    flips = result["flipped"].get("em", {})
    counts = result["mcnemar"].get("em")
    lines.append(f"EM flips: {counts['b_only_right'] if counts else 0} right only in B, "
                 f"{counts['a_only_right'] if counts else 0} right only in A")
    for direction, heading in (("better_in_b", "right only in B"), ("worse_in_b", "right only in A")):
        for flip in flips.get(direction, [])[:flips_shown]:
            lines.append(f"  {heading}: {flip['id']}  "
                         f"{flip['show'][1] if direction == 'better_in_b' else flip['show'][0]}")
        hidden = len(flips.get(direction, [])) - flips_shown
        if hidden > 0:
            lines.append(f"  … {hidden} more {heading} (see --json)")
    return "\n".join(lines)
