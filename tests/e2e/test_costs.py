"""What a run costs, end to end on the offline twin through the real pytrio client: our usage
counts against the twin's own count of what it served, budgets that stop and resume exactly,
and an estimate that spends nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from searchr1.cli import main
from searchr1.run.directory import TWIN_HOME, RunDir
from searchr1.run.usage import Usage, depends_on_timing
from searchr1.twin.served import read_served

REPO = Path(__file__).resolve().parents[2]
PRICES = REPO / "docs" / "prices.example.toml"
BASE = ["train", "--offline", "--quiet", "--questions-per-batch", "4", "--group-size", "4"]
# what the twin counts, by the client's names (forward_backward events are PyTRIO's chunks, not calls)
SERVED_KINDS = ("sample_requests", "sample_prompt_tokens", "sample_generated_tokens", "kl_requests",
                "kl_prompt_tokens", "kl_generated_tokens", "train_tokens", "optim_steps", "weight_saves",
                "state_saves")


def train(*args: str):
    return CliRunner().invoke(main, [*BASE, *args])


def totals(run_dir: Path) -> dict[str, float]:
    last = RunDir(run_dir).metrics()[-1]
    return {k: v for k, v in last.items() if k.startswith(("usage/total_", "cost/total"))}


@pytest.mark.parametrize("options", [[], ["--kl-coef", "0.05"], ["--max-steps-off-policy", "1"]],
                         ids=["default", "kl", "off-policy"])
def test_our_usage_totals_equal_what_the_twin_served(tmp_path, options):
    run_dir = tmp_path / "run"
    result = train("--max-steps", "3", "--save-every", "2", "--run-dir", str(run_dir), *options)
    assert result.exit_code == 0, result.output
    lines = RunDir(run_dir).metrics()
    ours = Usage.from_metrics(lines[-1], total=True)
    served = read_served(run_dir / TWIN_HOME)
    assert {kind: getattr(ours, kind) for kind in SERVED_KINDS} == {kind: getattr(served, kind) for kind in SERVED_KINDS}
    assert ours.sample_requests > 0 and ours.train_tokens > 0 and ours.state_saves == 2  # steps 2 and 3
    assert ours.forward_backward_calls == ours.optim_steps == 3 <= served.forward_backward_events
    if "--kl-coef" in options:
        assert ours.kl_requests == sum(line["kl/base_requests"] for line in lines) > 0
    else:
        assert ours.kl_requests == 0
    # the step counts add up to the totals, and the search counts to the search service's own counters
    summed = Usage()
    for line in lines:
        summed.add(Usage.from_metrics(line))
    assert summed.kinds() == ours.kinds()
    searched = ours.search["deepseek"]
    assert searched.calls == sum(line["search/requests"] for line in lines)  # search/requests counts calls
    assert searched.input_tokens == sum(line["search/input_tokens"] for line in lines)
    assert searched.web_searches == sum(line["search/web_search_requests"] for line in lines)
    assert searched.calls - searched.requests == sum(line["search/deduplicated"] for line in lines)


def test_the_step_line_shows_the_runs_running_total(tmp_path):
    result = train("--max-steps", "2", "--prices", str(PRICES), "--run-dir", str(tmp_path / "run"))
    assert result.exit_code == 0, result.output
    lines = RunDir(tmp_path / "run").metrics()
    step_lines = [line for line in result.output.splitlines() if line.startswith("step ")]
    for text, line in zip(step_lines, lines):
        assert f"run {line['usage/total_model_tokens'] / 1000:.1f}k tok" in text
        assert f"spent {line['cost/total']:.2f}" in text


@pytest.mark.parametrize("k", [0, 1])
def test_a_budget_stops_before_passing_it_and_a_larger_budget_resumes_to_an_uninterrupted_runs_totals(tmp_path, k):
    common = ["--max-steps", "5", "--save-every", "1", "--max-steps-off-policy", str(k), "--prices", str(PRICES)]
    straight = tmp_path / "straight"
    assert train(*common, "--run-dir", str(straight)).exit_code == 0
    per_step = [line["cost/step"] for line in RunDir(straight).metrics()]
    budget = per_step[0] + per_step[1] + per_step[2] / 2  # enough for two steps, not three
    stopped = tmp_path / "stopped"
    result = train(*common, "--budget", f"{budget:.6f}", "--run-dir", str(stopped))
    assert result.exit_code == 4, result.output
    message = [line for line in result.output.splitlines() if line.startswith("budget reached")]
    assert len(message) == 1 and "spent" in message[0] and "left" in message[0]
    assert f"searchr1 train --resume {stopped} --budget " in message[0]
    lines = RunDir(stopped).metrics()
    assert [line["step"] for line in lines] == [0, 1]
    assert lines[-1]["cost/total"] <= budget  # stopped before passing it
    assert RunDir(stopped).resume_point().step == 2
    larger = message[0].rsplit("--budget ", 1)[1]
    result = CliRunner().invoke(main, ["train", "--resume", str(stopped), "--quiet", "--budget", larger])
    while result.exit_code == 4:  # the suggested budget may still be short of the whole run: raise again
        larger = result.output.rsplit("--budget ", 1)[1].split()[0]
        result = CliRunner().invoke(main, ["train", "--resume", str(stopped), "--quiet", "--budget", larger])
    assert result.exit_code == 0, result.output
    assert [line["step"] for line in RunDir(stopped).metrics()] == list(range(5))
    exact = {key: value for key, value in totals(straight).items() if not depends_on_timing(key)}
    assert {key: value for key, value in totals(stopped).items() if not depends_on_timing(key)} == exact
    assert exact["usage/total_sample_requests"] > 0


def test_a_token_budget_needs_no_prices_and_a_money_budget_needs_them(tmp_path):
    result = train("--max-steps", "4", "--budget-tokens", "1", "--run-dir", str(tmp_path / "tokens"))
    assert result.exit_code == 4 and "--budget-tokens" in result.output
    assert [line["step"] for line in RunDir(tmp_path / "tokens").metrics()] == [0]  # the first step is measured
    result = train("--max-steps", "2", "--budget", "3", "--run-dir", str(tmp_path / "money"))
    assert result.exit_code == 2 and "--budget needs --prices" in result.output
    assert not (tmp_path / "money").exists()


def test_a_bad_price_table_is_one_line_before_anything_runs(tmp_path):
    prices = tmp_path / "prices.toml"
    prices.write_text('currency = "CNY"\n[per_million_tokens]\nsample_tokens = 1.0\n')
    result = train("--max-steps", "2", "--prices", str(prices), "--run-dir", str(tmp_path / "run"))
    assert result.exit_code == 1
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert errors == [f"Error: {prices}:3: per_million_tokens.sample_tokens is not a usage kind here; known: "
                      "sample_prompt_tokens, sample_generated_tokens, train_tokens, forward_tokens, kl_prompt_tokens, "
                      "kl_generated_tokens"]
    assert not (tmp_path / "run").exists()


def test_an_estimate_spends_nothing(tmp_path, monkeypatch):
    from searchr1.wiring import services

    def no_service(*args, **kwargs):
        raise AssertionError("an estimate contacted the service")

    monkeypatch.setattr(services, "offline_service", no_service)
    monkeypatch.chdir(tmp_path)
    result = train("--max-steps", "20", "--prices", str(PRICES), "--estimate")
    assert result.exit_code == 0, result.output
    assert "sample_requests" in result.output and "run (20 steps)" in result.output
    assert "cost (CNY)" in result.output
    row = next(line.split() for line in result.output.splitlines() if line.strip().startswith("sample_requests"))
    assert row[1:] == ["4-84", "80-1680"]  # 4 questions .. plus 16 trajectories x 5 later turns, per step and x20
    assert not (tmp_path / "runs").exists()


def number(text: str) -> float:
    """A number as the estimate prints it (12.3k, 1.20M)."""
    scale = {"k": 1e3, "M": 1e6}.get(text[-1], 1.0)
    return float(text.rstrip("kM")) * scale


def test_a_measured_estimate_projects_the_run_from_one_step_on_the_twin(tmp_path):
    result = train("--max-steps", "10", "--estimate", "--estimate-measure", "--run-dir", str(tmp_path / "run"))
    assert result.exit_code == 0, result.output
    row = next(line.split() for line in result.output.splitlines() if line.strip().startswith("train_tokens"))
    measured, projected = number(row[2]), number(row[4])
    assert projected == pytest.approx(measured * 10, rel=0.01)
    assert "not the real model's" in result.output  # the twin's reply lengths are the twin's
    assert not (tmp_path / "run").exists()  # the measured step ran in a temporary directory


def test_resume_rejects_nothing_about_costs_and_records_the_new_budget(tmp_path):
    run_dir = tmp_path / "run"
    assert train("--max-steps", "1", "--run-dir", str(run_dir)).exit_code == 0
    result = CliRunner().invoke(main, ["train", "--resume", str(run_dir), "--quiet", "--max-steps", "2",
                                       "--prices", str(PRICES), "--budget", "1000"])
    assert result.exit_code == 0, result.output
    config = json.loads((run_dir / "config.json").read_text())
    assert config["budget"] == 1000 and config["prices"] == str(PRICES)
    last = RunDir(run_dir).metrics()[-1]
    assert last["cost/total"] > 0 and last["usage/total_optim_steps"] == 2


def test_an_eval_summary_counts_usage_per_question_and_keeps_it_across_a_rerun(tmp_path):
    output = tmp_path / "eval.jsonl"
    command = ["eval", "--offline", "--quiet", "--offline-policy", "scripted", "--limit", "4", "--prices", str(PRICES),
               "-o", str(output)]
    first = CliRunner().invoke(main, command)
    assert first.exit_code == 0, first.output
    assert "usage:" in first.output and "cost" in first.output
    summary = json.loads(output.read_text().splitlines()[-1])
    metrics = summary["metrics"]
    questions = summary["evaluated_examples"]
    assert questions == 4 and metrics["usage/total_sample_requests"] >= questions  # one first request per question
    for kind in ("sample_prompt_tokens", "sample_generated_tokens", "search_deepseek_calls"):
        assert metrics[f"usage/{kind}_per_question"] * questions == pytest.approx(metrics[f"usage/total_{kind}"])
    assert metrics["cost/per_question"] * questions == pytest.approx(metrics["cost/total"]) and metrics["cost/total"] > 0
    again = CliRunner().invoke(main, command)  # every question is recorded: nothing runs, the summary is rebuilt
    assert again.exit_code == 0, again.output
    rebuilt = json.loads(output.read_text().splitlines()[-1])["metrics"]
    assert {k: v for k, v in rebuilt.items() if k.startswith("usage/")} == {
        k: v for k, v in metrics.items() if k.startswith("usage/")}


def test_show_prints_a_trajectorys_tokens_and_searches(tmp_path):
    run_dir = tmp_path / "run"
    assert train("--max-steps", "1", "--run-dir", str(run_dir)).exit_code == 0
    record = json.loads((run_dir / "transcripts.jsonl").read_text().splitlines()[0])
    generated = sum(turn["generated_tokens"] for turn in record["turns"])
    result = CliRunner().invoke(main, ["show", str(run_dir), "--limit", "1"])
    assert result.exit_code == 0, result.output
    turns = len(record["turns"])
    assert f"tokens {generated} generated over {turns} turn{'' if turns == 1 else 's'}" in result.output
    assert f"searches {record['search_calls']}" in result.output
