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
