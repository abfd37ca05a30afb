"""Errors that name the culprit and options refused in one line, across eval, rollout,
prepare-data, bench and the run directory (show and plot have theirs in their own tests)."""

from __future__ import annotations

import io
import json
import re

import click
import pytest
from click.testing import CliRunner
from rich.console import Console

from searchr1.bench.report import Figure, Measure, bench_json, print_report
from searchr1.cli import main
from searchr1.run.directory import RunDir, RunDirError


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, [*map(str, args)])
    return result.exit_code, result.output


def last_line(output: str) -> str:
    return output.strip().splitlines()[-1]


# --- the run directory -----------------------------------------------------------------------------


def fake_run(tmp_path, state_text: str, config_text: str = '{"run_name": "demo"}'):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(config_text)
    (run / "run_state.json").write_text(state_text)
    return run


def test_a_corrupt_run_state_names_the_file_and_where_it_breaks(tmp_path):
    torn = '{"step": 3, "cursor": '
    run = fake_run(tmp_path, torn)
    with pytest.raises(RunDirError) as info:
        RunDir(run).open()
    assert str(info.value).startswith(f"{run / 'run_state.json'}: invalid JSON (")
    assert f"line 1, column {len(torn) + 1})" in str(info.value)  # just past the torn end
    with pytest.raises(RunDirError, match=re.escape(str(run / "run_state.json"))):
        RunDir(run).state()


def test_a_run_file_that_is_not_an_object_is_named(tmp_path):
    run = fake_run(tmp_path, "{}", config_text="[1, 2]")
    with pytest.raises(RunDirError, match=re.escape(f"{run / 'config.json'} should hold a JSON object, not list")):
        RunDir(run).open()


def test_resuming_a_run_with_a_corrupt_state_is_one_line_naming_the_file(tmp_path):
    run = fake_run(tmp_path, "\x00\x00garbage")
    code, output = invoke("train", "--resume", run)
    assert code == 1
    assert output.strip() == f"Error: {run / 'run_state.json'}: invalid JSON (Expecting value at line 1, column 1)"


# --- one default search backend ---------------------------------------------------------------------


def backend_default(command_name: str) -> str:
    command = main.get_command(click.Context(main), command_name)
    (param,) = [p for p in command.params if p.name == "search_backend"]
    return param.default


def test_every_command_that_searches_defaults_to_the_same_backend_and_the_readme_says_which():
    from pathlib import Path

    defaults = {name: backend_default(name) for name in ("train", "eval", "rollout")}
    assert set(defaults.values()) == {"deepseek"}, defaults
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text("utf-8")
    assert "`deepseek` (default" in readme


# --- impossible values ------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "flag"), [
    (["eval", "--offline", "--top-p", "0"], "--top-p"),
    (["eval", "--offline", "--top-p", "1.5"], "--top-p"),
    (["eval", "--offline", "--limit", "0"], "--limit"),
    (["eval", "--offline", "--group-size", "0"], "--group-size"),
    (["eval", "--offline", "--temperature", "-1"], "--temperature"),
    (["eval", "--offline", "--search-concurrency", "0"], "--search-concurrency"),
    (["rollout", "--offline", "--questions", "0"], "--questions"),
    (["rollout", "--offline", "--top-p", "0"], "--top-p"),
    (["rollout", "--offline", "--max-assistant-turns", "0"], "--max-assistant-turns"),
    (["prepare-data", "--dev-per-source", "0"], "--dev-per-source"),
    (["bench", "--quick", "--strict"], "--strict and --quick"),
    (["train", "--offline", "--run-name", "../escape"], "--run-name"),
    (["train", "--offline", "--run-name", "two words"], "--run-name"),
    (["train", "--offline", "--run-name", "trailing-newline\n"], "--run-name"),
])
def test_impossible_values_are_one_line_errors_naming_the_flag(tmp_path, args, flag):
    code, output = invoke(*args, *(["--output-dir", tmp_path / "d"] if args[0] == "prepare-data" else []))
    assert code == 2, output
    assert "Traceback" not in output
    assert last_line(output).startswith("Error: ") and flag in last_line(output)
    assert list(tmp_path.iterdir()) == []


def test_rollout_states_the_scenarios_limits(tokenizer):
    code, output = invoke("rollout", "--offline", "--group-size", "9")
    assert code == 2
    assert last_line(output) == ("Error: Invalid value for --group-size: 9 is more than the 8 samples per question "
                                 "scripted in scenario.json")
    code, output = invoke("rollout", "--offline", "--questions", "99")
    assert code == 2 and "--questions: 99 is more than the" in last_line(output)
    assert "8 samples" in invoke("rollout", "--help")[1]


def test_rollout_runs_offline_on_the_default_backend(tokenizer):
    code, output = invoke("rollout", "--offline", "--questions", "1", "--group-size", "2")
    assert code == 0, output
    assert last_line(output).startswith("2 trajectories, mean reward")


# --- bench --quick ------------------------------------------------------------------------------------


def missed_figure() -> Figure:
    return Figure(1, "scheduling", "Rollout scheduling", [Measure("ratio", "makespan / bound", 1.4, 1.25)])


@pytest.mark.parametrize("quick", [True, False])
def test_a_quick_bench_says_it_is_not_held_to_the_targets_and_a_full_one_reports_misses(quick):
    buffer = io.StringIO()
    print_report([missed_figure()], console=Console(file=buffer, width=200), quick=quick)
    text = buffer.getvalue()
    if quick:
        assert "--quick is a smoke run and is not held to the targets" in text and "miss a target" not in text
    else:
        assert "1 figure misses a target" in text and "not held" not in text
    report = bench_json([missed_figure()], quick=quick, seed=0)
    assert report["held_to_targets"] is (not quick) and report["all_met"] is False
    json.dumps(report)


# --- help and messages that agree with what the commands do -----------------------------------------


def option_help(command: str, flag: str) -> str:
    """The help text of one option, as ``--help`` prints it (whitespace folded)."""
    code, output = invoke(command, "--help")
    assert code == 0, output
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"  {flag} "))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("  -")), len(lines))
    return " ".join(" ".join(lines[start:end]).split())


def test_bench_help_lists_every_figure_the_bench_runs():
    from searchr1.bench.runner import FIGURE_NUMBERS

    code, output = invoke("bench", "--help")
    assert code == 0, output
    for number in FIGURE_NUMBERS:
        assert re.search(rf"^\s+{number}\s+\w", output, re.MULTILINE), f"figure {number} is not listed"
    assert f"figures (1-{max(FIGURE_NUMBERS)};" in " ".join(output.split())


def test_train_help_states_the_learning_rate_each_kind_of_run_gets():
    from searchr1.training.config import TrainConfig
    from searchr1.core.settings import offline_defaults

    text = option_help("train", "--learning-rate")
    assert "4e-05" in text
    for policy in ("learning", "scripted"):
        rate = offline_defaults(TrainConfig, policy).get("learning_rate")
        assert rate is None or (f"{rate:g} with --offline-policy {policy}" in " ".join(text.split()))


@pytest.mark.parametrize("command, flag, bound", [
    ("train", "--group-size", "at least 2"), ("eval", "--group-size", "1<=x"),
    ("train", "--max-search-calls", "0<=x"), ("eval", "--max-search-calls", "0<=x"),
])
def test_budget_flags_show_their_range_in_help(command, flag, bound):
    assert bound in option_help(command, flag)


def test_a_group_of_zero_is_not_called_a_group_of_one(tmp_path):
    code, output = invoke("train", "--offline", "--group-size", "0", "--run-dir", tmp_path / "r")
    assert code == 2 and "'--group-size'" in output
    assert "group of one" not in output and "must be >= 1, got 0" in output


def test_eval_of_a_missing_run_directory_says_it_does_not_exist(tmp_path):
    missing = tmp_path / "no-such-run"
    code, output = invoke("eval", "--checkpoint", missing, "--quiet")
    assert code == 1
    assert last_line(output) == f"Error: run directory {missing} does not exist"


def test_eval_help_names_checkpoints_the_way_train_names_them():
    from searchr1.core.rollout import RolloutConfig
    from searchr1.training.config import TrainConfig
    from searchr1.training.checkpoints import checkpoint_name

    name = checkpoint_name(TrainConfig(data="d", rollout=RolloutConfig(), max_steps=20, run_id="0a1b2c3d"), 20)
    code, output = invoke("eval", "--help")
    assert f"{name.rsplit('-', 2)[-2]}-{name.rsplit('-', 2)[-1]}-weights" in output  # step-000020-weights
    assert "step-20-" not in output


def test_an_eval_without_searches_reports_no_search_success_rate_rather_than_zero():
    from searchr1.commands.eval import format_summary

    metrics = {"em/macro": 0.0, "em/macro_ci95_low": 0.0, "em/macro_ci95_high": 0.0, "em/micro": 0.0,
               "em/micro_ci95_low": 0.0, "em/micro_ci95_high": 0.0, "format/rate": 1.0,
               "rollout/search_calls": 0.0, "rollout/no_search_rate": 1.0, "rollout/turns": 1.0,
               "search/requests": 0.0, "search/success_rate": 0.0}
    text = format_summary({"metrics": metrics, "evaluated_examples": 3})
    assert "search success - (no searches)" in text and "search success 0.000" not in text
    searched = format_summary({"metrics": {**metrics, "search/requests": 4.0, "search/success_rate": 0.75,
                                           "rollout/search_calls": 1.3}, "evaluated_examples": 3})
    assert "search success 0.750" in searched


def test_the_summary_table_marks_each_source_under_the_threshold_and_says_why():
    from searchr1.commands.eval import format_summary
    from searchr1.evaluation.intervals import FEW_QUESTIONS
    from searchr1.evaluation.metrics import evaluation_metrics

    def question(source: str, index: int) -> dict:
        return {"type": "trajectory", "id": f"{source}/{index}", "data_source": source, "answers": ["a"],
                "final_text": "Answer: a", "termination": "answer", "reward": 1.0, "exact_match": True,
                "valid_format": True, "search_calls": 0, "assistant_turns": 1}

    records = [question("nq", i) for i in range(FEW_QUESTIONS)] + [question("popqa", 0)]
    rows = {line.split()[0]: line for line in format_summary({"metrics": evaluation_metrics(records),
                                                              "evaluated_examples": 11}).splitlines()}
    assert "popqa*" in rows and "nq" in rows and "nq*" not in rows
    assert f"fewer than {FEW_QUESTIONS} questions" in rows["*"]


def test_the_readme_quotes_one_starting_reward_for_the_offline_run():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text("utf-8")
    starts = set(re.findall(r"climbs from about (\S+?) ", " ".join(readme.split())))
    assert len(starts) == 1, f"the README gives different starting rewards: {sorted(starts)}"


def test_a_ctrl_c_names_the_command_it_interrupted_and_says_what_is_kept(tmp_path, monkeypatch):
    import searchr1.bm25.index as index_module

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(index_module, "build_index", interrupted)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "1", "contents": "\\"Title\\"\\ntext"}\n')
    code, output = invoke("index", "build", corpus, "--out", tmp_path / "index", "--quiet")
    assert code == 130, output
    assert last_line(output) == ("index build interrupted (Ctrl-C) before it finished; nothing it had finished "
                                 "is lost: run the same command again to continue")


@pytest.mark.parametrize("policy", ["learning", "scripted"])
def test_ask_offline_refuses_a_question_the_twin_does_not_know_in_one_line_before_starting(monkeypatch, policy):
    import searchr1.wiring.services as services

    def not_reached(*args, **kwargs):
        raise AssertionError("started although the question cannot be answered")

    monkeypatch.setattr(services, "load_tokenizer", not_reached)
    code, output = invoke("ask", "Who wrote Dune?", "--offline", "--offline-policy", policy)
    assert code == 1, output
    (line,) = output.strip().splitlines()
    assert line.startswith("Error: ") and "'Who wrote Dune?'" in line and "ActorAPIError" not in line
    assert "searchr1/offline/questions.json" in line and '"who wrote pride and prejudice?"' in line


def test_every_shipped_offline_question_passes_the_ask_check_as_the_twin_reads_it():
    from searchr1.commands.ask import check_offline_question
    from searchr1.offline import PAGES, load_source

    source = load_source()
    for item in source["train"] + source["dev"]:
        check_offline_question(f"  {item['question']}\n", "learning")  # the twin trims what it compares
        check_offline_question(item["question"], "scripted")
    pages = load_source(PAGES)
    for item in pages["train"] + pages["dev"]:  # the learning policy knows the page questions too
        check_offline_question(item["question"], "learning")
        scripted_knows = len(source["train"] + source["dev"])  # the scripted policy has no page questions
        with pytest.raises(click.ClickException, match=f"scripted policy answers only the {scripted_knows} questions"):
            check_offline_question(item["question"], "scripted")

