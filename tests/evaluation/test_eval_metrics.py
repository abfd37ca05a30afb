"""Evaluation aggregation: records, metrics, their intervals, summaries."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchr1.core.types import (
    CallRecord,
    RewardResult,
    SearchExample,
    Termination,
    Trajectory,
    Turn,
)
from searchr1.evaluation.intervals import wilson_cc
from searchr1.evaluation.metrics import (
    EvalFileError,
    evaluation_metrics,
    load_summary,
    load_summary_with_current_intervals,
    summary_record,
    trajectory_record,
)


def record(
    source: str,
    id_: str,
    em: bool,
    *,
    fmt: bool = True,
    searches: int = 1,
    turns: int | None = None,
    termination: str = "answer",
    env_error: bool = False,
    reward: float | None = None,
) -> dict:
    """A trajectory record as trajectory_record writes it (built by hand to control each field)."""
    return {
        "type": "trajectory",
        "id": id_,
        "question": f"question {id_}?",
        "answers": ["x"],
        "data_source": source,
        "turns": [{"text": "t", "stop_reason": "stop"}] * (turns if turns is not None else searches + 1),
        "searches": [
            {
                "query": "q",
                "ok": not env_error,
                "error": "boom" if env_error else None,
                "observation": "o",
                "items": 3,
                "cached": False,
                "truncated": False,
            }
        ]
        * searches,
        "final_text": "Answer: x",
        "termination": termination,
        "reward": reward if reward is not None else (1.0 if em else 0.0 if fmt else -0.1),
        "exact_match": em,
        "valid_format": fmt,
        "search_calls": searches,
        "assistant_turns": turns if turns is not None else searches + 1,
        "env_error": env_error,
    }


def source_records(source: str, correct: int, total: int, **kwargs) -> list[dict]:
    return [record(source, f"{source}/{i}", i < correct, **kwargs) for i in range(total)]


# --- trajectory_record ---------------------------------------------------------------------


def test_trajectory_record_keeps_the_whole_transcript():
    example = SearchExample(
        "nq/test_0", "who got the first nobel prize in physics?", ("Wilhelm Röntgen", "Röntgen"), "nq"
    )
    trajectory = Trajectory(example=example, question_index=3, group_index=0, messages=[
        {"role": "user", "content": example.question}, {"role": "assistant", "content": "<tool_call>search</tool_call>"},
        {"role": "tool", "content": "1. Röntgen ..."}, {"role": "assistant", "content": "Answer: Röntgen"}])
    trajectory.turns = [
        Turn([1, 2], [3], [-0.1], "<tool_call>search</tool_call>", "stop"),
        Turn([1, 2, 3, 4], [5, 6], [-0.2, -0.3], "Answer: Röntgen", "length"),
    ]
    trajectory.turns[0].calls = [
        CallRecord(
            "first nobel prize physics",
            ok=True,
            observation="1. Röntgen ...",
            items=3,
            cached=True,
            truncated=True,
            tool="search",
        )
    ]
    trajectory.finish("answer", "Answer: Röntgen")
    trajectory.reward_result = RewardResult(1.0, True, True, "Röntgen")

    rec = json.loads(json.dumps(trajectory_record(trajectory), ensure_ascii=False))
    assert rec["type"] == "trajectory"
    assert (rec["id"], rec["question"], rec["data_source"]) == (example.id, example.question, "nq")
    assert rec["answers"] == ["Wilhelm Röntgen", "Röntgen"]
    assert rec["turns"] == [
        {"text": "<tool_call>search</tool_call>", "stop_reason": "stop", "prompt_tokens": 2, "generated_tokens": 1},
        {"text": "Answer: Röntgen", "stop_reason": "length", "prompt_tokens": 4, "generated_tokens": 2},
    ]  # each turn's prompt [1, 2] / [1, 2, 3, 4] and reply [3] / [5, 6], counted
    assert rec["searches"] == [
        {
            "query": "first nobel prize physics",
            "ok": True,
            "error": None,
            "observation": "1. Röntgen ...",
            "items": 3,
            "cached": True,
            "truncated": True,
            "tool": "search",
            "refused": False,
            "turn": 1,  # the first assistant turn made the call
        }
    ]
    assert rec["final_text"] == "Answer: Röntgen"
    assert rec["termination"] == "answer"
    assert (rec["reward"], rec["exact_match"], rec["valid_format"]) == (1.0, True, True)
    assert (rec["search_calls"], rec["assistant_turns"], rec["env_error"]) == (1, 2, False)


def test_trajectory_record_of_a_failed_search_keeps_the_error():
    trajectory = Trajectory(SearchExample("a", "q?", ("x",), "nq"), 0, 0, [], turns=[Turn([1], [2], [-0.1], "")])
    trajectory.turns[0].calls = [CallRecord("q", ok=False, observation="Search error: timeout", error="timeout",
                                            tool="search")]
    rec = trajectory_record(trajectory)
    assert rec["searches"][0]["ok"] is False and rec["searches"][0]["error"] == "timeout"
    assert rec["env_error"] is True and rec["termination"] is None


# --- metrics -------------------------------------------------------------------------------


def test_macro_and_micro_differ_when_sources_have_unequal_sizes():
    records = source_records("bamboogle", 2, 2) + source_records("nq", 0, 8)
    m = evaluation_metrics(records)
    assert m["em/bamboogle"] == 1.0 and m["em/nq"] == 0.0
    assert m["em/macro"] == pytest.approx(0.5)
    assert m["em/micro"] == pytest.approx(0.2)
    assert (m["questions/bamboogle"], m["questions/nq"]) == (2, 8)


def test_macro_equals_micro_for_equal_source_sizes():
    m = evaluation_metrics(source_records("nq", 3, 10) + source_records("popqa", 6, 10))
    assert m["em/macro"] == pytest.approx(m["em/micro"]) == pytest.approx(0.45)


def test_format_rates_overall_and_per_source():
    records = [record("nq", f"n{i}", False, fmt=i < 3) for i in range(4)] + [
        record("popqa", f"p{i}", False, fmt=False) for i in range(4)
    ]
    m = evaluation_metrics(records)
    assert m["format/nq"] == 0.75 and m["format/popqa"] == 0.0
    assert m["format/rate"] == pytest.approx(3 / 8)


def test_rollout_rates_and_terminations():
    records = [
        record("nq", "a", True, searches=0, termination="answer"),
        record("nq", "b", False, searches=2, termination="search_budget"),
        record("nq", "c", False, searches=1, termination="invalid", env_error=True),
        record("nq", "d", False, searches=1, termination=None),
    ]
    m = evaluation_metrics(records)
    assert m["rollout/no_search_rate"] == 0.25
    assert m["rollout/search_calls"] == 1.0
    assert m["rollout/turns"] == 2.0
    assert m["rollout/env_error_rate"] == 0.25
    assert m["rollout/search_ok_rate"] == pytest.approx(3 / 4)
    assert m["rollout/termination/answer"] == 0.25
    assert m["rollout/termination/search_budget"] == 0.25
    assert m["rollout/termination/unfinished"] == 0.25
    assert all(f"rollout/termination/{r}" in m for r in tuple(Termination))
    assert sum(v for k, v in m.items() if k.startswith("rollout/termination/")) == pytest.approx(1.0)


def test_search_rates_absent_without_searches():
    m = evaluation_metrics([record("nq", "a", True, searches=0)])
    assert "rollout/search_ok_rate" not in m


def test_repeated_records_of_one_question_count_once_for_em():
    records = [record("nq", "a", True), record("nq", "a", False), record("nq", "b", False)]
    m = evaluation_metrics(records)
    assert m["eval/questions"] == 2 and m["eval/trajectories"] == 3
    assert m["em/micro"] == pytest.approx(0.25)  # (0.5 + 0) / 2 questions


def test_non_trajectory_records_are_ignored_and_empty_input_refused():
    records = source_records("nq", 1, 2)
    assert evaluation_metrics(records + [{"type": "summary", "metrics": {}}]) == evaluation_metrics(records)
    with pytest.raises(ValueError, match="no trajectory records"):
        evaluation_metrics([{"type": "summary"}])


@settings(max_examples=60, deadline=None)
@given(
    rewards=st.lists(st.sampled_from([1.0, 0.0, -0.1, 0.3, 0.7]), min_size=2, max_size=30),
    order=st.randoms(use_true_random=False),
)
def test_metrics_do_not_depend_on_the_order_records_arrive_in(rewards, order):
    """Concurrent questions finish in any order; the summary must be bit-identical anyway (a
    plain float sum of 0.3 + 0.7 + ... changes in the last bit with the order)."""
    records = [record("nq", f"nq/{i}", r == 1.0, reward=r) for i, r in enumerate(rewards)]
    shuffled = list(records)
    order.shuffle(shuffled)
    assert evaluation_metrics(shuffled) == evaluation_metrics(records)


# --- intervals ---------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    groups=st.dictionaries(
        st.sampled_from(["nq", "popqa", "musique", "bamboogle"]),
        st.lists(st.booleans(), min_size=1, max_size=25),
        min_size=1,
    ),
)
def test_every_interval_holds_its_estimate_within_0_1_and_is_never_a_point(groups):
    """Invariants: for EM, per source, macro and micro, low <= estimate <= high, inside [0, 1],
    and the interval has a width at any number of questions (1 of 1 right is not certainty)."""
    records = [record(s, f"{s}/{i}", em) for s, ems in groups.items() for i, em in enumerate(ems)]
    m = evaluation_metrics(records)
    for name in ("macro", "micro"):
        assert 0.0 <= m[f"em/{name}_ci95_low"] <= m[f"em/{name}"] <= m[f"em/{name}_ci95_high"] <= 1.0
        assert m[f"em/{name}_ci95_high"] - m[f"em/{name}_ci95_low"] > 0.01
    for s in groups:
        assert 0.0 <= m[f"em_ci95_low/{s}"] <= m[f"em/{s}"] <= m[f"em_ci95_high/{s}"] <= 1.0
        assert m[f"em_ci95_high/{s}"] - m[f"em_ci95_low/{s}"] > 0.01


def test_one_or_two_questions_a_source_give_wide_intervals_not_points():
    """One question a source, some right: every source is all right or all wrong, where a
    percentile bootstrap (within sources, for the macro too) has no spread; these intervals do."""
    records = [record(s, f"{s}/0", right) for s, right in
               [("nq", True), ("popqa", False), ("hotpotqa", True), ("musique", False), ("bamboogle", False),
                ("triviaqa", True), ("2wikimultihopqa", False)]]
    m = evaluation_metrics(records)
    assert m["em/macro"] == pytest.approx(3 / 7)
    assert m["em/macro_ci95_high"] - m["em/macro_ci95_low"] > 0.5  # seven questions say little
    assert m["em_ci95_low/nq"] < 0.1 and m["em_ci95_high/popqa"] > 0.9  # one question says less


def test_ci_narrows_with_more_data():
    small = evaluation_metrics(source_records("nq", 5, 10) + source_records("popqa", 5, 10))
    large = evaluation_metrics(source_records("nq", 500, 1000) + source_records("popqa", 500, 1000))
    for name in ("macro", "micro"):
        width_small = small[f"em/{name}_ci95_high"] - small[f"em/{name}_ci95_low"]
        width_large = large[f"em/{name}_ci95_high"] - large[f"em/{name}_ci95_low"]
        assert width_small > 0.4  # about +-0.22 for n=20, p=0.5
        assert width_large < width_small / 5


def test_a_source_interval_is_the_wilson_interval_of_its_count_and_equal_sources_pool_into_the_macro():
    """Per source: the proportion's Wilson-CC interval. Two sources of equal size: the macro is
    the pooled proportion over both, with the Wilson-CC interval of all their questions (Kish's
    effective size is then the total)."""
    m = evaluation_metrics(source_records("nq", 3, 8) + source_records("popqa", 6, 8))
    nq = wilson_cc(3 / 8, 8)
    assert (m["em_ci95_low/nq"], m["em_ci95_high/nq"]) == pytest.approx((nq.low, nq.high))
    pooled = wilson_cc(9 / 16, 16)
    assert (m["em/macro_ci95_low"], m["em/macro_ci95_high"]) == pytest.approx((pooled.low, pooled.high))
    assert (m["em/micro_ci95_low"], m["em/micro_ci95_high"]) == pytest.approx((pooled.low, pooled.high))


def test_f1_gets_the_interval_of_a_0_1_score_with_its_mean_even_when_its_values_agree():
    """F1 is mostly 0 with partial matches. Two questions at 0.5 each have no spread, yet say
    little: the interval is the one two 0/1 answers with mean 0.5 get (Wilson-CC of 1 of 2,
    computed here from Newcombe's formula), never the point a t interval would give."""
    records = [{**record("nq", f"nq/{i}", False), "f1": 0.5} for i in range(2)]
    m = evaluation_metrics(records)
    z = 1.959963984540054
    low = (2 * 2 * 0.5 + z * z - 1 - z * math.sqrt(z * z - 2 - 1 / 2 + 4 * 0.5 * (2 * 0.5 + 1))) / (2 * (2 + z * z))
    assert m["f1/nq"] == 0.5
    assert (m["f1_ci95_low/nq"], m["f1_ci95_high/nq"]) == pytest.approx((low, 1 - low))
    assert m["f1/macro_ci95_high"] - m["f1/macro_ci95_low"] > 0.9


def test_an_old_file_plots_the_intervals_of_todays_rules_and_keeps_its_scores(tmp_path):
    """A summary written when the intervals were a percentile bootstrap ([1, 1] for one right
    answer) reads back with today's interval; its scores and other fields stay as stored."""
    records = source_records("nq", 1, 1) + source_records("popqa", 0, 1)
    summary = summary_record(records, config=CONFIG, search_metrics={}, partial=False)
    summary["metrics"].update({"em_ci95_low/nq": 1.0, "em_ci95_high/nq": 1.0, "em/macro_ci95_low": 0.5,
                               "em/macro_ci95_high": 0.5, "search/requests": 7})
    path = tmp_path / "old.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in [*records, summary]), encoding="utf-8")
    assert load_summary(path)["metrics"]["em_ci95_low/nq"] == 1.0  # as stored
    current = load_summary_with_current_intervals(path)["metrics"]
    assert current["em_ci95_low/nq"] == pytest.approx(wilson_cc(1.0, 1).low) and current["em_ci95_low/nq"] < 0.1
    assert current["em/macro_ci95_high"] - current["em/macro_ci95_low"] > 0.5
    assert current["em/macro"] == 0.5 and current["search/requests"] == 7


# --- summary -----------------------------------------------------------------------------------

CONFIG = {
    "search_backend": "deepseek",
    "search_concurrency": 16,
    "search_timeout": 60.0,
    "search_model": "deepseek-v4-flash",
    "sampling": {"temperature": 0.0, "top_p": 1.0, "max_assistant_tokens": 1024},
    "base_model": "Qwen/Qwen3.5-4B",
    "model_path": None,
    "dataset_path": "datasets/dev.jsonl",
    "dataset_sha256": "ab" * 32,
    "code_version": "0.1.0+g1234567",
}


def test_summary_record_schema():
    records = source_records("nq", 1, 4) + source_records("popqa", 2, 2)
    summary = summary_record(
        records, config=CONFIG, search_metrics={"search/success_rate": 0.9, "requests": 5}, partial=True
    )
    assert summary["type"] == "summary"
    assert summary["partial"] is True
    assert summary["evaluated_examples"] == 6
    assert summary["config"] == CONFIG and summary["config"] is not CONFIG
    assert summary["metrics"]["search/success_rate"] == 0.9
    assert summary["metrics"]["search/requests"] == 5
    assert summary["metrics"]["em/macro"] == pytest.approx((0.25 + 1.0) / 2)
    json.dumps(summary, allow_nan=False)


def test_summary_record_refuses_a_config_that_is_not_json():
    with pytest.raises(ValueError, match="not plain JSON"):
        summary_record(
            source_records("nq", 1, 1), config={"path": Path("x")}, search_metrics={}, partial=False
        )


# --- load_summary ----------------------------------------------------------------------------


def write_eval(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_load_summary_returns_the_last_summary(tmp_path):
    records = source_records("nq", 1, 2)
    first = summary_record(records[:1], config=CONFIG, search_metrics={}, partial=True)
    last = summary_record(records, config=CONFIG, search_metrics={}, partial=False)
    path = write_eval(
        tmp_path / "e.jsonl",
        [json.dumps(records[0]), json.dumps(first), "", json.dumps(records[1]), json.dumps(last)],
    )
    assert load_summary(path) == json.loads(json.dumps(last))


def test_load_summary_names_the_bad_line(tmp_path):
    path = write_eval(tmp_path / "e.jsonl", [json.dumps(record("nq", "a", True)), '{"type": "summ'])
    with pytest.raises(EvalFileError, match=rf"{path}:2: invalid JSON"):
        load_summary(path)


def test_load_summary_without_summary_says_so(tmp_path):
    path = write_eval(tmp_path / "e.jsonl", [json.dumps(record("nq", "a", True))])
    with pytest.raises(EvalFileError, match="no summary record"):
        load_summary(path)


def test_f1_and_cover_em_are_reported_per_source_with_intervals_whatever_the_training_reward():
    records = [{**record("nq", f"nq/{i}", i == 0), "f1": [1.0, 0.5, 0.0, 0.5][i], "cover_em": i < 3}
               for i in range(4)]
    metrics = evaluation_metrics(records)
    assert metrics["em/nq"] == 0.25 and metrics["f1/nq"] == 0.5 and metrics["cover_em/nq"] == 0.75
    for name in ("em", "f1", "cover_em"):
        assert metrics[f"{name}_ci95_low/nq"] <= metrics[f"{name}/nq"] <= metrics[f"{name}_ci95_high/nq"]
        assert metrics[f"{name}/macro_ci95_low"] <= metrics[f"{name}/macro"] <= metrics[f"{name}/macro_ci95_high"]


def test_records_written_before_f1_existed_are_scored_from_their_final_text():
    old = {**record("nq", "nq/0", False), "answers": ["Paris France"], "final_text": "Answer: Paris"}
    metrics = evaluation_metrics([old])
    assert metrics["f1/nq"] == pytest.approx(2 * 1 * 0.5 / 1.5) and metrics["cover_em/nq"] == 0.0
