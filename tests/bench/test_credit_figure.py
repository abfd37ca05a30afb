"""Figure 14's readings of a run's transcripts: repeated searches and how far turn credit moved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from searchr1.bench.credit import repeated_search_share, turn_credit_spread


def write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records), "utf-8")
    return path


def test_a_repeated_search_is_one_whose_query_its_trajectory_already_sent_case_and_spacing_aside(tmp_path):
    records = [
        {"searches": [{"query": "Eiffel"}, {"query": " eiffel  "}, {"query": "Paris", "tool": "search"},
                      {"query": "Paris", "refused": True}, {"query": "page=Paris", "tool": "open_page"}]},
        {"searches": [{"query": "Eiffel"}]},  # another trajectory: not a repeat
    ]
    assert repeated_search_share(write(tmp_path / "t.jsonl", records)) == pytest.approx(1 / 4)


def test_turn_credit_spread_counts_reversed_turns_and_how_far_turns_moved(tmp_path):
    records = [
        {"advantage": 0.5, "excluded": None, "turns": [{"advantage": 1.0}, {"advantage": -0.5}]},
        {"advantage": -0.5, "excluded": None, "turns": [{"advantage": -0.5}]},
        {"advantage": 0.0, "excluded": "degenerate_group", "turns": [{"advantage": 9.0}]},  # not trained
    ]
    reversed_share, moved = turn_credit_spread(write(tmp_path / "t.jsonl", records))
    assert reversed_share == pytest.approx(1 / 3)
    assert moved == pytest.approx((0.5 + 1.0 + 0.0) / (0.5 + 0.5 + 0.5))


def test_trajectory_credit_moves_nothing(tmp_path):
    records = [{"advantage": a, "excluded": None, "turns": [{"advantage": a}] * 3} for a in (0.25, -0.75)]
    assert turn_credit_spread(write(tmp_path / "t.jsonl", records)) == (0.0, 0.0)
