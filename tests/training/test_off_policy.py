"""Bounded off-policy rollouts (--max-steps-off-policy K): the schedule is a function of the
step index, so every question's group is trained exactly once, never on samples more than K
steps old, and a resumed run redoes its in-flight batches on the very weights they used."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from searchr1.cli import main
from searchr1.training.config import TrainConfig
from searchr1.run.reporting import SilentReporter
from searchr1.training import pipeline as pipeline_module
from searchr1.core import trainer as trainer_module
from searchr1.training.off_policy import batches_in_flight, sampler_version, step_batch, versions_to_record
from searchr1.training.pipeline import RolloutPipeline
from searchr1.run.directory import RunDir
from twin_support import KILL_AFTER_STEP, without_timing_metrics
from warm_python import run_python

REPO = Path(__file__).resolve().parents[2]
BASE = ["train", "--offline", "--quiet", "--questions-per-batch", "4", "--group-size", "4"]


@given(k=st.integers(0, 4), max_steps=st.integers(1, 30), questions=st.integers(1, 8))
def test_each_questions_group_is_trained_at_most_once_and_never_on_samples_older_than_k(k, max_steps, questions):
    """Invariant: over a run that does not wrap the data, the batches the pipeline takes
    (``step_batch``) cover every data position exactly once, each on samples at most K steps old."""
    positions = list(range(max_steps * questions))  # the data, each example named by its position
    trained: dict[int, int] = {}
    launched: set[int] = set()
    for step in range(max_steps):
        launched.update(batches_in_flight(step, max_steps, k))
        assert step in launched  # a step only trains a batch that was rolled out
        for position in step_batch(positions, step, questions):
            assert position not in trained
            trained[position] = step
        version = sampler_version(step, k)
        assert 0 <= step - version <= k  # staleness at training time
        assert version <= step  # only weights that exist when the batch starts
        assert all(sampler_version(b, k) <= step for b in batches_in_flight(step, max_steps, k))
    assert launched == set(range(max_steps))
    assert sorted(trained) == list(range(max_steps * questions))


@given(k=st.integers(0, 4), completed=st.integers(0, 20), extra=st.integers(0, 20))
def test_a_checkpoint_records_every_older_sampler_its_in_flight_batches_use(k, completed, extra):
    max_steps = completed + extra
    recorded = versions_to_record(completed, k)
    needed = {sampler_version(b, k) for b in batches_in_flight(completed, max_steps, k)}
    assert needed - {completed} <= recorded  # version `completed` is the checkpoint itself
    assert all(version < completed for version in recorded)


class _Yields:
    """Delays as event-loop turns, drawn from a cycle of counts: every await point of the fake
    service and rollouts takes the next count, so one hypothesis example is one interleaving."""

    def __init__(self, counts: list[int]) -> None:
        self._counts = itertools.cycle(counts)

    async def wait(self) -> None:
        for _ in range(next(self._counts)):
            await asyncio.sleep(0)


class _FakeTrainingClient:
    """A training client whose weights are the tuple of steps applied so far; a sampler saved
    under a name holds the weights of the moment it was saved, and a name is saved once."""

    def __init__(self, delays: _Yields) -> None:
        self.delays = delays
        self.applied: tuple[int, ...] = ()
        self.saved: dict[str, tuple[int, ...]] = {}

    async def save_weights_for_sampler_async(self, *, name: str, ttl_seconds: int):
        await self.delays.wait()
        assert name not in self.saved, f"checkpoint {name!r} already exists"
        self.saved[name] = self.applied

        async def finished():
            await self.delays.wait()
            return SimpleNamespace(path=name)

        return finished()

    async def create_sampling_client_async(self, path: str):
        await self.delays.wait()
        return SimpleNamespace(weights=self.saved[path])

    async def save_weights_and_get_sampling_client_async(self):
        await self.delays.wait()
        return SimpleNamespace(weights=self.applied)

    async def update(self, step: int) -> None:
        await self.delays.wait()
        self.applied += (step,)


class _Notes(SilentReporter):
    def __init__(self) -> None:
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        self.notes.append(text)


def _drive_pipeline(config: TrainConfig, client: _FakeTrainingClient, turns: _Yields, skipped: set[int], *,
                    first: int = 0, sampler_paths: dict[int, str] | None = None, reporter=None) -> list:
    """Steps first..max_steps in the trainer's order of calls, with rollouts that return the
    weights their sampler holds."""

    async def fake_rollout(sampler, *args, **kwargs):
        await turns.wait()
        return [sampler.weights]

    async def drive() -> list:
        pipe = RolloutPipeline(config, training_client=client, tokenizer=None, search=None, examples=[None],
                               reporter=reporter or SilentReporter(), session=first, sampler_paths={} if sampler_paths is None else sampler_paths,
                               weights_version=first)
        batches = []
        try:
            for step in range(first, config.max_steps):
                batches.append(await pipe.batch(step))
                await pipe.before_update(step)
                if step not in skipped:  # a degenerate step yields nothing and sends no update
                    await client.update(step)
                pipe.weights_updated(step)
        finally:
            pipe.close()
        return batches

    original = pipeline_module.rollout_batch_async
    pipeline_module.rollout_batch_async = trainer_module.rollout_batch_async = fake_rollout  # on-policy: the core's
    try:
        return asyncio.run(drive())
    finally:
        pipeline_module.rollout_batch_async = trainer_module.rollout_batch_async = original


@given(k=st.integers(0, 3), max_steps=st.integers(1, 14), skipped=st.sets(st.integers(0, 13)),
       delays=st.lists(st.integers(0, 4), min_size=1, max_size=12))
def test_every_batch_samples_on_the_weights_its_step_index_names_whatever_steps_skip_and_however_long_calls_take(
        k, max_steps, skipped, delays):
    """Invariant: batch b samples on the weights after sampler_version(b, K) steps, which hold
    exactly the updates of the earlier non-skipped steps, for any pattern of skipped (degenerate)
    steps and any interleaving of saves, rollouts and updates; no sampler name is saved twice."""
    config = TrainConfig(max_steps=max_steps, data="train.jsonl", max_steps_off_policy=k)
    turns = _Yields(delays)
    batches = _drive_pipeline(config, _FakeTrainingClient(turns), turns, skipped)
    assert len(batches) == max_steps
    for index, batch in enumerate(batches):
        version = sampler_version(index, k)
        assert batch.batch_index == index and batch.sampler_version == version
        assert batch.trajectories == [tuple(s for s in range(version) if s not in skipped)]


@given(k=st.integers(1, 3), finished=st.integers(1, 8), extra=st.integers(1, 6), skipped=st.sets(st.integers(0, 13)),
       delays=st.lists(st.integers(0, 4), min_size=1, max_size=12))
def test_a_finished_off_policy_run_resumed_with_more_steps_samples_like_the_longer_run(k, finished, extra, skipped,
                                                                                      delays):
    """Invariant: resuming a finished run from its final checkpoint (with the samplers it
    records) and a larger max_steps gives every later batch the weights of sampler_version(b, K),
    as one run of the longer length does."""
    turns = _Yields(delays)
    client = _FakeTrainingClient(turns)
    short = TrainConfig(max_steps=finished, data="train.jsonl", max_steps_off_policy=k)
    paths: dict[int, str] = {}  # the run's saved samplers, as the trainer records them
    _drive_pipeline(short, client, turns, skipped, sampler_paths=paths)
    recorded = {v: paths[v] for v in versions_to_record(finished, k)}  # what the final checkpoint keeps
    longer = TrainConfig(max_steps=finished + extra, data="train.jsonl", max_steps_off_policy=k)
    batches = _drive_pipeline(longer, client, turns, skipped, first=finished, sampler_paths=recorded)
    for index, batch in enumerate(batches, start=finished):
        version = sampler_version(index, k)
        assert batch.sampler_version == version
        assert batch.trajectories == [tuple(s for s in range(version) if s not in skipped)]


def test_a_restart_with_a_larger_k_samples_the_unrecorded_batches_on_the_checkpoints_weights_and_says_so():
    turns = _Yields([1])
    client = _FakeTrainingClient(turns)
    client.applied = (0, 1, 2, 3)  # the checkpoint of step 4, saved by a run with K = 0 (no samplers recorded)
    notes = _Notes()
    config = TrainConfig(max_steps=8, data="train.jsonl", max_steps_off_policy=2)
    batches = _drive_pipeline(config, client, turns, set(), first=4, reporter=notes)
    assert [b.sampler_version for b in batches] == [4, 4, 4, 5]  # batches 4, 5 would want versions 2, 3
    assert [b.trajectories for b in batches][:3] == [[(0, 1, 2, 3)]] * 3
    assert len(notes.notes) == 1 and "batches 4..5" in notes.notes[0]


@pytest.mark.slow
def test_k_zero_is_on_policy_and_k_one_trains_one_step_old_samples(tmp_path):
    lines = {}
    for k in (0, 1):
        run_dir = tmp_path / f"k{k}"
        result = CliRunner().invoke(main, [*BASE, "--max-steps", "3", "--max-steps-off-policy", str(k),
                                           "--run-dir", str(run_dir)])
        assert result.exit_code == 0, result.output
        lines[k] = RunDir(run_dir).metrics()
    assert all("async/staleness_mean" not in line for line in lines[0])
    assert [line["async/staleness_mean"] for line in lines[1]] == [0.0, 1.0, 1.0]
    assert all(line["async/discarded_stale_trajectories"] == 0 for line in lines[1])
    # step 0 samples the base weights in both runs, so it is the same rollout
    assert lines[0][0]["reward/mean"] == lines[1][0]["reward/mean"]


comparable = without_timing_metrics


@pytest.mark.slow
def test_a_killed_off_policy_run_resumes_exactly_like_an_uninterrupted_one(tmp_path):
    args = [*BASE, "--max-steps", "5", "--save-every", "2", "--max-steps-off-policy", "1", "--run-dir"]
    killed = tmp_path / "killed"
    process = run_python(["-c", KILL_AFTER_STEP, "2", *args, str(killed)], cwd=REPO, timeout=300)
    assert process.returncode == -9, process.stderr[-2000:]
    checkpoint = RunDir(killed).checkpoints()[-1]
    assert checkpoint["step"] == 2 and set(checkpoint["sampler_paths"]) == {"1"}  # batch 2 ran on version 1
    assert CliRunner().invoke(main, [*BASE, "--resume", str(killed)]).exit_code == 0
    straight = tmp_path / "straight"
    assert CliRunner().invoke(main, [*args, str(straight)]).exit_code == 0
    resumed = [comparable(m) for m in RunDir(killed).metrics()]
    expected = [comparable(m) for m in RunDir(straight).metrics()]
    assert [m["step"] for m in resumed] == list(range(5))
    assert resumed == expected
    assert json.loads((killed / "config.json").read_text())["max_steps_off_policy"] == 1
