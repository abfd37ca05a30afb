"""The comparability card: in every eval summary, and on every published row."""

from __future__ import annotations

from searchr1.evaluation.card import METRIC_DEFINITIONS, card_differences, eval_card, format_card
from searchr1.evaluation.intervals import FEW_QUESTIONS
from searchr1.evaluation.metrics import summary_record
from searchr1.evaluation.published import PUBLISHED
from eval_records import CONFIG, record

CARD_FIELDS = {"corpus", "retriever", "top_k", "budgets", "decoding", "metrics", "n_per_source", "interval"}
EVAL_CARD_FIELDS = CARD_FIELDS | {"few_questions"}


def test_every_summary_carries_a_card_with_every_field_and_its_own_counts():
    records = [record("nq", i, True, 1.0, True) for i in range(3)] + [record("popqa", 9, False, 0.0, False)]
    card = summary_record(records, config=CONFIG, search_metrics={}, partial=False)["card"]
    assert EVAL_CARD_FIELDS <= set(card)
    assert card["n_per_source"] == {"nq": 3, "popqa": 1}
    assert card["few_questions"] == {"under": FEW_QUESTIONS, "sources": ["nq", "popqa"]}
    assert card["top_k"] == 3 and card["budgets"]["max_search_calls"] == 4
    assert card["decoding"]["temperature"] == 0.0
    assert all(card["metrics"][name]["source"] for name in METRIC_DEFINITIONS)
    assert "Wilson" in card["interval"] and "bootstrap" not in card["interval"]
    assert "corpus" in format_card(card) and "fewer than" in format_card(card)


def test_published_rows_show_their_own_card_from_their_source():
    for row in PUBLISHED:
        assert CARD_FIELDS <= set(row.card)
        assert row.card["source"] == row.source
        assert row.card["top_k"] == 3 and "wiki-18" in row.card["corpus"]["name"]


def test_a_budget_change_is_a_card_difference():
    changed = {**CONFIG, "rollout": {**CONFIG["rollout"], "max_assistant_tokens": 1024}}
    differences = card_differences(eval_card(CONFIG, {}), eval_card(changed, {}))
    assert differences == ["budgets.max_assistant_tokens: 500 -> 1024"]


def test_a_file_whose_intervals_were_drawn_by_another_rule_still_compares():
    """The interval rule and the small-source list describe the file, not the setting that made
    its scores: an eval written when intervals were a bootstrap compares with a new one."""
    old = {k: v for k, v in eval_card(CONFIG, {"questions/nq": 3}).items() if k != "few_questions"}
    old["interval"] = "95% percentile bootstrap, 2000 resamples, seed 0: per source over its questions"
    assert card_differences(old, eval_card(CONFIG, {"questions/nq": 30})) == []
