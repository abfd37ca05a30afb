"""Bounded off-policy rollouts: which weights sample which step's batch.

With ``--max-steps-off-policy K`` the batch that step ``b`` trains on is rolled out on the
sampler of the weights after ``b - K`` finished steps (the base weights for ``b < K``). So
while step ``b`` trains, the batches of steps ``b + 1 .. b + K`` are already being sampled,
and the service is never idle waiting for the trainer (or the trainer for the slowest
trajectory of one batch). ``K = 0`` is the on-policy loop: each step samples on the weights it
trains.

The schedule is a function of the step index only, never of timing: which questions, which
seeds and which weights a step's batch uses are the same in every run with the same seed, and
a resumed run can redo its in-flight batches exactly (the trainer records the samplers'
weights). The importance-sampling loss keeps the sampler's own logprobs, so the ratio
``exp(logp_now - logp_sampler)`` corrects for the K steps of staleness.
"""

from __future__ import annotations

from collections.abc import Sequence

from searchr1.core.types import SearchExample
from searchr1.data.dataset import take_batch


def step_batch(examples: Sequence[SearchExample], batch_index: int, questions_per_batch: int) -> list[SearchExample]:
    """The questions that step ``batch_index`` trains on: the ``batch_index``-th run of
    ``questions_per_batch`` examples from the data's start (wrapping at its end), whenever its
    rollout runs."""
    return take_batch(examples, batch_index * questions_per_batch, questions_per_batch)


def sampler_version(batch_index: int, max_steps_off_policy: int) -> int:
    """Finished steps of the weights that sample step ``batch_index``'s batch."""
    if batch_index < 0 or max_steps_off_policy < 0:
        raise ValueError(f"batch_index and max_steps_off_policy must be >= 0, got {batch_index}, "
                         f"{max_steps_off_policy}")
    return max(0, batch_index - max_steps_off_policy)


def batches_in_flight(step: int, max_steps: int, max_steps_off_policy: int) -> range:
    """The batches that may be rolling out while step ``step`` waits for its own."""
    return range(step, min(step + max_steps_off_policy + 1, max_steps))


def versions_to_record(completed: int, max_steps_off_policy: int) -> set[int]:
    """Weights versions that the batches still to be trained after ``completed`` steps were
    sampled on and that a resumed run cannot rebuild from its checkpoint (which holds version
    ``completed`` only): the trainer records these samplers' paths with the checkpoint. The
    next K batches count even past the run's ``max_steps``, so a finished run resumed with a larger
    --max-steps samples them exactly as a longer run would have."""
    pending = range(completed, completed + max_steps_off_policy)
    return {sampler_version(batch, max_steps_off_policy) for batch in pending} - {completed}


def off_policy_metrics(staleness: int, max_steps_off_policy: int, trajectories: int, *, discarded: int,
                       in_flight: int) -> dict[str, float]:
    """One metrics line's view of the pipeline: how old the trained samples were (a histogram
    over 0..K, one batch shares one sampler), how many were discarded as too old, and how many
    later batches were rolling out when this step trained."""
    metrics = {f"async/staleness/{age}": float(age == staleness and trajectories > 0)
               for age in range(max_steps_off_policy + 1)}
    metrics["async/staleness_mean"] = float(staleness)
    metrics["async/discarded_stale_trajectories"] = float(discarded)
    metrics["async/batches_in_flight"] = float(in_flight)
    return metrics


# -- partial rollouts -----------------------------------------------------------------------------
#
# With --partial-rollouts (K >= 1, turn quantum T, staleness bound S >= K) turn j of a trajectory of
# batch b samples on version ``max(0, b - K + j // T)``: every T turns it moves on to the next
# sampler, waiting for it if training has not published it yet. Its group is trained by step
# ``b + d``, d the most quanta any of its trajectories moved on (``j // T`` of the last turn it
# asked for), so a group within its first T turns is trained by its own step as in the bounded
# schedule. Which versions a turn uses and which step trains a group are functions of indices and
# of the group's own turn counts (a logical clock), never of timing.


def turn_version(batch_index: int, turn: int, max_steps_off_policy: int, turns_per_version: int) -> int:
    """Finished steps of the weights that sample turn ``turn`` (0-based) of a trajectory of batch
    ``batch_index``."""
    return max(0, batch_index - max_steps_off_policy + turn // turns_per_version)


def training_step(batch_index: int, last_turn: int, turns_per_version: int) -> int:
    """The step that trains a group of batch ``batch_index`` whose trajectories asked for turns up
    to ``last_turn`` (0-based): one step later for every quantum of T turns beyond the first."""
    return batch_index + last_turn // turns_per_version


def turn_cap(max_steps_off_policy: int, turns_per_version: int, max_version_lag: int) -> int:
    """The most turns a trajectory may take so that its oldest turn lags the step that trains it by
    at most ``max_version_lag`` versions: versions ``v0 .. v0 + S - K``, T turns each."""
    return (max_version_lag - max_steps_off_policy + 1) * turns_per_version


def batches_to_redo(completed: int, max_steps_off_policy: int, max_version_lag: int) -> range:
    """Batches before ``completed`` that may hold a group trained at step ``completed`` or later
    (a resume rolls them out again and trains only those groups)."""
    return range(max(0, completed - (max_version_lag - max_steps_off_policy)), completed)


def partial_versions_to_record(completed: int, max_version_lag: int) -> set[int]:
    """:func:`versions_to_record` for partial rollouts: every version from ``completed - S`` on may
    have sampled a turn of a group still to be trained."""
    return set(range(max(0, completed - max_version_lag), completed))


def partial_metrics(step: int, versions: list[list[int]], *, carried: int, cut: int, in_flight: int,
                    max_version_lag: int) -> dict[str, float]:
    """One metrics line's view of partial rollouts: ``versions`` holds each trained trajectory's
    turn versions. The share of trajectories whose oldest turn lags the step by each of 0..S
    versions, their mean, the distinct versions per trajectory, the groups carried over from
    earlier batches and the trajectories the bound cut."""
    lags = [step - min(turns) for turns in versions if turns]
    metrics = {f"async/oldest_turn_lag/{lag}": (lags.count(lag) / len(lags) if lags else 0.0)
               for lag in range(max_version_lag + 1)}
    metrics["async/staleness_mean"] = sum(lags) / len(lags) if lags else 0.0
    metrics["async/versions_per_trajectory"] = (sum(len(set(turns)) for turns in versions if turns) / len(lags)
                                                if lags else 0.0)
    metrics["async/groups_carried"] = float(carried)
    metrics["async/cut_by_lag"] = float(cut)
    metrics["async/batches_in_flight"] = float(in_flight)
    return metrics
