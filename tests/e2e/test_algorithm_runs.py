"""`train --offline` with the algorithm options, end to end through the real pytrio client
against the twin: each option still learns (small settings: 10 steps of 4 questions x 4
samples at Adam lr 0.4, where the defaults gain about 0.48), the option is in effect, and a
dynamic-sampling run resumes exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from twin_support import without_timing_metrics

from searchr1.cli import main
from searchr1.run.directory import RunDir

SMALL = ["--max-steps", "10", "--questions-per-batch", "4", "--group-size", "4", "--learning-rate", "0.4"]


def train(*args: str) -> str:
    result = CliRunner().invoke(main, ["train", "--offline", "--quiet", *args])
    assert result.exit_code == 0, result.output
    return result.output


# Every option is in one learning run; options that act on different parts of the step share a run.
@pytest.mark.parametrize("options", [
    ["--loss-fn", "ppo", "--advantage", "rloo"],
    ["--loss-fn", "cispo", "--reward", "f1"],
    ["--loss-fn", "dro", "--kl-coef", "0.05"],
    ["--dynamic-sampling"],
], ids=["ppo+rloo", "cispo+f1", "dro+kl", "dynamic-sampling"])
def test_train_offline_still_learns_with_each_algorithm_option(tmp_path, options):
    run_dir = tmp_path / "run"
    train("--run-dir", str(run_dir), *SMALL, *options)
    lines = RunDir(run_dir).metrics()
    rewards = [line["reward/mean"] for line in lines]
    assert np.mean(rewards[-5:]) - np.mean(rewards[:5]) >= 0.3
    config = json.loads((run_dir / "config.json").read_text())
    for flag, value in zip(options[::2], options[1::2]):
        if flag != "--dynamic-sampling":
            key = {"--advantage": "advantage_mode"}.get(flag, flag[2:].replace("-", "_"))
            assert str(config[key]) == value
    if "--kl-coef" in options:
        # the first step samples on the base weights, whose prompt logprobs the twin serves exactly
        assert lines[0]["kl/policy_base"] == 0.0 and lines[0]["kl/base_requests"] > 0
        later = [line["kl/policy_base"] for line in lines[3:] if "kl/policy_base" in line]  # steps with datums
        assert later and all(value > 0.0 for value in later)  # k3, once the weights moved
    if "--dynamic-sampling" in options:
        assert config["dynamic_sampling"] is True
        assert all(line["dynamic/questions_drawn"] >= 4 for line in lines)
        assert all(line["dynamic/groups_kept"] <= 4 for line in lines)
        assert any(line["dynamic/draws"] > 1 for line in lines)  # late steps had to draw again


def test_a_dynamic_sampling_run_resumes_exactly_where_it_stopped(tmp_path):
    """The scripted scenario has deliberately degenerate questions, so steps draw more than one
    batch and the data cursor runs ahead of step x questions-per-batch."""
    options = ["--offline-policy", "scripted", "--dynamic-sampling", "--questions-per-batch", "6",
               "--max-oversample-batches", "1"]
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    train("--run-dir", str(straight), "--max-steps", "3", *options)
    train("--run-dir", str(stopped), "--max-steps", "1", *options)
    cursor = RunDir(stopped).resume_point().cursor
    train("--resume", str(stopped), "--max-steps", "3")
    def comparable(line):  # the stopped run also saved a final checkpoint after step 0, which its usage counts
        return {k: v for k, v in without_timing_metrics(line).items() if not k.endswith(("weight_saves", "state_saves"))}

    lines = [comparable(line) for line in RunDir(straight).metrics()]
    assert [comparable(line) for line in RunDir(stopped).metrics()] == lines
    assert cursor == 6 * lines[0]["dynamic/draws"] and cursor > 6


@pytest.mark.parametrize("loss", ["importance_sampling", "ppo", "cispo", "dro"])
def test_with_substeps_every_loss_trains_later_mini_batches_on_moved_weights(tmp_path, loss):
    """The twin computes each loss on mini-batches whose ratio has left 1: the first mini-batch
    of a step trains on its sampler's weights, the later ones on weights the earlier moved."""
    run_dir = tmp_path / "run"
    train("--run-dir", str(run_dir), "--max-steps", "3", "--questions-per-batch", "4", "--group-size", "4",
          "--learning-rate", "0.5", "--loss-fn", loss, "--num-substeps", "3")
    lines = [line for line in RunDir(run_dir).metrics() if not line["train/update_skipped"]]
    assert lines and all(line["train/optimizer_steps"] == 3 for line in lines)
    assert all(line["train/forward_backward_calls"] == 3 for line in lines)
    assert all(line["health/ratio_max_deviation"] > 1e-3 for line in lines)
    if loss in ("ppo", "cispo"):
        assert all(line["health/clipped_fraction/substep_0"] == 0.0 for line in lines)  # ratio 1: nothing clips
        assert any(line["health/clipped_fraction/substep_2"] > 0.0 for line in lines)
    assert json.loads((run_dir / "config.json").read_text())["num_substeps"] == 3


def test_substeps_come_from_a_preset_and_a_resumed_run_repeats_them_exactly(tmp_path):
    preset = tmp_path / "preset.toml"
    preset.write_text("num_substeps = 2\nloss_fn = \"ppo\"\n")
    args = ["--config", str(preset), "--questions-per-batch", "4", "--group-size", "4", "--save-every", "2"]
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    train("--run-dir", str(straight), "--max-steps", "4", *args)
    train("--run-dir", str(stopped), "--max-steps", "2", *args)
    train("--resume", str(stopped), "--max-steps", "4")
    assert json.loads((stopped / "config.json").read_text())["num_substeps"] == 2
    resumed = [without_timing_metrics(m) for m in RunDir(stopped).metrics()]
    expected = [without_timing_metrics(m) for m in RunDir(straight).metrics()]
    assert [m["step"] for m in resumed] == [0, 1, 2, 3] and resumed == expected
    assert all(m["train/optimizer_steps"] == 2 for m in expected if not m["train/update_skipped"])


@pytest.mark.parametrize("correction", ["tis", "mis", "decoupled"])
def test_each_off_policy_correction_runs_on_a_mismatched_sampler_and_resumes_exactly(tmp_path, correction):
    """With the twin's mismatch fault each correction makes one forward call a step, acts on the
    tokens its bounds name (tight bounds, so it does), and a run stopped after step 0 and resumed
    writes the lines of the uninterrupted run."""
    options = ["--questions-per-batch", "4", "--group-size", "4", "--correction", correction,
               "--offline-fault", "mismatch@0.5", "--tis-cap", "1.05", "--mis-low", "0.95", "--mis-high", "1.05"]
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    train("--run-dir", str(straight), "--max-steps", "3", *options)
    train("--run-dir", str(stopped), "--max-steps", "1", *options)
    train("--resume", str(stopped), "--max-steps", "3")

    def comparable(line):  # the stopped run also saved a final checkpoint after step 0, which its usage counts
        return {k: v for k, v in without_timing_metrics(line).items() if not k.endswith(("weight_saves", "state_saves"))}

    lines = [comparable(line) for line in RunDir(straight).metrics()]
    assert [comparable(line) for line in RunDir(stopped).metrics()] == lines
    config = json.loads((straight / "config.json").read_text())
    assert config["correction"] == correction and config["offline_fault"] == "mismatch@0.5"
    trained = [line for line in lines if line["train/update_skipped"] == 0.0]
    assert trained and all(line["usage/forward_calls"] == 1.0 and line["correction/mismatch_k3"] > 0 for line in trained)
    share = "correction/masked_share" if correction == "mis" else "correction/capped_share"
    assert any(line[share] > 0 for line in trained)
    assert lines[-1]["usage/total_forward_calls"] == len(trained)


def test_a_correction_flag_out_of_its_bounds_and_the_mismatch_fault_without_the_learning_policy_are_refused(tmp_path):
    for args, flag in ((["--correction", "clip"], "--correction"), (["--tis-cap", "0.5"], "--tis-cap"),
                       (["--mis-low", "0"], "--mis-low"), (["--offline-fault", "mismatch@0"], "--offline-fault"),
                       (["--offline-policy", "scripted", "--offline-fault", "mismatch@0.5"], "--offline-fault")):
        result = CliRunner().invoke(main, ["train", "--offline", "--quiet", "--run-dir", str(tmp_path / "r"), *args])
        assert result.exit_code == 2, result.output
        assert flag in result.output and "Traceback" not in result.output
        assert not (tmp_path / "r").exists()
