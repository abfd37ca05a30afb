"""``compare``: paired differences, exact McNemar, refusals (pure, on hand-made eval files)."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from searchr1.cli import main
from searchr1.evaluation.card import card_differences, eval_card
from searchr1.evaluation.compare import (
    IncomparableEvals,
    compare_evals,
    format_comparison,
    load_eval,
    macro_difference,
    mcnemar_exact,
    paired_difference,
)
from searchr1.evaluation.intervals import FEW_QUESTIONS
from searchr1.evaluation.metrics import summary_record
from eval_records import CONFIG, record

def write_eval(path: Path, records: list[dict], **config: object) -> Path:
    merged = {**CONFIG, **config}
    lines = [{"type": "eval_config", "config": merged}, *records,
             summary_record(records, config=merged, search_metrics={}, partial=False)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def outcomes(seed_bits: list[tuple[bool, bool, float]], sources: tuple[str, ...]) -> list[dict]:
    return [record(sources[i % len(sources)], i, em, f1, cover) for i, (em, cover, f1) in enumerate(seed_bits)]


SCORES = st.lists(st.tuples(st.booleans(), st.booleans(), st.floats(0, 1)), min_size=3, max_size=30)


def brute_force_mcnemar(b_only: int, a_only: int) -> float:
    """Two-sided exact test by enumerating every way the discordant questions could have fallen
    under 'each favours A or B with probability 1/2': the share of outcomes at least as
    extreme as the observed one (by distance of the count from n/2)."""
    n = b_only + a_only
    if n == 0:
        return 1.0
    observed = abs(b_only - n / 2)
    extreme = sum(1 for signs in itertools.product((0, 1), repeat=n) if abs(sum(signs) - n / 2) >= observed)
    return extreme / 2 ** n


@settings(deadline=None)
@given(st.integers(0, 40), st.integers(0, 40))
def test_mcnemar_equals_an_exact_binomial_by_enumeration_and_by_math_comb(b_only, a_only):
    """Invariant: the p value is the two-sided exact binomial (p = 1/2) tail of the discordant
    counts, computed here twice independently (enumeration; the closed form with math.comb)."""
    n = b_only + a_only
    closed = 1.0 if n == 0 else min(1.0, 2 * sum(math.comb(n, k) for k in range(min(b_only, a_only) + 1)) / 2 ** n)
    if n <= 12:
        assert mcnemar_exact(b_only, a_only) == pytest.approx(brute_force_mcnemar(b_only, a_only), abs=1e-12)
    assert mcnemar_exact(b_only, a_only) == pytest.approx(closed, abs=1e-12)
    assert mcnemar_exact(b_only, a_only) == mcnemar_exact(a_only, b_only)


@settings(max_examples=40, deadline=None)
@given(SCORES, SCORES)
def test_paired_difference_is_the_mean_difference_inside_its_interval_and_antisymmetric(left, right):
    """Invariants: the difference is mean(b) - mean(a); its interval holds it; swapping A and B
    negates the difference."""
    n = min(len(left), len(right))
    a, b = [x[2] for x in left[:n]], [x[2] for x in right[:n]]
    forward, backward = paired_difference(a, b), paired_difference(b, a)
    assert forward["difference"] == pytest.approx(sum(b) / n - sum(a) / n, abs=1e-12)
    assert forward["ci95_low"] <= forward["difference"] <= forward["ci95_high"]
    assert backward["difference"] == pytest.approx(-forward["difference"], abs=1e-12)
    assert (backward["ci95_low"], backward["ci95_high"]) == pytest.approx((-forward["ci95_high"], -forward["ci95_low"]))


@settings(max_examples=30, deadline=None)
@given(SCORES, st.sampled_from([("nq",), ("nq", "popqa"), ("nq", "popqa", "hotpotqa")]))
def test_macro_difference_is_the_mean_over_sources_of_per_source_differences(scores, sources):
    """Invariant: macro B - A == the unweighted mean over sources of (mean B - mean A)."""
    groups: dict[str, tuple[list[float], list[float]]] = {}
    for i, (em, cover, f1) in enumerate(scores):
        side = groups.setdefault(sources[i % len(sources)], ([], []))
        side[0].append(float(em))
        side[1].append(f1)
    result = macro_difference(groups)
    direct = sum(sum(b) / len(b) - sum(a) / len(a) for a, b in groups.values()) / len(groups)
    assert result["difference"] == pytest.approx(direct, abs=1e-12)
    assert result["ci95_low"] <= result["difference"] <= result["ci95_high"]


def test_compare_on_files_matches_a_direct_computation_from_the_records(tmp_path):
    sources = ("nq", "popqa", "hotpotqa")
    a_records = [record(sources[i % 3], i, i % 4 == 0, (i % 5) / 4, i % 3 == 0) for i in range(24)]
    b_records = [record(sources[i % 3], i, i % 2 == 0, (i % 3) / 2, i % 2 == 1) for i in range(24)]
    b_records.append(record("nq", 99, True, 1.0, True))  # answered only in B: left out
    result = compare_evals(load_eval(write_eval(tmp_path / "a.jsonl", a_records)),
                           load_eval(write_eval(tmp_path / "b.jsonl", b_records)))
    assert result["paired_questions"] == 24 and result["only_in_b"] == 1
    for name, field in (("em", "exact_match"), ("f1", "f1"), ("cover_em", "cover_em")):
        per_source = []
        for source in sources:
            a = [float(r[field]) for r in a_records if r["data_source"] == source]
            b = [float(r[field]) for r in b_records[:24] if r["data_source"] == source]
            per_source.append(sum(b) / len(b) - sum(a) / len(a))
        assert result["macro"][name]["difference"] == pytest.approx(sum(per_source) / 3, abs=1e-12)
    better = sum(1 for x, y in zip(a_records, b_records) if y["exact_match"] and not x["exact_match"])
    worse = sum(1 for x, y in zip(a_records, b_records) if x["exact_match"] and not y["exact_match"])
    assert result["p_value"]["em"] == pytest.approx(brute_force_mcnemar(better, worse), abs=1e-12)
    assert len(result["flipped"]["em"]["better_in_b"]) == better
    assert len(result["flipped"]["em"]["worse_in_b"]) == worse
    flip = result["flipped"]["em"]["better_in_b"][0]
    assert flip["show"][1].endswith(f"show {tmp_path / 'b.jsonl'} --id {flip['id']}")


@pytest.mark.parametrize("change, named", [
    ({"dataset_sha256": "e" * 64}, "dataset_sha256"),
    ({"protocol": "search-r1"}, "protocol"),
    ({"search_backend": "deepseek"}, "search_backend"),
    ({"search_topk": 5}, "search_topk"),
    ({"sampling": {**CONFIG["sampling"], "temperature": 1.0}}, "temperature"),
    ({"rollout": {**CONFIG["rollout"], "max_search_calls": 2}}, "budgets.max_search_calls"),
])
def test_compare_refuses_incomparable_evals_in_one_line_with_exit_2(tmp_path, change, named):
    records = [record("nq", i, i % 2 == 0, 0.5, True) for i in range(4)]
    a, b = write_eval(tmp_path / "a.jsonl", records), write_eval(tmp_path / "b.jsonl", records, **change)
    with pytest.raises(IncomparableEvals, match=named):
        compare_evals(load_eval(a), load_eval(b))
    result = CliRunner().invoke(main, ["compare", str(a), str(b)])
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1 and named in result.output
    assert "Traceback" not in result.output


@pytest.mark.slow  # the CLI draws a figure (matplotlib loads)
def test_compare_cli_json_and_plot(tmp_path):
    records_a = [record("nq", i, False, 0.0, False) for i in range(6)]
    records_b = [record("nq", i, i < 5, 1.0, True) for i in range(6)]
    a, b = write_eval(tmp_path / "a.jsonl", records_a), write_eval(tmp_path / "b.jsonl", records_b)
    result = CliRunner().invoke(main, ["compare", str(a), str(b), "--json", "--plot", str(tmp_path / "c.png")])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["macro"]["em"]["difference"] == pytest.approx(5 / 6)
    assert data["p_value"]["em"] == pytest.approx(2 / 2 ** 5)  # 5 discordant, all one way
    assert (tmp_path / "c.png").stat().st_size > 0
    text = CliRunner().invoke(main, ["compare", str(a), str(b)])
    assert "macro EM" in text.output and "--id nq-0" in text.output


def test_cards_differ_only_in_what_changes_the_numbers():
    metrics_a, metrics_b = {"questions/nq": 10}, {"questions/nq": 7}
    assert card_differences(eval_card(CONFIG, metrics_a), eval_card(CONFIG, metrics_b)) == []
    judged = {**CONFIG, "judge": {"model": "twin", "prompt_version": 1}}
    assert card_differences(eval_card(CONFIG, metrics_a), eval_card(judged, metrics_a)) == []
    other_judge = {**CONFIG, "judge": {"model": "deepseek-chat", "prompt_version": 1}}
    assert any("judge.model" in d for d in card_differences(eval_card(judged, metrics_a),
                                                             eval_card(other_judge, metrics_a)))


def test_the_macro_interval_holds_its_estimate_and_is_wide_at_one_question_a_source():
    """Three sources of one question, F1-like scores: the interval holds the macro difference
    (a percentile bootstrap's could round its low end above it) and is wide."""
    groups = {"nq": ([0.0], [0.29083298245845685]), "popqa": ([0.0], [1.0]), "hotpotqa": ([1.0], [0.0])}
    result = macro_difference(groups)
    assert result["ci95_low"] <= result["difference"] <= result["ci95_high"]
    assert result["ci95_high"] - result["ci95_low"] > 0.5


def test_seven_sources_of_one_question_give_wide_intervals_that_agree_with_the_p_value(tmp_path):
    """Seven sources of one question, three turned right by B and none turned wrong: the macro
    difference 3/7 has p = 0.25 (exact McNemar) and an interval that is no point and holds 0,
    as a p of 0.25 says; each source's is wide; every source is marked as having few questions."""
    sources = ("nq", "popqa", "hotpotqa", "musique", "bamboogle", "triviaqa", "2wikimultihopqa")
    a_records = [record(s, i, False, 0.0, False) for i, s in enumerate(sources)]
    b_records = [record(s, i, i < 3, 1.0 if i < 3 else 0.0, i < 3) for i, s in enumerate(sources)]
    result = compare_evals(load_eval(write_eval(tmp_path / "a.jsonl", a_records)),
                           load_eval(write_eval(tmp_path / "b.jsonl", b_records)))
    macro = result["macro"]["em"]
    assert macro["difference"] == pytest.approx(3 / 7) and result["p_value"]["em"] == pytest.approx(0.25)
    assert macro["ci95_low"] < 0 < macro["ci95_high"] and macro["ci95_high"] - macro["ci95_low"] > 0.5
    for entry in result["sources"].values():
        assert entry["few_questions"] is True
        assert entry["em"]["ci95_high"] - entry["em"]["ci95_low"] > 0.5
    assert result["few_questions_under"] == FEW_QUESTIONS
    printed = format_comparison(result)
    assert "(n=1*)" in printed and f"fewer than {FEW_QUESTIONS} paired questions" in printed


@pytest.mark.parametrize("f1", [1.5, -0.2, "high", None, float("nan")])
def test_a_score_outside_0_1_is_one_line_naming_the_file_and_question(tmp_path, f1):
    records = [record("nq", i, True, 1.0, True) for i in range(3)]
    broken = [dict(r) for r in records]
    broken[1]["f1"] = f1
    a = tmp_path / "a.jsonl"
    write_eval(a, records)
    b = tmp_path / "b.jsonl"
    lines = [{"type": "eval_config", "config": CONFIG}, *broken,
             summary_record(records, config=CONFIG, search_metrics={}, partial=False)]
    b.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    result = CliRunner().invoke(main, ["compare", str(a), str(b)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert str(b) in result.output and "'nq-1'" in result.output and "f1" in result.output
