"""Golden trajectories: every scenario replayed now equals its frozen file, exactly."""

from __future__ import annotations

import json
from dataclasses import fields

import numpy as np
import pytest
from click.testing import CliRunner

from searchr1.cli import main
from searchr1.tools.golden import differences, generate, golden_path, scenario_paths
from searchr1.core.rollout import RolloutConfig
from searchr1.core.types import Termination

SCENARIOS = scenario_paths()


def test_the_scenarios_cover_every_listed_behaviour_and_all_four_backends():
    """Search-R1's behaviours on each search backend, and the declared tools': two tools, parallel
    calls, an unknown tool, a bad parameter and a page longer than the budget."""
    names = {p.stem for p in SCENARIOS}
    assert {"little_prince_two_hop", "answer_without_search", "invalid_call", "json_call", "search_budget",
            "search_error", "no_results", "tool_overflow", "max_tokens_cut", "all_equal_group",
            "mixed_group", "two_tools", "parallel_calls", "unknown_tool", "bad_parameter", "long_page"} <= names
    backends = {json.loads(p.read_text())["backend"] for p in SCENARIOS}
    assert backends == {"wikipedia", "zhihu", "deepseek", "retriever"}


@pytest.mark.slow
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.stem)
def test_replaying_a_scenario_reproduces_its_golden_file(tokenizer, scenario):
    golden = json.loads(golden_path(scenario).read_text("utf-8"))
    found = differences(golden, generate(scenario, tokenizer))
    assert not found, "golden file differs; inspect and run `python cli.py golden --update`:\n" + "\n".join(found)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.stem)
def test_golden_datums_keep_the_shift_and_the_action_mask(scenario):
    golden = json.loads(golden_path(scenario).read_text("utf-8"))
    by_key = {(t["question_index"], t["group_index"]): t for t in golden["trajectories"]}
    for datum in golden["datums"]:
        trajectory = by_key[(datum["question_index"], datum["group_index"])]
        full = datum["model_input"] + datum["target_tokens"][-1:]
        assert datum["model_input"][1:] == datum["target_tokens"][:-1]
        actions = [False] * len(full)
        for turn in trajectory["turns"]:
            start = len(turn["prompt_tokens"])
            assert full[start:start + len(turn["completion_tokens"])] == turn["completion_tokens"]
            for i in range(start, start + len(turn["completion_tokens"])):
                actions[i] = True
        for i, advantage in enumerate(datum["advantages"]):
            expected = float(np.float32(trajectory["advantage"])) if actions[i + 1] else 0.0  # sent as float32
            assert advantage == expected
    for trajectory in golden["trajectories"]:
        assert trajectory["termination"] in set(Termination)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.stem)
def test_a_golden_file_records_its_scenarios_overrides_not_the_whole_configuration(scenario):
    """A new rollout setting, with its default, then leaves every golden file as it is."""
    golden = json.loads(golden_path(scenario).read_text("utf-8"))
    assert golden["rollout"] == json.loads(scenario.read_text("utf-8")).get("rollout", {})
    assert set(golden["rollout"]) < {f.name for f in fields(RolloutConfig)}


def test_differences_names_the_changed_field():
    before = {"trajectories": [{"turns": [{"completion_tokens": [1, 2, 3]}]}]}
    after = {"trajectories": [{"turns": [{"completion_tokens": [1, 9, 3]}]}]}
    assert differences(before, after) == ["$.trajectories[0].turns[0].completion_tokens[1]: golden 2 != now 9"]


@pytest.mark.slow
def test_the_golden_command_reports_a_stale_file(tmp_path, monkeypatch):
    import searchr1.tools.golden as golden_module

    scenario = SCENARIOS[0]
    stale = json.loads(golden_path(scenario).read_text("utf-8"))
    stale["trajectories"][0]["reward"] = 123.0
    (tmp_path / scenario.name).write_text(json.dumps(stale))
    monkeypatch.setattr(golden_module, "GOLDEN_DIR", tmp_path)
    monkeypatch.setattr(golden_module, "golden_path", lambda p, directory=tmp_path: directory / p.name)
    result = CliRunner().invoke(main, ["golden", "--only", scenario.stem])
    assert result.exit_code == 1
    assert "trajectories[0].reward: golden 123.0" in result.output


@pytest.mark.slow
def test_the_golden_command_says_only_that_the_files_match_when_they_do(caplog):
    import logging

    caplog.set_level(logging.DEBUG, logger="searchr1.search")
    result = CliRunner().invoke(main, ["golden", "--only", "search_error"])  # a search fails on purpose
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "1 golden file matches"
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warned == []  # printed to stderr when no test captures it


@pytest.mark.slow
def test_offline_files_and_cassettes_are_up_to_date():
    result = CliRunner().invoke(main, ["offline-data", "--check"])
    assert result.exit_code == 0, result.output
