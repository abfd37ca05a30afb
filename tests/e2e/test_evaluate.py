"""The evaluation runner (``searchr1.evaluation.evaluate``) and ``python cli.py eval``, offline: the
shipped dev set, the scripted policy and the search cassettes."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from searchr1.cli import main
from searchr1.core.types import SearchExample
from searchr1.data.dataset import DataError, load_examples
from searchr1.basics.fileio import file_sha256
from searchr1.evaluation.metrics import (
    COMPARABLE_CONFIG_FIELDS,
    load_summary,
    read_eval_records,
)
from searchr1.evaluation.evaluate import (
    HEADER_TYPE,
    EvalResumeError,
    evaluate,
    merge_search_metrics,
    plan_questions,
)
from searchr1.offline import DEV
from searchr1.core.rollout import RolloutConfig
from searchr1.search.options import SearchOptions
from searchr1.wiring.services import offline_scenario, offline_service, search_backend
from twin_support import without_timing_metrics

SECRET = "sk-eval-test-secret-0123456789"
TIMING_FIELDS = ("elapsed_seconds",)
DEV_EXAMPLES = load_examples(DEV)


def cli(*args: str) -> object:
    """Offline eval on the scripted scenario: its fixed mix of behaviours (searches, guesses, bad
    calls) exercises every part of the runner; the learning policy is tested in test_learning_twin."""
    return CliRunner().invoke(main, ["eval", "--offline", "--offline-policy", "scripted", "--quiet", *args])


def trajectories(path: Path) -> list[dict]:
    return [r for r in read_eval_records(path) if r.get("type") == "trajectory"]


def without_timing(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in records]


def quality(summary: dict) -> dict:
    """Metrics that depend only on the records (search stats also count abandoned work)."""
    return {k: v for k, v in summary["metrics"].items() if not k.startswith("search/")}


@pytest.fixture(scope="module")
def offline_run(tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("eval") / "offline.jsonl"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DEEPSEEK_API_KEY", SECRET)
        patch.setenv("ZHIHU_SEARCH_KEYS", SECRET)
        result = cli("--output", str(output))
    assert result.exit_code == 0, result.output
    return output


# --- direct use of the runner -----------------------------------------------------------------


@pytest.fixture(scope="module")
def sampler(tokenizer, tmp_path_factory):
    service = offline_service(tmp_path_factory.mktemp("fake-trio"), tokenizer, offline_scenario())
    return service.create_sampling_client(base_model="Qwen/Qwen3.5-4B")


def run_config(config: RolloutConfig, **extra) -> dict:
    return {"search_backend": "deepseek", "rollout": asdict(config), "dataset_sha256": file_sha256(DEV), **extra}


def run_eval(output, sampler, tokenizer, *, config=None, limit=None, progress=None, overwrite=False,
             examples=DEV_EXAMPLES, **extra):
    config = config or RolloutConfig(group_size=1, temperature=0.0)

    async def go():
        backend = search_backend(SearchOptions(backend="deepseek"), offline=True)
        try:
            return await evaluate(sampler, tokenizer, backend, examples, config, output,
                                  run_config(config, **extra), limit=limit, progress=progress, overwrite=overwrite)
        finally:
            await backend.aclose()

    return asyncio.run(go())


class FailingSampler:
    """Passes ``fail_after`` sampling calls through, then raises ``error`` (or only for the
    prompts containing ``only``)."""

    def __init__(self, inner, tokenizer, *, fail_after=0, error=None, only=None):
        self.inner, self.tokenizer = inner, tokenizer
        self.fail_after, self.error, self.only = fail_after, error or RuntimeError("sampler crashed"), only
        self.calls = 0

    async def sample_async(self, **kwargs):
        if self.only is None or self.only in self.tokenizer.decode(kwargs["prompt"].to_ints()):
            self.calls += 1
            if self.calls > self.fail_after:
                raise self.error
        return await self.inner.sample_async(**kwargs)


class SeedRecorder:
    """Records the sampling seed of every request, per question."""

    def __init__(self, inner, tokenizer):
        self.inner, self.tokenizer = inner, tokenizer
        self.seeds: dict[str, list[int]] = defaultdict(list)

    async def sample_async(self, **kwargs):
        text = self.tokenizer.decode(kwargs["prompt"].to_ints())
        (question,) = [e.question for e in DEV_EXAMPLES if e.question in text]
        self.seeds[question].append(kwargs["sampling_params"].seed)
        return await self.inner.sample_async(**kwargs)


class InterruptAfter:
    """A progress reporter that presses Ctrl-C after ``k`` recorded questions."""

    def __init__(self, k: int) -> None:
        self.k, self.done = k, 0

    def start(self, total: int, done: int) -> None:
        self.total = total

    def advance(self, count: int = 1) -> None:
        self.done += count
        if self.done >= self.k:
            raise KeyboardInterrupt


@pytest.fixture(scope="module")
def baseline(sampler, tokenizer, tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("baseline") / "eval.jsonl"
    outcome = run_eval(output, sampler, tokenizer)
    assert outcome.evaluated == 14 and not outcome.partial
    return output


# --- the offline CLI run ---------------------------------------------------------------------------


def test_offline_eval_writes_one_record_per_question_and_one_summary(offline_run):
    records = read_eval_records(offline_run)
    kinds = Counter(r["type"] for r in records)
    assert kinds == {HEADER_TYPE: 1, "trajectory": 14, "summary": 1}
    assert records[0]["type"] == HEADER_TYPE and records[-1]["type"] == "summary"
    assert [r["id"] for r in trajectories(offline_run)] == [e.id for e in DEV_EXAMPLES]  # dataset order
    assert sorted(p.name for p in offline_run.parent.iterdir()) == [offline_run.name]  # its lock file is gone
    for record in trajectories(offline_run):
        for key in ("id", "question", "answers", "data_source", "turns", "searches", "final_text",
                    "termination", "reward", "exact_match", "valid_format", "search_calls", "assistant_turns"):
            assert key in record, key
        assert record["termination"] in {"answer", "no_answer", "invalid"}
        assert record["valid_format"] == (record["termination"] == "answer")  # only an answer can be scored
    summary = load_summary(offline_run)
    assert summary["partial"] is False and summary["evaluated_examples"] == 14
    assert summary["questions_planned"] == 14 and summary["questions_missing"] == 0
    metrics = summary["metrics"]
    for key in ("em/macro", "em/micro", "em/macro_ci95_low", "em/macro_ci95_high", "em/micro_ci95_low",
                "em/micro_ci95_high", "format/rate", "rollout/search_calls", "rollout/turns",
                "search/requests", "search/success_rate"):
        assert key in metrics, key
    assert metrics["em/macro_ci95_low"] <= metrics["em/macro"] <= metrics["em/macro_ci95_high"]
    assert metrics["search/requests"] == sum(r["search_calls"] for r in trajectories(offline_run)) > 0


def test_summary_metrics_equal_what_the_records_say(offline_run):
    metrics = load_summary(offline_run)["metrics"]
    by_source = defaultdict(list)
    for record in trajectories(offline_run):
        by_source[record["data_source"]].append(record)
    assert len(by_source) == 7
    for source, records in by_source.items():
        assert metrics[f"em/{source}"] == pytest.approx(sum(r["exact_match"] for r in records) / len(records))
        assert metrics[f"format/{source}"] == pytest.approx(sum(r["valid_format"] for r in records) / len(records))
        assert metrics[f"questions/{source}"] == len(records)
    all_records = trajectories(offline_run)
    assert metrics["em/micro"] == pytest.approx(sum(r["exact_match"] for r in all_records) / 14)
    assert metrics["em/macro"] == pytest.approx(sum(metrics[f"em/{s}"] for s in by_source) / 7)
    assert 0 < metrics["em/micro"] < 1  # the scripted policy is right on some questions only


def test_transcripts_hold_the_queries_and_observations(offline_run):
    searched = [r for r in trajectories(offline_run) if r["searches"]]
    assert searched
    for record in searched:
        assert record["search_calls"] == len(record["searches"])
        assert len(record["turns"]) == record["assistant_turns"] >= len(record["searches"]) + 1
        for turn, search in zip(record["turns"], record["searches"]):
            assert search["query"] and search["query"] in turn["text"]
            assert search["ok"] and search["observation"].strip()
        assert record["final_text"] == record["turns"][-1]["text"]


def test_summary_records_the_exact_configuration_and_no_secret(offline_run):
    config = load_summary(offline_run)["config"]
    for field in COMPARABLE_CONFIG_FIELDS:
        assert field in config, field
    assert config["dataset_sha256"] == file_sha256(DEV)
    assert config["search_backend"] == "deepseek" and config["search_concurrency"] == 16
    assert config["search_timeout"] == 60.0 and config["search_cassette"] == "cassettes/deepseek/offline.yaml"
    assert config["sampling"] == {"temperature": 0.0, "top_p": 1.0, "seed": 42, "max_tokens": 1024}
    assert config["rollout"]["group_size"] == 1
    assert config["sampling_backend"] == "offline-scripted" and config["model_path"] is None
    assert config["code_version"]["searchr1"]
    assert read_eval_records(offline_run)[0]["config"] == config
    assert SECRET not in offline_run.read_text()


def test_two_offline_runs_give_identical_records(offline_run, tmp_path):
    again = tmp_path / "again.jsonl"
    assert cli("--output", str(again)).exit_code == 0
    assert without_timing(trajectories(again)) == without_timing(trajectories(offline_run))
    assert (without_timing_metrics(load_summary(again)["metrics"])
            == without_timing_metrics(load_summary(offline_run)["metrics"]))


def test_limit_picks_questions_spread_across_sources(tmp_path):
    output = tmp_path / "limit.jsonl"
    result = cli("--limit", "7", "--output", str(output))
    assert result.exit_code == 0, result.output
    records = trajectories(output)
    assert len(records) == 7
    assert Counter(r["data_source"] for r in records) == {s: 1 for s in {e.data_source for e in DEV_EXAMPLES}}
    summary = load_summary(output)
    assert summary["questions_planned"] == 7 and summary["config"]["limit"] == 7 and not summary["partial"]


def test_plot_eval_draws_two_offline_evaluations(offline_run, tmp_path):
    other = tmp_path / "other.jsonl"
    assert cli("--limit", "7", "--output", str(other)).exit_code == 0
    png = tmp_path / "eval.png"
    result = CliRunner().invoke(main, ["plot", "eval", str(offline_run), str(other), "-o", str(png)])
    assert result.exit_code == 0, result.output
    assert png.read_bytes().startswith(b"\x89PNG")


# --- resuming ------------------------------------------------------------------------------------


def test_interrupted_eval_keeps_records_and_a_partial_summary_then_resumes(sampler, tokenizer, baseline, tmp_path):
    output = tmp_path / "eval.jsonl"
    with pytest.raises(KeyboardInterrupt):
        run_eval(output, sampler, tokenizer, progress=InterruptAfter(5))
    kept = trajectories(output)
    assert len(kept) == 5
    summary = load_summary(output)
    assert summary["partial"] is True and summary["evaluated_examples"] == 5
    assert summary["questions_missing"] == 9
    assert [r["type"] for r in read_eval_records(output)].count("summary") == 1

    outcome = run_eval(output, sampler, tokenizer)
    assert (outcome.skipped, outcome.evaluated) == (5, 9)
    assert without_timing(trajectories(output)) == without_timing(trajectories(baseline))
    final = load_summary(output)
    assert final["partial"] is False and quality(final) == quality(load_summary(baseline))
    assert [r["type"] for r in read_eval_records(output)].count("summary") == 1
    assert [s["questions_evaluated"] for s in final["sessions"]] == [5, 9]


def test_a_crashing_sampler_leaves_a_partial_summary_and_the_rerun_completes(sampler, tokenizer, baseline, tmp_path):
    output = tmp_path / "eval.jsonl"
    crashing = FailingSampler(sampler, tokenizer, fail_after=12)
    with pytest.raises(RuntimeError, match="sampler crashed"):
        run_eval(output, crashing, tokenizer, config=RolloutConfig(group_size=1, temperature=0.0,
                                                                  sampling_concurrency=1))
    kept = trajectories(output)
    assert 0 < len(kept) < 14
    assert load_summary(output)["partial"] is True
    baseline_by_id = {r["id"]: r for r in without_timing(trajectories(baseline))}
    assert all(baseline_by_id[r["id"]] == r for r in without_timing(kept))

    run_eval(output, sampler, tokenizer)  # sampling_concurrency does not bind a resumed eval
    assert without_timing(trajectories(output)) == without_timing(trajectories(baseline))
    assert load_summary(output)["partial"] is False


def test_sampling_failures_are_not_counted_as_wrong_and_are_retried(sampler, tokenizer, baseline, tmp_path):
    output = tmp_path / "eval.jsonl"
    flaky = FailingSampler(sampler, tokenizer, error=ConnectionError("reset"), only=DEV_EXAMPLES[3].question)
    outcome = run_eval(output, flaky, tokenizer, config=RolloutConfig(group_size=1, temperature=0.0, sample_retries=0))
    assert outcome.failed == [DEV_EXAMPLES[3].id] and outcome.evaluated == 13
    summary = load_summary(output)
    assert summary["partial"] is True and summary["failed_questions"] == [DEV_EXAMPLES[3].id]
    assert DEV_EXAMPLES[3].id not in {r["id"] for r in trajectories(output)}

    outcome = run_eval(output, sampler, tokenizer)
    assert (outcome.skipped, outcome.evaluated) == (13, 1)
    assert without_timing(trajectories(output)) == without_timing(trajectories(baseline))
    assert load_summary(output)["partial"] is False


def test_a_limited_eval_extends_to_the_full_one_with_the_same_records(sampler, tokenizer, baseline, tmp_path):
    output = tmp_path / "eval.jsonl"
    assert run_eval(output, sampler, tokenizer, limit=7).evaluated == 7
    assert run_eval(output, sampler, tokenizer).evaluated == 7
    assert without_timing(trajectories(output)) == without_timing(trajectories(baseline))


def test_seeds_differ_per_question_and_do_not_depend_on_limit_or_sessions(sampler, tokenizer, tmp_path):
    whole = SeedRecorder(sampler, tokenizer)
    run_eval(tmp_path / "whole.jsonl", whole, tokenizer)
    first_turn = [seeds[0] for seeds in whole.seeds.values()]
    assert len(whole.seeds) == 14 and len(set(first_turn)) == 14
    assert len({s for seeds in whole.seeds.values() for s in seeds}) == sum(map(len, whole.seeds.values()))

    pieces = SeedRecorder(sampler, tokenizer)
    run_eval(tmp_path / "pieces.jsonl", pieces, tokenizer, limit=5)
    run_eval(tmp_path / "pieces.jsonl", pieces, tokenizer)
    assert pieces.seeds == whole.seeds


def test_a_torn_last_line_is_dropped_on_resume(sampler, tokenizer, baseline, tmp_path):
    output = tmp_path / "eval.jsonl"
    lines = baseline.read_text().splitlines(keepends=True)
    output.write_text("".join(lines[:4]) + lines[4][:40])  # header, 3 records, half a record
    outcome = run_eval(output, sampler, tokenizer)
    assert outcome.skipped == 3 and any("incomplete last line" in n for n in outcome.notes)
    assert without_timing(trajectories(output)) == without_timing(trajectories(baseline))


def test_resuming_with_another_configuration_is_refused_unless_overwrite(offline_run, tmp_path):
    output = tmp_path / "eval.jsonl"
    output.write_bytes(offline_run.read_bytes())
    result = cli("--output", str(output), "--temperature", "0.7")
    assert result.exit_code == 1
    assert "another configuration" in result.output and "temperature: 0.0 -> 0.7" in result.output
    assert "Traceback" not in result.output and output.read_bytes() == offline_run.read_bytes()

    result = cli("--output", str(output), "--temperature", "0.7", "--overwrite")
    assert result.exit_code == 0, result.output
    assert load_summary(output)["config"]["sampling"]["temperature"] == 0.7
    assert len(load_summary(output)["sessions"]) == 1


def test_records_without_a_configuration_are_not_resumed(sampler, tokenizer, baseline, tmp_path):
    output = tmp_path / "eval.jsonl"
    output.write_text("".join(baseline.read_text().splitlines(keepends=True)[1:4]))  # records only
    with pytest.raises(EvalResumeError, match="no configuration"):
        run_eval(output, sampler, tokenizer)


def test_rerunning_a_finished_eval_rewrites_one_summary(offline_run, tmp_path):
    output = tmp_path / "eval.jsonl"
    output.write_bytes(offline_run.read_bytes())
    result = cli("--output", str(output))
    assert result.exit_code == 0 and "0 questions evaluated, 14 already" in result.output
    assert without_timing(trajectories(output)) == without_timing(trajectories(offline_run))
    assert [r["type"] for r in read_eval_records(output)].count("summary") == 1
    assert load_summary(output)["metrics"] == load_summary(offline_run)["metrics"]


def test_judging_a_finished_eval_counts_the_questions_it_judged(offline_run, tmp_path):
    output = tmp_path / "eval.jsonl"
    output.write_bytes(offline_run.read_bytes())
    judged = ("--output", str(output), "--judge", "twin", "--judge-cache", str(tmp_path / "judge.jsonl"))
    result = cli(*judged)
    assert result.exit_code == 0, result.output
    assert "0 questions evaluated, 14 judged, 14 already in" in result.output
    assert all("judge" in r for r in trajectories(output))
    again = cli(*judged)  # every record holds this judge's judgement already
    assert again.exit_code == 0 and "0 questions evaluated, 0 judged, 14 already in" in again.output


# --- errors ----------------------------------------------------------------------------------------


def test_errors_are_one_clear_line(tmp_path, monkeypatch):
    missing = tmp_path / "nope.jsonl"
    result = cli("--data", str(missing))
    assert result.exit_code == 1 and str(missing) in result.output and "Traceback" not in result.output

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "question": "q", "answers": ["x"], "data_source": "nq"}\n{"id": "b"}\n')
    result = cli("--data", str(bad))
    assert result.exit_code == 1 and f"{bad}:2" in result.output

    output = tmp_path / "miss.jsonl"
    result = cli("--cassette", "cassettes/deepseek/demo.yaml", "--output", str(output))
    assert result.exit_code == 1 and "no recorded response for query" in result.output
    assert "Traceback" not in result.output

    monkeypatch.delenv("PYTRIO_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    result = CliRunner().invoke(main, ["eval", "--quiet", "--backend", "wikipedia", "--data", str(DEV),
                                       "--output", str(tmp_path / "l.jsonl")])  # wikipedia needs no search key
    assert result.exit_code == 1 and "PYTRIO_API_KEY" in result.output


def test_an_offline_checkpoint_needs_its_store(tmp_path):
    result = cli("--model-path", "trio://fake/run-0001/sampler_weights/final", "--output", str(tmp_path / "x.jsonl"))
    assert result.exit_code == 1 and "--offline-home" in result.output and "Traceback" not in result.output


# --- pure helpers -----------------------------------------------------------------------------------


def test_plan_questions_keeps_dataset_positions_and_refuses_duplicate_ids():
    planned = plan_questions(DEV_EXAMPLES, 3)
    assert [DEV_EXAMPLES[i] for i, _ in planned] == [e for _, e in planned]
    assert len({e.data_source for _, e in planned}) == 3
    twice = [*DEV_EXAMPLES[:2], replace(DEV_EXAMPLES[0], question="another")]
    with pytest.raises(DataError, match="appears twice"):
        plan_questions(twice, None)
    assert plan_questions([SearchExample("a", "q", ("x",), "nq")], None) == [(0, SearchExample("a", "q", ("x",), "nq"))]


def test_search_metrics_merge_over_sessions():
    merged = merge_search_metrics([
        {"search/requests": 3.0, "search/success_rate": 1.0, "search/input_tokens": 30.0},
        {"search/requests": 1.0, "search/success_rate": 0.0, "search/input_tokens": 5.0},
        {},
    ])
    assert merged == {"search/requests": 4.0, "search/success_rate": 0.75, "search/input_tokens": 35.0}
    assert merge_search_metrics([{"search/requests": 0.0, "search/latency": 0.0}])["search/latency"] == 0.0


def test_a_missing_search_key_is_named_before_pytrio_is_contacted(tmp_path, monkeypatch):
    import pytrio

    from searchr1.cli import main as cli_main

    contacted = []
    monkeypatch.setattr(pytrio, "ServiceClient", lambda *a, **k: contacted.append(1))
    monkeypatch.setenv("PYTRIO_API_KEY", "pytrio-placeholder")
    monkeypatch.delenv("ZHIHU_SEARCH_KEYS", raising=False)
    monkeypatch.chdir(tmp_path)  # no ./.env here
    data = tmp_path / "dev.jsonl"
    data.write_text('{"id": "1", "question": "q?", "answers": ["a"], "data_source": "nq"}\n')
    result = CliRunner().invoke(cli_main, ["eval", "--quiet", "--backend", "zhihu", "--data", str(data),
                                           "--output", str(tmp_path / "out.jsonl")])
    assert result.exit_code == 1 and "ZHIHU_SEARCH_KEYS" in result.output
    assert contacted == [] and not (tmp_path / "out.jsonl").exists()
