"""Paired comparison of two evaluations of the same questions (``compare EVAL_A EVAL_B``).

Only the questions both files answered count (paired by data source and id). Differences are
``B - A``:

* per source and macro (the unweighted mean of the per-source differences, i.e. macro B minus
  macro A on the paired questions), for EM, F1 and cover EM, with a paired percentile bootstrap
  interval: questions are resampled with replacement and each keeps its pair of scores (a
  resample of the per-question differences); the macro interval resamples within each source
  (stratified), as the eval summary's macro interval does. Seeded, so the same files always
  give the same intervals;
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
from typing import Any


from searchr1.evaluation.card import card_differences, eval_card
from searchr1.view.wording import plural
from searchr1.evaluation.metrics import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    EvalFileError,
    answer_score,
    bootstrap_ci,
    load_summary,
    read_eval_records,
    stratified_macro_ci,
)
from searchr1.runtime import invocation

SCORES = ("em", "f1", "cover_em")
BINARY_SCORES = ("em", "cover_em")
JUDGE_SCORE = "judge"
# Config fields that must agree (besides the cards): the question set and the sampling seed
# source are in the card too; these name the rest of "what was asked, how it was searched".
BINDING_CONFIG = ("dataset_sha256", "protocol", "search_backend", "search_topk", "search_index",
                  "search_cassette", "system_prompt", "tool_description")
DECODING_CONFIG = ("temperature", "top_p", "max_tokens")


class IncomparableEvals(ValueError):
    """Two evaluations that cannot be compared; the message says what differs."""


@dataclass(frozen=True)
class LoadedEval:
    path: Path
    config: dict[str, Any]
    card: dict[str, Any]
    records: dict[tuple[str, str], dict[str, Any]]  # (data_source, id) -> the question's first record


def load_eval(path: str | Path) -> LoadedEval:
    """An eval file's configuration, card and records (the last summary's config; a file
    written before cards existed gets its card rebuilt from that config)."""
    path = Path(path)
    summary = load_summary(path)
    config = summary.get("config") if isinstance(summary.get("config"), dict) else {}
    card = summary.get("card") if isinstance(summary.get("card"), dict) else eval_card(config, summary["metrics"])
    records: dict[tuple[str, str], dict[str, Any]] = {}
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
    sampling_a, sampling_b = a.config.get("sampling") or {}, b.config.get("sampling") or {}
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


def paired_difference(a: Sequence[float], b: Sequence[float], *, seed: int = BOOTSTRAP_SEED,
                      resamples: int = BOOTSTRAP_RESAMPLES) -> dict[str, float]:
    """Mean of ``b - a`` over paired scores with its paired bootstrap interval."""
    differences = [y - x for x, y in zip(a, b, strict=True)]
    difference = math.fsum(differences) / len(differences)
    low, high = _holding(bootstrap_ci(differences, resamples=resamples, seed=seed), difference)
    return {"a": math.fsum(a) / len(a), "b": math.fsum(b) / len(b),
            "difference": difference, "ci95_low": low, "ci95_high": high}


def _holding(interval: tuple[float, float], estimate: float) -> tuple[float, float]:
    """The interval widened, if need be, to hold the estimate: when every resample gives the
    estimate's value, the percentiles may round a last digit away from it."""
    low, high = interval
    return min(low, estimate), max(high, estimate)


def macro_difference(groups: Mapping[str, tuple[Sequence[float], Sequence[float]]], *,
                     seed: int = BOOTSTRAP_SEED, resamples: int = BOOTSTRAP_RESAMPLES) -> dict[str, float]:
    """Macro ``b - a`` (unweighted mean over sources of the per-source mean differences), with a
    bootstrap interval stratified by source."""
    differences = {s: [y - x for x, y in zip(a, b, strict=True)] for s, (a, b) in groups.items()}
    sources = sorted(groups)
    difference = math.fsum(math.fsum(differences[s]) / len(differences[s]) for s in sources) / len(sources)
    low, high = _holding(stratified_macro_ci(differences, resamples=resamples, seed=seed), difference)

    def macro(side: int) -> float:
        return math.fsum(math.fsum(groups[s][side]) / len(groups[s][side]) for s in sources) / len(sources)

    return {"a": macro(0), "b": macro(1), "difference": difference, "ci95_low": low, "ci95_high": high}


def _judge_score(record: Mapping[str, Any]) -> float | None:
    judge = record.get("judge")
    if isinstance(judge, Mapping) and isinstance(judge.get("correct"), bool):
        return 1.0 if judge["correct"] else 0.0
    return None


def _producer(config: Mapping[str, Any]) -> str:
    """Who produced an evaluation's answers: the live service, or the offline twin's policy."""
    backend = str(config.get("sampling_backend") or "")
    if config.get("offline") or backend.startswith("offline-"):
        return f"the offline twin's {backend.removeprefix('offline-') or 'scripted'} policy, not the model"
    return "live PyTRIO sampling"


def _show_command(path: Path, question_id: str) -> str:
    return invocation.command(f"show {shlex.quote(str(path))} --id {shlex.quote(question_id)}")


def compare_evals(a: LoadedEval, b: LoadedEval, *, seed: int = BOOTSTRAP_SEED,
                  resamples: int = BOOTSTRAP_RESAMPLES) -> dict[str, Any]:
    """The whole comparison as plain JSON (see the module docstring). Raises
    :class:`IncomparableEvals` when the files are not comparable or share no question."""
    problems = comparability_problems(a, b)
    if problems:
        raise IncomparableEvals("; ".join(problems))
    paired = sorted(set(a.records) & set(b.records))
    if not paired:
        raise IncomparableEvals("the two evaluations share no answered question")
    scores = list(SCORES)
    if all(_judge_score(a.records[k]) is not None and _judge_score(b.records[k]) is not None for k in paired):
        scores.append(JUDGE_SCORE)

    def score(record: Mapping[str, Any], name: str) -> float:
        value = _judge_score(record) if name == JUDGE_SCORE else answer_score(record, name)
        assert value is not None
        return value

    by_source: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for key in paired:
        by_source[key[0]].append(key)
    sources = sorted(by_source)
    result: dict[str, Any] = {
        "a": str(a.path), "b": str(b.path),
        "model_a": a.config.get("model_path") or a.config.get("base_model"),
        "model_b": b.config.get("model_path") or b.config.get("base_model"),
        "produced_by_a": _producer(a.config), "produced_by_b": _producer(b.config),
        "paired_questions": len(paired),
        "only_in_a": len(set(a.records) - set(b.records)),
        "only_in_b": len(set(b.records) - set(a.records)),
        "difference": "b - a",
        "interval": (f"paired percentile bootstrap over questions, {resamples} resamples, seed {seed}; "
                     "macro stratified by source"),
        "test": "exact McNemar (two-sided binomial on the discordant questions)",
        "sources": {}, "macro": {}, "p_value": {}, "mcnemar": {}, "flipped": {},
    }
    for index, name in enumerate(scores):
        offset = seed + 1000 * index
        groups = {s: ([score(a.records[k], name) for k in by_source[s]],
                      [score(b.records[k], name) for k in by_source[s]]) for s in sources}
        result["macro"][name] = macro_difference(groups, seed=offset, resamples=resamples)
        for position, source in enumerate(sources):
            entry = result["sources"].setdefault(source, {"n": len(by_source[source]), "p_value": {}})
            entry[name] = paired_difference(*groups[source], seed=offset + 1 + position, resamples=resamples)
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


def format_comparison(result: Mapping[str, Any], *, flips_shown: int = 10) -> str:
    """The console view: macro and per-source differences with intervals, McNemar p values,
    and the flipped questions with their ``show`` commands."""
    names = [n for n in ("em", "f1", "cover_em", JUDGE_SCORE) if n in result["macro"]]
    labels = {"em": "EM", "f1": "F1", "cover_em": "cover EM", JUDGE_SCORE: "judge"}
    lines = [f"A: {result['a']}  ({result['model_a']}; answers by {result['produced_by_a']})",
             f"B: {result['b']}  ({result['model_b']}; answers by {result['produced_by_b']})",
             f"{plural(result['paired_questions'], 'question')} answered in both"
             + (f" ({result['only_in_a']} only in A, {result['only_in_b']} only in B, left out)"
                if result["only_in_a"] or result["only_in_b"] else ""),
             f"B - A, {result['interval']}; p: {result['test']}"]

    def cell(entry: Mapping[str, float]) -> str:
        return (f"{entry['a']:.3f} -> {entry['b']:.3f}  {entry['difference']:+.3f} "
                f"[{entry['ci95_low']:+.3f}, {entry['ci95_high']:+.3f}]")

    for name in names:
        p = result["p_value"].get(name)
        lines.append(f"  macro {labels[name]:<9}{cell(result['macro'][name])}"
                     + (f"  p={p:.4g}" if p is not None else ""))
    for source, entry in result["sources"].items():
        lines.append(f"  {source} (n={entry['n']})")
        for name in names:
            p = entry["p_value"].get(name)
            lines.append(f"    {labels[name]:<9}{cell(entry[name])}" + (f"  p={p:.4g}" if p is not None else ""))
    flips = result["flipped"].get("em", {})
    counts = result["mcnemar"].get("em", {})
    lines.append(f"EM flips: {counts.get('b_only_right', 0)} right only in B, {counts.get('a_only_right', 0)} "
                 "right only in A")
    for direction, heading in (("better_in_b", "right only in B"), ("worse_in_b", "right only in A")):
        for flip in flips.get(direction, [])[:flips_shown]:
            lines.append(f"  {heading}: {flip['id']}  "
                         f"{flip['show'][1] if direction == 'better_in_b' else flip['show'][0]}")
        hidden = len(flips.get(direction, [])) - flips_shown
        if hidden > 0:
            lines.append(f"  … {hidden} more {heading} (see --json)")
    return "\n".join(lines)
