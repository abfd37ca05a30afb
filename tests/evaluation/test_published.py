"""The published numbers printed by `eval --protocol search-r1`."""

from __future__ import annotations

import pytest

from searchr1.evaluation.published import BENCHMARKS, PUBLISHED, comparison_table


@pytest.mark.parametrize("row", PUBLISHED, ids=lambda row: row.label)
def test_each_stated_average_is_the_mean_of_its_seven_numbers_or_the_row_says_it_is_not(row):
    """A mistyped digit shows up here: the sources state macro averages over the seven sets."""
    assert row.model and row.source and set(row.em) == set(BENCHMARKS)
    agrees = abs(row.reported_average - row.average) <= 0.0015
    assert agrees or (f"{row.reported_average:.3f}" in row.note and f"{row.average:.3f}" in row.note)


def test_the_table_puts_ours_first_and_marks_every_published_row_as_another_model():
    metrics = {f"em/{b}": 0.1 * (i + 1) for i, b in enumerate(BENCHMARKS[:3])}
    table = comparison_table(metrics, model="Qwen/Qwen3.5-4B", retriever="BM25")
    lines = table.splitlines()
    ours = next(line for line in lines if line.strip().startswith("ours"))
    assert ours.split()[1:] == ["0.100", "0.200", "0.300", "-", "-", "-", "-", "0.200"]
    for row in PUBLISHED:
        assert f"{row.label} *" in table and row.model in table
    assert "over the 3 benchmarks evaluated" in table


def test_an_offline_row_names_the_twins_policy_and_is_marked_not_comparable():
    metrics = {f"em/{b}": 1.0 for b in BENCHMARKS}
    table = comparison_table(metrics, model="twin learning policy at trio://x", retriever="BM25", offline=True)
    ours = next(line for line in table.splitlines() if line.strip().startswith("ours"))
    assert "not comparable" in ours
    assert "ours: twin learning policy at trio://x" in table and "Qwen3.5" not in table
    live = comparison_table(metrics, model="Qwen/Qwen3.5-4B", retriever="BM25")
    assert "not comparable" not in live
