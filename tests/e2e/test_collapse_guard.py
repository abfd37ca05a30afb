"""The collapse guard end to end on the offline twin: the collapse@N fault, warnings, the stop
with exit code 3 and the printed restart command, ``--resume RUN --from-step K``, and the
learner's per-token logprobs the twin returns from ``forward_backward``."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from click.testing import CliRunner
from pytrio.types import AdamParams
from twin_support import MODEL, PROMPT, datum_from, running_twin, sample_once, without_timing_metrics

from searchr1.cli import main
from searchr1.core.update import learner_tokens
from searchr1.health.diagnostics import mismatch_metrics
from searchr1.run.directory import RunDir
from searchr1.twin import Strictness, TwinFaults
from searchr1.twin.collapse import is_collapsed
from searchr1.twin.config import parse_offline_fault
from searchr1.twin.toy_policy import token_logprobs

BASE = ["train", "--offline", "--quiet", "--questions-per-batch", "4", "--group-size", "4"]


def train(*args: str):
    return CliRunner().invoke(main, [*BASE, *args])


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_the_guard_stops_within_n_steps_of_a_collapse_and_its_command_restarts_from_the_last_healthy_step(tmp_path):
    run_dir = tmp_path / "run"
    result = train("--max-steps", "6", "--save-every", "1", "--offline-fault", "collapse@3", "--stop-on-collapse", "2",
                   "--run-dir", str(run_dir))
    assert result.exit_code == 3, result.output
    run = RunDir(run_dir)
    metrics = run.metrics()
    assert [m["step"] for m in metrics] == [0, 1, 2, 3, 4]  # stopped 2 steps after the collapse at 3
    assert [m["health/unhealthy"] for m in metrics] == [0, 0, 0, 1, 1]
    assert metrics[3]["reward/format"] == 0 and metrics[3]["health/entropy"] == 0
    # the collapsed replies carry no answer: the answer rate sees the collapse too
    assert metrics[3]["rollout/termination/answer"] == 0 and metrics[3]["rollout/termination/no_answer"] == 1
    assert any(w.startswith("answer_rate 0 < 0.1") for w in metrics[3]["health/warnings"])
    assert any(w.startswith("format_valid_rate 0 < 0.1") for w in metrics[3]["health/warnings"])
    warnings = [line for line in result.output.splitlines() if line.startswith("warning: step")]
    assert len(warnings) == 2 and f"searchr1 show {run_dir} --step 3" in warnings[0]
    assert run.resume_point().step == 5  # what it had is saved
    command = re.search(r"searchr1 (train --resume \S+ --from-step (\d+))", result.output)
    assert command is not None and command.group(2) == "2", result.output  # weights after step 2 sampled healthy step 2

    # the printed command, with an algorithm flag changed and the recorded fault cleared, continues from step 2
    restarted = CliRunner().invoke(main, [*command.group(1).split(), "--quiet", "--learning-rate", "0.1",
                                          "--offline-fault", "none"])
    assert restarted.exit_code == 0, restarted.output
    assert "offline_fault collapse@3 -> None" in restarted.output
    metrics = run.metrics()
    assert [m["step"] for m in metrics] == list(range(6)) and not any(m["health/unhealthy"] for m in metrics)
    assert [c["step"] for c in lines(run_dir / "checkpoints.rewound.jsonl")] == [3, 4, 5]
    assert [m["step"] for m in lines(run_dir / "metrics.rewound.jsonl")] == [2, 3, 4]
    assert {t["step"] for t in lines(run_dir / "transcripts.rewound.jsonl")} == {2, 3, 4}
    config = json.loads((run_dir / "config.json").read_text())
    assert config["learning_rate"] == 0.1 and config["offline_fault"] is None
    assert [(s["from_step"], s["changed"]) for s in config["segments"]] == [
        (2, {"learning_rate": {"from": 0.2, "to": 0.1}, "offline_fault": {"from": "collapse@3", "to": None}})]


def test_the_offline_fault_is_recorded_and_a_resume_keeps_it_and_says_so(tmp_path):
    run_dir = tmp_path / "run"
    assert train("--max-steps", "3", "--save-every", "1", "--offline-fault", "collapse@3",
                 "--run-dir", str(run_dir)).exit_code == 0
    assert json.loads((run_dir / "config.json").read_text())["offline_fault"] == "collapse@3"
    resumed = CliRunner().invoke(main, ["train", "--resume", str(run_dir), "--quiet", "--max-steps", "5"])
    assert resumed.exit_code == 0, resumed.output
    assert "offline fault collapse@3 kept" in resumed.output and "--offline-fault none clears it" in resumed.output
    metrics = RunDir(run_dir).metrics()
    assert [m["health/unhealthy"] for m in metrics] == [0, 0, 0, 1, 1]  # the fault still applies from step 3
    assert json.loads((run_dir / "config.json").read_text())["offline_fault"] == "collapse@3"


def test_a_converged_run_whose_entropy_vanishes_is_not_stopped(tmp_path):
    """The default offline run, at a learning rate that makes it converge in a few steps, becomes
    certain and right (entropy below 1e-4, reward 1): the guard lets it finish."""
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(main, ["train", "--offline", "--quiet", "--max-steps", "14", "--learning-rate", "0.6",
                                       "--stop-on-collapse", "2", "--run-dir", str(run_dir)])
    assert result.exit_code == 0, result.output
    metrics = RunDir(run_dir).metrics()
    assert len(metrics) == 14 and not any(m["health/unhealthy"] for m in metrics)
    assert min(m["health/entropy"] for m in metrics) < 1e-4  # the rule's threshold was reached


def test_without_the_flag_a_collapse_warns_every_unhealthy_step_and_the_run_continues(tmp_path):
    run_dir = tmp_path / "run"
    result = train("--max-steps", "4", "--offline-fault", "collapse@2", "--run-dir", str(run_dir))
    assert result.exit_code == 0, result.output
    metrics = RunDir(run_dir).metrics()
    assert [m["health/unhealthy"] for m in metrics] == [0, 0, 1, 1]
    assert [m["health/unhealthy_streak"] for m in metrics] == [0, 0, 1, 2]
    assert len([line for line in result.output.splitlines() if line.startswith("warning: step")]) == 2
    assert "health/warnings" not in metrics[0]


def test_a_restart_from_step_k_with_unchanged_flags_equals_the_original_run_from_k(tmp_path):
    run_dir = tmp_path / "run"
    assert train("--max-steps", "4", "--save-every", "1", "--run-dir", str(run_dir)).exit_code == 0
    original = [without_timing_metrics(m) for m in RunDir(run_dir).metrics()]
    result = train("--resume", str(run_dir), "--from-step", "2")
    assert result.exit_code == 0, result.output
    again = [without_timing_metrics(m) for m in RunDir(run_dir).metrics()]
    assert again == original
    moved = [without_timing_metrics({k: v for k, v in m.items() if k != "rewound_to_step"})
             for m in lines(run_dir / "metrics.rewound.jsonl")]
    assert moved == original[2:]  # set aside, not lost
    assert json.loads((run_dir / "config.json").read_text())["segments"][0]["changed"] == {}

    # what a restart refuses, each in one line naming the flag or the step
    refused = train("--resume", str(run_dir), "--from-step", "9")
    assert refused.exit_code == 1 and "no checkpoint of step 9" in refused.output and "1, 2, 3, 4" in refused.output
    refused = train("--resume", str(run_dir), "--from-step", "2", "--seed", "7")
    assert refused.exit_code == 2 and "--seed cannot change" in refused.output
    refused = train("--resume", str(run_dir), "--learning-rate", "0.1")
    assert refused.exit_code == 2 and "--from-step" in refused.output
    refused = train("--from-step", "2", "--run-dir", str(tmp_path / "other"))
    assert refused.exit_code == 2 and "--from-step needs --resume" in refused.output

    # the guard's flags may change on any resume, recorded as a segment from the resume step
    assert train("--resume", str(run_dir), "--max-steps", "5", "--stop-on-collapse", "3").exit_code == 0
    config = json.loads((run_dir / "config.json").read_text())
    assert config["stop_on_collapse"] == 3
    assert config["segments"][-1]["from_step"] == 4
    assert config["segments"][-1]["changed"] == {"stop_on_collapse": {"from": 0, "to": 3}}


def test_offline_fault_flags_are_checked_before_anything_runs(tmp_path):
    assert parse_offline_fault("collapse@3") == {"collapse_from": 3}
    for bad in ("collapse", "collapse@x", "melt@3"):
        with pytest.raises(ValueError, match="--offline-fault"):
            parse_offline_fault(bad)
    with pytest.raises(ValueError, match="collapse_from"):
        TwinFaults(collapse_from=-1)
    assert not is_collapsed(None, 9) and not is_collapsed(3, 2) and is_collapsed(3, 3)
    result = CliRunner().invoke(main, ["twin", "serve", "--home", str(tmp_path), "--offline-fault", "melt@3"])
    assert result.exit_code == 2 and "--offline-fault" in result.output
    result = train("--offline-fault", "collapse@x", "--run-dir", str(tmp_path / "r"))
    assert result.exit_code == 2 and not (tmp_path / "r").exists()
    result = train("--health-rule", "entropy=high", "--run-dir", str(tmp_path / "r"))
    assert result.exit_code == 2 and "--health-rule 'entropy=high'" in result.output and not (tmp_path / "r").exists()


def test_the_twin_returns_the_learners_per_token_logprobs_and_the_mismatch_follows_from_them(tmp_path, tokenizer):
    """forward_backward's loss_fn_outputs[i]["logprobs"] hold, per input position, the logprob of
    the target under the weights being trained: after one update they differ from the
    sampler's, and the mismatch metrics are computed from exactly those numbers."""

    with running_twin(tmp_path, tokenizer, strictness=Strictness(max_staleness=1)) as (twin, service):
        trainer = service.create_lora_training_client(MODEL, rank=8)
        sampler = trainer.save_weights_and_get_sampling_client()
        prompt = tokenizer.encode(PROMPT)
        sequence = sample_once(sampler, prompt, max_tokens=6).sequences[0]
        datum = datum_from(prompt, list(sequence.tokens), list(sequence.logprobs), advantage=1.0)
        trainer.forward_backward([datum], loss_fn="importance_sampling").result()
        trainer.optim_step(AdamParams(learning_rate=0.05)).result()
        result = trainer.forward_backward([datum], loss_fn="importance_sampling").result()
        run = twin.training_run(trainer.training_run_cuid)
        tokens = prompt + list(sequence.tokens)
        expected = token_logprobs(twin.policy.weights(run.params), len(tokenizer), np.array(tokens[:-1]),
                                  np.array(tokens[1:]))
    learned = np.asarray(result.loss_fn_outputs[0]["logprobs"].data)
    assert learned.shape == (len(tokens) - 1,)
    assert learned[len(prompt) - 1:] == pytest.approx(expected[len(prompt) - 1:], abs=1e-5)
    sampled = np.asarray(sequence.logprobs)
    assert not np.allclose(learned[len(prompt) - 1:], sampled, atol=1e-4)  # the update moved them
    metrics = mismatch_metrics(learner_tokens([datum], result.loss_fn_outputs))
    log_ratio = learned[len(prompt) - 1:].astype(np.float64) - sampled.astype(np.float32).astype(np.float64)
    assert metrics["health/mismatch_k1"] == pytest.approx(float(np.mean(-log_ratio)))
    assert metrics["health/mismatch_k3"] == pytest.approx(float(np.mean(np.exp(log_ratio) - 1 - log_ratio)))
    assert metrics["health/ratio_max_deviation"] == pytest.approx(float(np.max(np.abs(np.exp(log_ratio) - 1))))


def test_a_non_finite_loss_stops_the_run_before_optim_step_and_the_run_resumes(tmp_path, monkeypatch):
    import searchr1.core.update as update_module

    real, calls = update_module.non_finite_outputs, []

    def nan_in_step_one(metrics, learned):
        calls.append(len(calls))
        return "forward_backward call 1 returned loss_sum = nan" if len(calls) == 2 else real(metrics, learned)

    monkeypatch.setattr(update_module, "non_finite_outputs", nan_in_step_one)
    run_dir = tmp_path / "run"
    result = train("--max-steps", "3", "--save-every", "1", "--run-dir", str(run_dir))
    assert result.exit_code == 1, result.output
    assert "stopped in step 1: a non-finite value: forward_backward call 1 returned loss_sum = nan" in result.output
    assert "optim_step was not called" in result.output and f"train --resume {run_dir}" in result.output
    run = RunDir(run_dir)
    assert [m["step"] for m in run.metrics()] == [0] and run.resume_point().step == 1
    monkeypatch.setattr(update_module, "non_finite_outputs", real)
    assert train("--resume", str(run_dir)).exit_code == 0
    assert [m["step"] for m in run.metrics()] == [0, 1, 2]


def test_stale_samples_of_an_off_policy_run_show_as_mismatch(tmp_path):
    run_dir = tmp_path / "run"
    assert train("--max-steps", "3", "--max-steps-off-policy", "1", "--run-dir", str(run_dir)).exit_code == 0
    metrics = RunDir(run_dir).metrics()
    # step 0 trains on samples of its own weights; steps 1-2 on samples one update old
    assert metrics[0]["health/mismatch_k3"] == 0 and metrics[0]["health/ratio_max_deviation"] == 0
    assert all(m["health/mismatch_k3"] > 0 and m["health/ratio_max_deviation"] > 0 for m in metrics[1:])


def test_a_collapsed_twin_sampler_repeats_one_turn_without_an_answer_from_the_nth_update(tmp_path, tokenizer):
    from searchr1.core.reward import extract_answer
    from searchr1.twin.collapse import COLLAPSED_TEXT

    with running_twin(tmp_path, tokenizer, faults=TwinFaults(collapse_from=1)) as (_, service):
        trainer = service.create_lora_training_client(MODEL, rank=8)
        prompt = tokenizer.encode(PROMPT)
        healthy = sample_once(trainer.save_weights_and_get_sampling_client(), prompt, max_tokens=40).sequences[0]
        sampled = sample_once(trainer.save_weights_and_get_sampling_client(), prompt, max_tokens=40)
        datum = datum_from(prompt, list(sampled.sequences[0].tokens), list(sampled.sequences[0].logprobs))
        trainer.forward_backward([datum], loss_fn="importance_sampling").result()
        trainer.optim_step(AdamParams(learning_rate=0.05)).result()  # weights version 1
        collapsed = sample_once(trainer.save_weights_and_get_sampling_client(), prompt, max_tokens=40,
                                num_samples=2).sequences
    assert tokenizer.decode(healthy.tokens, skip_special_tokens=True) != COLLAPSED_TEXT.strip()
    for sequence in collapsed:
        assert sequence.text == COLLAPSED_TEXT.strip() and extract_answer(sequence.text) is None
        assert sequence.stop_reason == "stop" and set(sequence.logprobs) == {0.0}
    assert "--offline-fault" in CliRunner().invoke(main, ["twin", "serve", "--help"]).output
