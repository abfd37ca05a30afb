"""Bounded off-policy rollouts (--max-steps-off-policy K): the schedule is a function of the
step index, so every question's group is trained exactly once, never on samples more than K
steps old, and a resumed run redoes its in-flight batches on the very weights they used."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from searchr1.cli import main
from searchr1.training.off_policy import batches_in_flight, sampler_version, step_batch, versions_to_record
from searchr1.run.directory import RunDir
from twin_support import KILL_AFTER_STEP, without_timing_metrics

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
    recorded = versions_to_record(completed, max_steps, k)
    needed = {sampler_version(b, k) for b in batches_in_flight(completed, max_steps, k)}
    assert needed - {completed} <= recorded  # version `completed` is the checkpoint itself
    assert all(version < completed for version in recorded)


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
    process = subprocess.run([sys.executable, "-c", KILL_AFTER_STEP, "2", *args, str(killed)], cwd=REPO,
                             capture_output=True, text=True, timeout=300)
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
