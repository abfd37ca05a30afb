"""Properties of the partial-rollout schedule (searchr1.training.off_policy): which version samples
each turn, which step trains each group, and what a resume must redo and record."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from searchr1.training.off_policy import (
    batches_to_redo,
    partial_metrics,
    partial_versions_to_record,
    sampler_version,
    training_step,
    turn_cap,
    turn_version,
    versions_to_record,
)

SCHEDULES = st.tuples(st.integers(1, 4), st.integers(1, 5), st.integers(0, 6)).map(
    lambda kts: (kts[0], kts[1], kts[0] + kts[2]))  # K >= 1, T >= 1, S >= K


def group_schedule(batch: int, turns: int, k: int, t: int) -> tuple[list[int], int]:
    """The versions of a trajectory's ``turns`` turns and the step that trains its group."""
    return [turn_version(batch, j, k, t) for j in range(turns)], training_step(batch, turns - 1, t)


@given(SCHEDULES, st.integers(0, 40), st.integers(1, 60))
def test_no_turn_samples_on_weights_newer_than_k_before_the_step_that_trains_it(schedule, batch, turns):
    k, t, _ = schedule
    versions, step = group_schedule(batch, turns, k, t)
    assert step >= batch  # never trained before its own step
    assert all(v <= max(0, step - k) for v in versions)
    assert versions == sorted(versions) and versions[0] == sampler_version(batch, k)


@given(SCHEDULES, st.integers(0, 40), st.integers(1, 60))
def test_within_the_cap_the_oldest_turn_lags_the_training_step_by_at_most_the_bound(schedule, batch, turns):
    k, t, s = schedule
    turns = min(turns, turn_cap(k, t, s))
    versions, step = group_schedule(batch, turns, k, t)
    assert 0 <= step - min(versions) <= s
    # and the cap is the most turns the bound allows: one more turn would pass it, or move no version
    over, over_step = group_schedule(batch, turn_cap(k, t, s) + 1, k, t)
    assert over_step - min(over) > s or batch < k


@given(SCHEDULES, st.integers(0, 40), st.integers(1, 60))
def test_a_quantum_longer_than_every_trajectory_is_the_bounded_overlap_exactly(schedule, batch, turns):
    k, _, _ = schedule
    versions, step = group_schedule(batch, turns, k, turns)  # T >= turns
    assert versions == [sampler_version(batch, k)] * turns and step == batch


@given(SCHEDULES, st.integers(0, 40), st.integers(0, 60))
def test_a_step_never_waits_for_a_version_training_has_not_published(schedule, batch, waiting):
    """Step s waits for a group of batch b <= s only until it asks for a turn of a later step's
    quantum: that turn's version is at most s, published before step s started."""
    k, t, _ = schedule
    step = batch + waiting
    first_later_turn = (step - batch + 1) * t  # the first turn whose group is trained after ``step``
    assert training_step(batch, first_later_turn, t) == step + 1
    assert training_step(batch, first_later_turn - 1, t) == step
    assert turn_version(batch, first_later_turn, k, t) <= step


@given(SCHEDULES, st.integers(0, 30), st.integers(0, 30), st.integers(1, 60))
def test_a_resume_redoes_every_batch_and_records_every_sampler_a_later_step_needs(schedule, completed, batch, turns):
    k, t, s = schedule
    turns = min(turns, turn_cap(k, t, s))
    versions, step = group_schedule(batch, turns, k, t)
    if batch < completed <= step:  # launched before the checkpoint, trained after it
        assert batch in batches_to_redo(completed, k, s)
        assert {v for v in versions if v < completed} <= partial_versions_to_record(completed, s)
    assert not set(batches_to_redo(completed, k, s)) & set(range(completed, completed + 100))


@given(st.integers(0, 30), st.integers(1, 4))
def test_with_the_bound_at_k_the_recorded_samplers_are_the_bounded_schedules(completed, k):
    assert partial_versions_to_record(completed, k) >= versions_to_record(completed, k)
    assert list(batches_to_redo(completed, k, k)) == []


def test_the_metrics_histogram_the_oldest_turns_and_count_the_versions():
    metrics = partial_metrics(5, [[3, 4], [4], [5], []], carried=1, cut=2, in_flight=3, max_version_lag=3)
    assert [metrics[f"async/oldest_turn_lag/{age}"] for age in range(4)] == [1 / 3, 1 / 3, 1 / 3, 0.0]
    assert metrics["async/staleness_mean"] == 1.0
    assert metrics["async/versions_per_trajectory"] == 4 / 3
    counted = (metrics["async/groups_carried"], metrics["async/cut_by_lag"], metrics["async/batches_in_flight"])
    assert counted == (1, 2, 3)


def test_a_turn_of_a_dropped_group_ends_as_cancelled_not_with_an_error():
    """A stop or the end of the run drops every group while some trajectories are still between
    turns: the next turn's sampler ends that trajectory as cancelled (quietly), never a KeyError
    in an unawaited task."""
    import asyncio
    from types import SimpleNamespace

    import pytest

    from searchr1.core.rollout import RolloutConfig
    from searchr1.core.types import SearchExample, Trajectory
    from searchr1.run.usage import Usage
    from searchr1.training.partial import PartialRollouts

    config = SimpleNamespace(max_steps_off_policy=1, turns_per_version=2, max_version_lag=3, rollout=RolloutConfig())
    partial = PartialRollouts(SimpleNamespace(config=config))  # type: ignore[arg-type]  # what it reads
    trajectory = Trajectory(SearchExample("q", "?", ("a",), "nq"), 6, 0, messages=[])
    sampler_of = partial._turn_sampler(27, Usage())
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(sampler_of(trajectory, 3))
