"""Figure 5's scaling rows (:mod:`searchr1.bench.client_scaling`): their structure, the ratio they
hold to 1.25 and the sizes they measure. No timing is asserted (timings live in the bench)."""

from __future__ import annotations

import statistics

import pytest

from searchr1.bench.client_scaling import (
    FULL_SIZES,
    GROWTH_TARGET,
    QUICK_SIZES,
    SMALLEST_REPEATS,
    SizeRecord,
    client_scaling,
    default_sizes,
    scaling_measures,
)


def record(questions: int, group_size: int, local_seconds: float, memory_mb: float = 10.0) -> SizeRecord:
    trajectories = questions * group_size
    return SizeRecord(questions, group_size, trajectories, sampling_requests=2 * trajectories,
                      assistant_turns=3 * trajectories, main_seconds=local_seconds / 2,
                      client_seconds=local_seconds / 2, twin_seconds=1.0, memory_mb=memory_mb, wall_seconds=1.0)


@pytest.mark.slow  # two twins and nine rollouts
def test_the_quick_scaling_rows_measure_each_size_and_hold_the_growth_to_its_target(tokenizer):
    measures, details = client_scaling(tokenizer, quick=True)
    rows = {m.key: m for m in measures}
    assert [size["trajectories"] for size in details] == [q * g for q, g in QUICK_SIZES] == [16, 64]
    assert [len(size["rollouts"]) for size in details] == [SMALLEST_REPEATS, 1]
    for size in details:
        for rollout in size["rollouts"]:
            assert rollout["trajectories"] == size["trajectories"]
            assert rollout["sampling_requests"] >= size["questions"]  # one first request per group, at least
            assert rollout["assistant_turns"] >= rollout["trajectories"]
            assert rollout["main_seconds"] > 0 and rollout["client_seconds"] > 0 and rollout["wall_seconds"] > 0
        per_trajectory = [r["ms_per_trajectory"] for r in size["rollouts"]]
        row = rows[f"scaling_cpu_ms_per_trajectory_{size['trajectories']}"]
        assert row.value == pytest.approx(statistics.median(per_trajectory)) and row.value > 0
    growth = rows["scaling_cpu_per_trajectory_growth"]
    assert GROWTH_TARGET == 1.25
    assert (growth.target, growth.comparator, growth.target_source) == (1.25, "<=", "issue")
    small = [r["ms_per_trajectory"] for r in details[0]["rollouts"]]
    large = details[1]["rollouts"][0]["ms_per_trajectory"]
    assert growth.value == pytest.approx(statistics.median(large / s for s in small))
    memory = rows["scaling_memory_mb"]
    largest = details[1]["rollouts"][0]
    assert memory.value == pytest.approx(largest["memory_mb"]) and memory.value >= 0
    if largest["memory_source"].startswith("VmHWM"):  # a peak reset just before: the rollout's own growth
        assert memory.value > 0
    assert rows["scaling_memory_mb_per_1000_trajectories"].value == pytest.approx(1000 * memory.value / 64)


def test_a_per_trajectory_cost_that_grows_with_the_batch_misses_the_target():
    flat = scaling_measures([[record(8, 8, 1.0)] * 3, [record(512, 8, 64.0 * 1.2)]])
    grows = scaling_measures([[record(8, 8, 1.0), record(8, 8, 1.1)], [record(512, 8, 64.0 * 1.5)]])
    assert {m.key: m for m in flat}["scaling_cpu_per_trajectory_growth"].verdict == "met"
    growth = {m.key: m for m in grows}["scaling_cpu_per_trajectory_growth"]
    assert growth.verdict == "missed" and growth.samples == 2
    assert growth.low == pytest.approx(1.5 / 1.1) and growth.high == pytest.approx(1.5)


def test_the_paper_sizes_are_measured_only_when_asked():
    assert max(q * g for q, g in default_sizes(False)) == 1024
    paper = [q * g for q, g in default_sizes(False, True)]
    assert paper == [q * g for q, g in FULL_SIZES] == [64, 256, 1024, 2560, 4096]
    assert default_sizes(True) == default_sizes(True, True) == QUICK_SIZES
