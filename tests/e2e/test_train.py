"""The training loop end to end on the offline twin: a few steps, metrics and checkpoints on
disk, crash and resume, and the flags that must be refused."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from searchr1.cli import main
from searchr1.run.directory import RunDir
from searchr1.evaluation.transcripts import read_run_transcripts
from twin_support import KILL_AFTER_STEP, without_timing_metrics
from warm_python import run_python

REPO = Path(__file__).resolve().parents[2]
BASE = ["train", "--offline", "--quiet", "--questions-per-batch", "4", "--group-size", "4"]


def train(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, [*BASE, *args])
    return result.exit_code, result.output + (str(result.exception) if result.exception and result.exit_code not in (0, 1, 2) else "")


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


comparable = without_timing_metrics


def test_offline_training_writes_a_line_per_step_and_checkpoints(tmp_path):
    run_dir = tmp_path / "run"
    code, output = train("--max-steps", "3", "--save-every", "2", "--run-dir", str(run_dir))
    assert code == 0, output
    run = RunDir(run_dir)
    metrics = run.metrics()
    assert [m["step"] for m in metrics] == [0, 1, 2]
    for line in metrics:
        assert {"reward/mean", "reward/correct", "reward/format", "rollout/degenerate_group_rate",
                "train/tokens_sent", "time/step_seconds", "search/success_rate"} <= set(line)
        assert line["rollout/trajectories"] == 16
    config = json.loads((run_dir / "config.json").read_text())
    prefix = f"search-r1-qwen35-4b-{config['run_id']}-"
    assert [(c["name"], c["final"]) for c in run.checkpoints()] == [
        (prefix + "step-000002", False), (prefix + "step-000003", True)]
    assert run.state()["step"] == 3 and run.state()["cursor"] == 12
    assert config["offline"] is True and config["rollout"]["group_size"] == 4
    assert not any("judge" in key for line in metrics for key in line)  # no judge, no judge keys
    assert not (run_dir / ".lock").exists()  # removed as train exits; the flock was the lock


def test_the_final_save_does_not_duplicate_the_last_periodic_one(tmp_path):
    run_dir = tmp_path / "run"
    code, output = train("--max-steps", "2", "--save-every", "2", "--run-dir", str(run_dir))
    assert code == 0, output
    assert [c["step"] for c in RunDir(run_dir).checkpoints()] == [2]


@pytest.mark.parametrize("substeps", [1, 3])
def test_both_accumulation_modes_train_and_record_the_calls_they_sent(tmp_path, substeps):
    """The micro-batches a step records are the forward_backward calls it sent, substeps included."""
    for mode in ("sdk", "manual"):
        run_dir = tmp_path / mode
        code, output = train("--max-steps", "1", "--accumulation", mode, "--num-substeps", str(substeps),
                             "--run-dir", str(run_dir))
        assert code == 0, output
        assert ", 1 step)" in output and "done: 1 step. metrics" in output  # not "1 steps"
        line = RunDir(run_dir).metrics()[0]
        expected_calls = substeps if mode == "sdk" else line["train/micro_batches_per_step"]
        assert line["train/forward_backward_calls"] == expected_calls
        if mode == "manual":
            assert line["train/micro_batches_per_step"] >= substeps


JUDGED = ["--judge", "twin", "--judge-weight", "0.5", "--judge-cache", "off"]


@pytest.mark.parametrize("credit", [[], ["--credit", "gigpo", "--step-reward", "evidence"], ["--thinking"],
                                    ["--context", "fold", "--context-window", "1100"], JUDGED],
                         ids=["trajectory", "gigpo", "thinking", "fold", "judge"])
def test_a_killed_run_resumes_at_its_checkpoint_and_matches_an_uninterrupted_run(tmp_path, credit):
    args = [*BASE, *credit, "--max-steps", "6", "--save-every", "2", "--run-dir"]
    killed = tmp_path / "killed"
    process = run_python(["-c", KILL_AFTER_STEP, "3", *args, str(killed)], cwd=REPO, timeout=300)
    assert process.returncode == -9, process.stderr[-2000:]
    run = RunDir(killed)
    assert [m["step"] for m in run.metrics()] == [0, 1, 2, 3]  # step 3 finished after checkpoint 2
    assert run.resume_point().step == 2

    code, output = train("--resume", str(killed))
    assert code == 0, output
    code, output = train(*credit, "--max-steps", "6", "--save-every", "2", "--run-dir", str(tmp_path / "straight"))
    assert code == 0, output

    resumed = [comparable(m) for m in RunDir(killed).metrics()]
    straight = [comparable(m) for m in RunDir(tmp_path / "straight").metrics()]
    assert [m["step"] for m in resumed] == list(range(6))
    assert resumed == straight
    rewound = [json.loads(line) for line in (killed / "metrics.rewound.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rewound] == [2, 3]  # undone work is kept aside, not lost
    if credit == ["--thinking"]:  # every turn reasoned, and its checkpoint is evaluated reasoning
        records = [record for step in read_run_transcripts(killed / "transcripts.jsonl").by_step.values()
                   for record in step]
        assert records and all("\n</think>\n\n" in turn["text"] for record in records for turn in record["turns"])
        assert json.loads((killed / "config.json").read_text())["rollout"]["thinking"] is True
        eval_output = tmp_path / "eval.jsonl"
        code, output = run_cli("eval", "--checkpoint", str(killed), "--limit", "2", "--output", str(eval_output))
        assert code == 0 and "thinking on (--thinking), as the run trained" in output, output
        assert '"thinking": true' in eval_output.read_text().splitlines()[0]
        question = json.loads(eval_output.read_text().splitlines()[1])["question"]
        code, output = run_cli("ask", question, "--checkpoint", str(killed))
        assert code == 0 and "thinking on (--thinking), as the run trained" in output and "(reasoning) " in output, output
        assert "</think>" not in output
    elif credit[:1] == ["--context"]:  # contexts folded, each trained as its own datum, and resumed exactly
        assert resumed[0]["context/folds"] > 0 and resumed[0]["context/longest"] <= 1100
        datums = sum(m["train/datums_per_rollout_batch"] for m in resumed)
        assert datums > 4 * sum(m["train/groups_trained"] for m in resumed)  # more datums than trajectories trained
        code, output = run_cli("eval", "--checkpoint", str(killed), "--limit", "2", "--output", str(tmp_path / "e.jsonl"))
        assert code == 0 and "--context fold --context-window 1100" in output, output
    elif credit == JUDGED:  # the judge's verdicts were mixed in, counted and transcribed, and resumed exactly
        assert all(m["usage/judge_pytrio_calls"] > 0 and "reward/judge" in m for m in resumed)
        records = [record for step in read_run_transcripts(killed / "transcripts.jsonl").by_step.values()
                   for record in step if record["valid_format"]]
        assert records and all(record["judge"]["model"] == "twin" for record in records)
    elif credit:  # each turn's step group and step reward are in the transcripts, and its own advantage
        records = [record for step in read_run_transcripts(killed / "transcripts.jsonl").by_step.values()
                   for record in step]
        assert records and all("step_reward" in turn for record in records for turn in record["turns"])
        trained = [turn for record in records if record["excluded"] is None for turn in record["turns"]]
        assert trained and all(turn["step_group"] >= 1 for turn in trained)
        assert resumed[0]["credit/step_group_share"] > 0


def test_resume_may_raise_max_steps(tmp_path):
    run_dir = tmp_path / "run"
    assert train("--max-steps", "2", "--save-every", "1", "--run-dir", str(run_dir))[0] == 0
    code, output = train("--resume", str(run_dir), "--max-steps", "3")
    assert code == 0, output
    assert [m["step"] for m in RunDir(run_dir).metrics()] == [0, 1, 2]


def test_two_fresh_runs_never_share_a_checkpoint_name_and_a_resume_keeps_its_runs_names(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    for run_dir in (first, second):  # default --run-name for both
        assert train("--max-steps", "2", "--save-every", "1", "--run-dir", str(run_dir))[0] == 0
    assert train("--resume", str(first), "--max-steps", "3")[0] == 0
    names = {run_dir: [c["name"] for c in RunDir(run_dir).checkpoints()] for run_dir in (first, second)}
    assert not set(names[first]) & set(names[second])
    prefix = names[first][0].rsplit("step-", 1)[0]
    assert prefix != names[second][0].rsplit("step-", 1)[0]
    assert len(names[first]) == 3 and all(name.startswith(prefix) for name in names[first])
    assert len(set(names[first])) == 3


def test_a_fresh_run_whose_checkpoint_names_are_already_recorded_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr("searchr1.training.checkpoints.new_run_id", lambda: "cafe0001")
    assert train("--max-steps", "1", "--run-dir", str(tmp_path / "first"))[0] == 0
    code, output = train("--max-steps", "1", "--run-dir", str(tmp_path / "second"))
    assert code == 1 and "cafe0001" in output and "first" in output
    assert not (tmp_path / "second").exists()


def test_a_trajectory_budget_beyond_the_lab_ports_packer_limit_trains_with_one_call_per_step(tmp_path):
    code, output = train("--max-steps", "1", "--max-trajectory-tokens", "70000", "--run-dir", str(tmp_path / "r"))
    assert code == 0, output
    assert RunDir(tmp_path / "r").metrics()[0]["train/forward_backward_calls"] == 1


@pytest.mark.parametrize("flag", [["--temperature", "0.7"], ["--top-p", "0.9"]])
def test_training_refuses_a_sampling_distribution_the_importance_ratio_cannot_use(tmp_path, flag):
    code, output = train("--max-steps", "1", *flag, "--run-dir", str(tmp_path / "r"))
    assert code == 2 and "--allow-tempered-sampling" in output
    assert not (tmp_path / "r").exists()
    code, output = train("--max-steps", "1", *flag, "--allow-tempered-sampling", "--run-dir", str(tmp_path / "r"))
    assert code == 0, output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--resume", "RUN", "--group-size", "8"], "--group-size cannot change when resuming"),
        (["--resume", "RUN", "--run-dir", "elsewhere"], "contradict"),
    ],
)
def test_contradictory_flags_are_refused(tmp_path, args, message):
    run_dir = tmp_path / "run"
    assert train("--max-steps", "1", "--run-dir", str(run_dir))[0] == 0
    code, output = train(*[str(run_dir) if a == "RUN" else a for a in args])
    assert code == 2 and message in output


def test_resuming_a_directory_that_is_not_a_run_names_it(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    code, output = train("--resume", str(tmp_path))
    assert code == 1 and "is not a searchr1 run directory" in output and str(tmp_path) in output


def test_an_existing_run_directory_is_never_overwritten(tmp_path):
    run_dir = tmp_path / "run"
    assert train("--max-steps", "1", "--run-dir", str(run_dir))[0] == 0
    before = (run_dir / "metrics.jsonl").read_text()
    code, output = train("--max-steps", "1", "--run-dir", str(run_dir))
    assert code == 1 and "already exists" in output
    assert (run_dir / "metrics.jsonl").read_text() == before


def test_an_unwritable_run_directory_is_named(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a directory should go")  # works even as root
    code, output = train("--max-steps", "1", "--run-dir", str(blocker / "run"))
    assert code == 1 and "cannot write to run directory" in output and "blocker" in output


def test_a_live_run_without_a_key_fails_fast(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTRIO_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    data = tmp_path / "train.jsonl"
    data.write_text('{"id": "1", "question": "q?", "answers": ["a"], "data_source": "nq"}\n')
    result = CliRunner().invoke(main, ["train", "--quiet", "--max-steps", "1", "--data", str(data),
                                       "--run-dir", str(tmp_path / "run"), "--backend", "wikipedia"])
    assert result.exit_code == 1 and "PYTRIO_API_KEY" in result.output


def test_live_runs_need_max_steps():
    result = CliRunner().invoke(main, ["train", "--quiet"])
    assert result.exit_code == 2 and "--max-steps is required" in result.output


INTERRUPTER = textwrap.dedent(
    """
    import os, signal, sys
    from searchr1.run import directory as run_dir
    from searchr1.core import trainer
    from searchr1.training import pipeline
    where, at_step, presses = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    def press():
        for _ in range(presses):
            os.kill(os.getpid(), signal.SIGINT)
    original_append = run_dir.RunDir.append_metrics
    def append(self, record):
        original_append(self, record)
        if where == "after_step" and record["step"] == at_step:
            press()
    run_dir.RunDir.append_metrics = append
    original_rollout = trainer.rollout_batch_async
    async def rollout(*args, step, **kwargs):
        if where == "in_rollout" and step == at_step:
            press()
        return await original_rollout(*args, step=step, **kwargs)
    trainer.rollout_batch_async = pipeline.rollout_batch_async = rollout  # on-policy: the core's own
    from searchr1.cli import main
    main(sys.argv[4:])
    """
)


@pytest.mark.parametrize("where", ["after_step", "in_rollout"])
def test_the_first_ctrl_c_finishes_the_step_and_checkpoints_it_so_resume_loses_nothing(tmp_path, where):
    run_dir = tmp_path / "run"
    args = [*BASE, "--backend", "wikipedia", "--max-steps", "4", "--save-every", "50", "--run-dir", str(run_dir)]
    process = run_python(["-c", INTERRUPTER, where, "1", "1", *args], cwd=REPO, timeout=300)
    assert process.returncode == 130, process.stderr[-2000:]
    assert "checkpoint" in process.stderr and "--resume" in process.stderr
    assert "stopped on Ctrl-C after step 1;" in process.stderr  # the step its last step line named
    run = RunDir(run_dir)
    assert [m["step"] for m in run.metrics()] == [0, 1]
    assert run.resume_point().step == 2  # the interrupted step was finished and saved
    code, output = train("--resume", str(run_dir))
    assert code == 0, output
    assert [m["step"] for m in run.metrics()] == [0, 1, 2, 3]
    assert not (run_dir / "metrics.rewound.jsonl").exists()  # no finished step was undone


def test_a_second_ctrl_c_quits_at_once_and_resume_restarts_at_the_last_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    args = [*BASE, "--backend", "wikipedia", "--max-steps", "4", "--save-every", "1", "--run-dir", str(run_dir)]
    process = run_python(["-c", INTERRUPTER, "in_rollout", "2", "2", *args], cwd=REPO, timeout=300)
    assert process.returncode == 130, process.stderr[-2000:]
    run = RunDir(run_dir)
    assert [m["step"] for m in run.metrics()] == [0, 1]  # step 2 was abandoned, not recorded
    assert run.resume_point().step == 2
    assert train("--resume", str(run_dir))[0] == 0
    assert [m["step"] for m in run.metrics()] == [0, 1, 2, 3]


def test_quitting_at_once_before_any_checkpoint_does_not_promise_a_checkpoint(tmp_path, monkeypatch):
    from searchr1.core import trainer
    from searchr1.training import pipeline

    original = trainer.rollout_batch_async

    async def rollout(*args, step, **kwargs):
        if step == 1:  # what the second Ctrl-C does: KeyboardInterrupt wherever the run is
            raise KeyboardInterrupt
        return await original(*args, step=step, **kwargs)

    monkeypatch.setattr(trainer, "rollout_batch_async", rollout)  # on-policy: the core's own source
    monkeypatch.setattr(pipeline, "rollout_batch_async", rollout)
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(main, [*BASE, "--max-steps", "4", "--save-every", "50", "--run-dir", str(run_dir)])
    assert result.exit_code == 130, result.output
    run = RunDir(run_dir)
    assert [m["step"] for m in run.metrics()] == [0] and run.resume_point() is None
    assert "last checkpoint" not in result.output and "before the first checkpoint" in result.output
    assert "starts it over from step 0" in result.output


@pytest.mark.parametrize("args, message", [
    (["--max-steps", "0"], "--max-steps"),
    (["--max-steps", "-1"], "--max-steps"),
    (["--learning-rate", "0"], "--learning-rate"),
    (["--beta2", "1"], "--beta2"),
    (["--group-size", "1"], "a group of one always has advantage 0"),
    (["--questions-per-batch", "0"], "--questions-per-batch"),
    (["--max-train-samples", "-3"], "--max-train-samples"),
])
def test_impossible_values_get_one_line_naming_the_flag(tmp_path, args, message):
    result = CliRunner().invoke(main, ["train", "--offline", "--quiet", *args, "--run-dir", str(tmp_path / "r")])
    assert result.exit_code == 2 and message in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) <= 4
    assert not (tmp_path / "r").exists()


def test_a_batch_larger_than_the_dataset_warns_that_steps_repeat_questions(tmp_path):
    code, output = train("--max-steps", "1", "--max-train-samples", "3", "--run-dir", str(tmp_path / "r"))
    assert code == 0, output
    assert "every step repeats questions" in output


@pytest.mark.parametrize("command", [["train", "--offline"], ["eval", "--offline"]])
def test_the_scripted_scenarios_group_limit_is_a_flag_error_before_anything_runs(tmp_path, command):
    result = CliRunner().invoke(main, [*command, "--quiet", "--offline-policy", "scripted", "--group-size", "10",
                                       "--run-dir" if command[0] == "train" else "--output", str(tmp_path / "x")])
    assert result.exit_code == 2 and "8 samples per question" in result.output
    assert not (tmp_path / "x").exists()
    assert "scripted" in CliRunner().invoke(main, [command[0], "--help"]).output


def test_a_judged_run_mixes_the_verdicts_counts_and_prices_the_judge_and_caches_its_answers(tmp_path):
    """--judge twin --judge-weight W: each answer's reward is (1 - W) * EM + W * the twin's verdict,
    the judge's calls, requests and tokens are usage (priced by the table), and its answers are
    cached: a second run with the same seed asks nothing the first one asked."""
    prices = tmp_path / "prices.toml"
    prices.write_text('currency = "EUR"\n[judge.pytrio.per_million_tokens]\nprompt_tokens = 1.0\n')
    cache = tmp_path / "judge.jsonl"
    judged = ["--max-steps", "2", "--judge", "twin", "--judge-weight", "0.25", "--judge-cache", str(cache),
              "--prices", str(prices), "--transcripts-per-step", "16"]
    code, output = train(*judged, "--run-dir", str(tmp_path / "run"))
    assert code == 0, output
    lines = RunDir(tmp_path / "run").metrics()
    assert all(line["usage/judge_pytrio_calls"] >= line["usage/judge_pytrio_requests"] > 0 for line in lines)
    assert all(line["cost/judge_pytrio_prompt_tokens"] == pytest.approx(line["usage/judge_pytrio_prompt_tokens"] / 1e6)
               for line in lines)
    records = [r for step in read_run_transcripts(tmp_path / "run" / "transcripts.jsonl").by_step.values() for r in step]
    for record in records:
        if record["valid_format"]:
            assert record["reward"] == pytest.approx(0.75 * record["exact_match"] + 0.25 * record["judge"]["correct"])
        else:
            assert "judge" not in record and record["reward"] == -0.1
    assert sum(line["usage/judge_pytrio_requests"] for line in lines) == len(cache.read_text().splitlines())
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (config["judge"], config["judge_weight"], config["judge_cache"]) == ("twin", 0.25, str(cache))

    code, output = train(*judged, "--run-dir", str(tmp_path / "again"))
    assert code == 0, output
    again = RunDir(tmp_path / "again").metrics()
    assert [line["reward/mean"] for line in again] == [line["reward/mean"] for line in lines]
    assert all(line["usage/judge_pytrio_requests"] == 0 for line in again)  # the cache answered


@pytest.mark.parametrize("args, message", [
    (["--judge-weight", "0.5"], "--judge-weight 0.5: names no judge to ask; add --judge MODEL"),
    (["--judge", "twin"], "--judge twin: a training judge is a reward term"),
    (["--judge", "twin", "--judge-weight", "1.5"], "--judge-weight"),
    (["--judge", "deepseek-chat", "--judge-weight", "0.5"], "--judge deepseek-chat offline replays a cassette"),
    (["--judge", "Qwen/Qwen3.5-4B", "--judge-weight", "0.5"], "the offline judge is 'twin'"),
    (["--judge", "twin", "--judge-weight", "0.5", "--judge-cassette", "judge.yaml"],
     "--judge-cassette applies to a deepseek-* judge"),
], ids=["weight-without-judge", "judge-without-weight", "weight-above-1", "deepseek-without-cassette",
        "pytrio-model-offline", "cassette-without-deepseek"])
def test_a_judge_that_cannot_run_is_refused_in_one_line_before_any_work(tmp_path, args, message):
    run_dir = tmp_path / "run"
    code, output = train("--max-steps", "1", *args, "--run-dir", str(run_dir))
    assert code == 2 and message in output, output
    assert not run_dir.exists()
