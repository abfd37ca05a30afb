"""Smoke tests of ``python cli.py bench``: the report's structure and the fairness of its
baselines. No timing is asserted here (timings live in the bench, never in tests)."""

from __future__ import annotations

import asyncio
import json
import os
import random

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from searchr1.bench.lockstep import lockstep_rollout_async
from searchr1.bench.packing import _stub, lower_bounds
from searchr1.bench.workload import LatencyModel, build_workload, fingerprint, quick_spec
from searchr1.cli import main
from searchr1.training.packing import MAX_DATUM_TOKENS, pack_micro_batches
from searchr1.core.rollout import RolloutConfig, rollout_batch_async
from searchr1.search.tool import with_search
from searchr1.twin.scripted_search import ScriptedSearch
from searchr1.core.types import SearchItem, SearchResult
from searchr1.wiring.services import scripted_sampling_client
from searchr1.twin import Latencies
from searchr1.twin.scenario import parse_scenario

FIGURES = {"scheduling", "protocol_cpu", "packing", "search_calls", "step_overhead", "off_policy_throughput",
           "learning_speed"}


def test_quick_bench_writes_one_entry_per_figure_with_value_target_and_met(tmp_path, tokenizer):
    output = tmp_path / "bench.json"
    result = CliRunner().invoke(main, ["bench", "--quick", "--output", str(output)])
    assert result.exit_code == 0, result.output
    report = json.loads(output.read_text())
    assert set(report["figures"]) == FIGURES
    assert sorted(f["figure"] for f in report["figures"].values()) == [1, 2, 3, 4, 5, 6, 7]
    assert report["quick"] is True and isinstance(report["all_met"], bool)
    for figure in report["figures"].values():
        assert {"value", "target", "met", "measures"} <= set(figure)
        assert isinstance(figure["value"], float) and figure["target"] is not None
        assert isinstance(figure["met"], bool)
        for measure in figure["measures"].values():
            assert {"value", "target", "met"} <= set(measure)
            assert (measure["met"] is None) == (measure["target"] is None)
    assert report["all_met"] == all(f["met"] for f in report["figures"].values())
    # Structural facts, not timings: both schedulers agreed, and ours renders twice per tool turn.
    assert report["figures"]["scheduling"]["details"]["identical_trajectories"] is True
    protocol = report["figures"]["protocol_cpu"]["measures"]
    assert protocol["renders_per_tool_turn"]["value"] == 2.0
    assert protocol["seed_renders_per_tool_turn"]["value"] == 12.0  # 4 renders x 3 items
    search = report["figures"]["search_calls"]
    assert search["details"]["requests_with"] == search["details"]["distinct_queries"]
    assert "Figure / measure" in result.output


def test_only_runs_the_named_figures_and_rejects_unknown_ones(tmp_path):
    output = tmp_path / "bench.json"
    result = CliRunner().invoke(main, ["bench", "--quick", "--only", "3", "--output", str(output)])
    assert result.exit_code == 0, result.output
    assert set(json.loads(output.read_text())["figures"]) == {"packing"}
    result = CliRunner().invoke(main, ["bench", "--only", "99", "--output", str(output)])
    assert result.exit_code == 2 and "--only" in result.output


def test_figure_9_without_its_set_up_is_one_line_before_any_figure_runs(tmp_path, monkeypatch):
    from searchr1.bench import lucene, runner

    monkeypatch.setattr(lucene, "bench_home", lambda: tmp_path / "no-lucene-here")
    monkeypatch.setattr(runner, "run_figures", lambda *a, **k: pytest.fail("a figure ran before the check"))
    output = tmp_path / "bench.json"
    result = CliRunner().invoke(main, ["bench", "--only", "3,9", "--output", str(output)])
    assert result.exit_code == 1 and not output.exists()
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "python -m searchr1.bench.lucene setup" in lines[0] and "Traceback" not in result.output


def test_a_failing_figure_is_one_line_naming_it_and_the_finished_figures_are_kept(tmp_path, monkeypatch):
    from searchr1.bench import runner

    real = runner._builders()

    def builders():
        def broken(*args, **kwargs):
            raise RuntimeError("retriever serve did not start: address in use\nsecond line")
        return {**real, 4: broken}

    monkeypatch.setattr(runner, "_builders", builders)
    output = tmp_path / "bench.json"
    result = CliRunner().invoke(main, ["bench", "--quick", "--only", "3,4", "--output", str(output)])
    assert result.exit_code == 1, result.output
    last = result.output.strip().splitlines()[-1]
    assert "figure 4 failed: retriever serve did not start: address in use;" in last and str(output) in last
    assert "second line" not in result.output and "Traceback" not in result.output
    assert set(json.loads(output.read_text())["figures"]) == {"packing"}


CALL = "<tool_call>\n<function=search>\n<parameter=query>\n{}\n</parameter>\n</function>\n</tool_call>"


def _edge_case_step():
    """One group per ending: answer, invalid call, search budget, failed search, truncation."""
    long_item = SearchItem("Long", " ".join(f"word{i}" for i in range(400)), "Wikipedia", "https://w/Long")
    results = {
        "alpha": SearchResult(True, (SearchItem("Alpha", "alpha " * 30, "Wikipedia", "https://w/A"),) * 3),
        "beta": SearchResult(True, ()),
        "gamma": SearchResult(False, (), status=503, error="HTTP 503"),
        "long": SearchResult(True, (long_item,)),
    }
    questions = [
        {"id": "a", "question": "Question a?", "answers": ["France"], "samples": [
            [CALL.format("alpha"), "Answer: France"], ["Answer: Spain"],
            ['<tool_call>{"name": "search"}</tool_call>'], [f"Plan.\n\n{CALL.format('long')}", "Answer: France"]]},
        {"id": "b", "question": "Question b?", "answers": ["Paris"], "samples": [
            [CALL.format("alpha"), f"Again.\n\n{CALL.format('beta')}", f"More.\n\n{CALL.format('alpha')}", "Answer: Paris"],
            [CALL.format("gamma"), "Answer: Paris"], [f"Hm.\n\n{CALL.format('beta')}", "Answer: Lyon"],
            ["Answer: Paris"]]},
    ]
    config = RolloutConfig(group_size=4, max_search_calls=2, max_tool_response_tokens=200,
                           sample_retry_backoff=0.0)
    return parse_scenario({"questions": questions}), results, config


def both_schedulers(tokenizer, scenario, results, config, *, sample_jitter, search_latency, search_concurrency):
    """Our engine and lock-step rounds on the same step, sampling from a twin whose answers
    take a random few milliseconds (so completions arrive in a different order each run)."""
    with scripted_sampling_client(scenario, tokenizer, latencies=Latencies(sample_jitter=sample_jitter)) as sampler:
        out = []
        for kind in ("ours", "lockstep"):
            search = ScriptedSearch(results, latency=search_latency, concurrency=search_concurrency)
            if kind == "ours":
                step = rollout_batch_async(sampler, tokenizer, with_search(search), scenario.examples, config)
            else:
                step = lockstep_rollout_async(sampler, tokenizer, search, scenario.examples, config,
                                              search_concurrency=search_concurrency)
            out.append(asyncio.run(step))
    return out


def test_lockstep_and_our_engine_produce_identical_trajectories(tokenizer):
    scenario, results, config = _edge_case_step()
    rng = random.Random(7)
    ours, lock = both_schedulers(tokenizer, scenario, results, config, sample_jitter=0.01,
                                 search_latency=lambda query: rng.uniform(0.0, 0.01), search_concurrency=2)
    assert fingerprint(ours) == fingerprint(lock)
    endings = {t.termination for t in ours}
    assert {"answer", "invalid", "search_budget"} <= endings
    assert any(s.truncated for t in ours for s in t.calls) and any(t.env_error for t in ours)


def test_the_generated_workload_rolls_out_the_same_under_both_schedulers(tokenizer):
    workload = build_workload(quick_spec(), seed=3)
    model = LatencyModel(scale=0.002, seed=3)
    ours, lock = both_schedulers(tokenizer, workload.scenario, workload.results, workload.config,
                                 sample_jitter=0.005, search_latency=model.search_latency(), search_concurrency=16)
    assert fingerprint(ours) == fingerprint(lock)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, MAX_DATUM_TOKENS), min_size=1, max_size=120))
def test_the_packing_lower_bound_never_exceeds_what_the_packer_achieves(lengths):
    packed = pack_micro_batches([_stub(n, i) for i, n in enumerate(lengths)])
    assert lower_bounds(lengths)["value"] <= len(packed)


def test_lucene_overlap_counts_shared_top3_documents_over_queries_lucene_answers_fully():
    from searchr1.bench.lucene import top3_overlap

    ours = [["a", "b", "c"], ["a", "b", "c"], ["x"], ["a", "b", "c"]]
    lucene = [["c", "b", "a"], ["a", "y", "z"], ["x", "y", "z"], ["a"]]  # the last has < 3 hits: not compared
    assert top3_overlap(ours, lucene) == (pytest.approx((1 + 1 / 3 + 1 / 3) / 3), 3)


def test_the_minutes_long_figures_run_only_when_named():
    from searchr1.bench.runner import parse_only

    assert parse_only(None) == [1, 2, 3, 4, 5, 6, 7]
    assert parse_only("8,9") == [8, 9]


def quick_figure(tmp_path, number: int, name: str) -> dict:
    """``bench --quick --only NUMBER`` through the CLI, and the report's entry ``name``."""
    output = tmp_path / "bench.json"
    result = CliRunner().invoke(main, ["bench", "--quick", "--only", str(number), "--output", str(output)])
    assert result.exit_code == 0, result.output
    return json.loads(output.read_text())["figures"][name]


def test_the_algorithm_figure_reports_steps_to_reward_for_every_option_and_the_kl_cost(tmp_path, tokenizer):
    figure = quick_figure(tmp_path, 10, "algorithms")
    assert figure["figure"] == 10 and figure["target"] is not None and isinstance(figure["met"], bool)
    assert {f"steps_{name}" for name in ("defaults", "ppo", "cispo", "dro", "kl", "dynamic")} <= set(figure["measures"])
    substeps = ("substeps_is", "substeps_ppo", "substeps_cispo", "one_step_is")
    kinds = ("reached", "steps", "final_reward")
    assert {f"{kind}_{name}" for kind in kinds for name in substeps} <= set(figure["measures"])
    seeds = figure["details"]["substep_seeds"]  # one run per training seed (--quick: one)
    assert all(0 <= figure["measures"][f"reached_{name}"]["value"] <= len(seeds) for name in substeps)
    assert all(len(figure["details"]["substep_reward_curves"][name]) == len(seeds) for name in substeps)
    assert {"clipped_substeps_ppo", "clipped_substeps_cispo"} <= set(figure["measures"])
    assert "clipped_substeps_is" not in figure["measures"]  # importance sampling clips nothing
    details = figure["details"]
    # one prompt-logprob request per datum: more requests with the penalty, and KL 0 on the base weights
    assert details["requests_per_step"]["on"] > details["requests_per_step"]["off"]
    assert details["kl_policy_base"][0] == 0.0


@pytest.mark.slow
def test_the_page_figure_trains_each_seed_with_one_tool_and_with_two(tmp_path, tokenizer):
    figure = quick_figure(tmp_path, 12, "page_world")
    assert figure["figure"] == 12 and figure["target"] is not None and isinstance(figure["met"], bool)
    details = figure["details"]
    curves = details["reward_curves"]
    assert set(curves) == {"search,open_page", "search"}
    assert all(len(runs) == len(details["seeds"]) for runs in curves.values())
    assert all(len(curve) == details["steps_run"] for runs in curves.values() for curve in runs)
    # open_page calls a trajectory stay within the tool's declared budget of 4; search alone never reaches the target
    assert all(0.0 <= calls <= 4.0 for run in details["open_page_calls"] for calls in run)
    assert figure["measures"]["one_tool_reaches_target"]["value"] == 0.0


def test_the_contention_figure_measures_the_same_requests_idle_and_busy_and_holds_no_target(tmp_path, tokenizer):
    figure = quick_figure(tmp_path, 11, "client_contention")
    assert figure["figure"] == 11 and figure["target"] is None
    measures = figure["measures"]
    idle = measures["client_ms_per_request_main_idle"]["value"]
    busy = measures["client_ms_per_request_main_busy"]["value"]
    assert idle > 0 and busy > 0
    # one repetition: the ratio is exactly the busy run over the idle run
    assert measures["client_busy_over_idle"]["value"] == pytest.approx(busy / idle)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="pinning needs Linux and two CPUs")
def test_the_contention_figure_gives_the_process_its_cpus_back_after_the_pinned_run(tokenizer):
    from searchr1.bench.client_contention import client_contention_figure

    before = os.sched_getaffinity(0)
    figure = client_contention_figure(tokenizer, requests=8, repetitions=1)
    assert "client_ms_per_request_main_busy_pinned" in {m.key for m in figure.measures}
    assert os.sched_getaffinity(0) == before
    assert all(os.sched_getaffinity(int(tid)) == before for tid in os.listdir("/proc/self/task"))
