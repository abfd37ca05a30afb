"""Figure 13 (a paper-sized step's search) and figure 8's vocabulary rows, at a tiny size."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from searchr1.bench.paper_step import (
    learned_searches_per_trajectory,
    modelled_sampling_seconds,
    searches_per_trajectory_drawn,
    worker_counts,
)
from searchr1.cli import main


@given(st.floats(min_value=0.0, max_value=6.0), st.integers(min_value=0, max_value=2 ** 32))
def test_drawn_searches_are_whole_and_average_the_mean(mean: float, seed: int) -> None:
    drawn = searches_per_trajectory_drawn(4_000, mean, seed)
    assert set(drawn.tolist()) <= {math.floor(mean), math.floor(mean) + 1}
    assert drawn.mean() == pytest.approx(mean, abs=0.05)


def test_the_modelled_service_time_bounds_both_ways_and_grows_with_searches() -> None:
    fewer = modelled_sampling_seconds(64, 5, np.full(320, 1), seed=0, sampling_concurrency=64)
    more = modelled_sampling_seconds(64, 5, np.full(320, 3), seed=0, sampling_concurrency=64)
    for step in (fewer, more):
        assert step["seconds"] >= step["longest_trajectory"] > 0
        assert step["seconds"] >= step["sampling_total"] / 64
    assert more["sampling_total"] > fewer["sampling_total"]
    narrow = modelled_sampling_seconds(64, 5, np.full(320, 1), seed=0, sampling_concurrency=4)
    assert narrow["seconds"] == pytest.approx(narrow["sampling_total"] / 4)


def test_a_learnt_policy_searches_between_one_and_three_times() -> None:
    assert 1.0 <= learned_searches_per_trajectory() <= 3.0


def test_worker_counts_include_one_two_and_the_cpus() -> None:
    import os

    counts = worker_counts()
    assert counts[0] == 1 and 2 in counts and (os.cpu_count() or 1) in counts and counts == sorted(set(counts))


@pytest.mark.slow  # builds a 2,000-passage index and starts retriever serve three or four times
def test_figures_8_and_13_share_the_index_and_report_their_rows(tmp_path) -> None:
    output = tmp_path / "bench.json"
    result = CliRunner().invoke(main, ["bench", "--quick", "--only", "8,13", "--passages", "2000",
                                       "--output", str(output)])
    assert result.exit_code == 0, result.output
    figures = json.loads(output.read_text())["figures"]
    local = figures["local_search"]["measures"]
    assert local["vocabulary"]["value"] > 10_000
    assert local["vocabulary_over_law"]["value"] == pytest.approx(1.0, abs=0.05)
    step = figures["paper_step_search"]
    assert step["figure"] == 13 and step["target"] == 0.1 and step["comparator"] == "<="
    details = step["details"]
    assert details["trajectories"] == 16 * 5 and details["queries"] > 0
    for workers in worker_counts():
        assert details["served"][str(workers)]["requests"] == details["queries"]
        assert step["measures"][f"qps_{workers}w"]["value"] > 0
        # the server's processes answered every query, and the clients sent them: both spent CPU on it
        assert step["measures"][f"server_cpu_ms_{workers}w"]["value"] > 0
        assert step["measures"][f"client_cpu_ms_{workers}w"]["value"] > 0
    if details["lucene"] is not None:  # Lucene set up (figure 9): ours served and in process, each against it
        assert details["in_process_seconds"] > 0
        assert step["measures"]["in_process_over_lucene"]["value"] == pytest.approx(
            details["in_process_seconds"] / details["lucene"]["seconds"], rel=1e-6)
    most = max(worker_counts())
    expected = details["served"][str(most)]["seconds"] / details["service"]["seconds"]
    assert step["value"] == pytest.approx(expected, rel=1e-6)
