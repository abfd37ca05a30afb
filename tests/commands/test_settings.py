"""Every setting is declared once (searchr1.core.settings): the dataclass enforces its rule, the
flags are made from the declaration, presets and config.json go through the same rules."""

from __future__ import annotations

import dataclasses
import json

import click
import pytest
from click.testing import CliRunner

from searchr1.cli import main
from searchr1.commands.settings_options import config_file_option, setting_options, setting_params, take_settings
from searchr1.core.rollout import RolloutConfig
from searchr1.search.options import SearchOptions
from searchr1.core.settings import SettingError, flag_of, settings_of
from searchr1.training.config import TrainConfig

REQUIRED = {TrainConfig: {"max_steps": 1, "data": "d.jsonl"}, SearchOptions: {"backend": "wikipedia"},
            RolloutConfig: {}}


def broken_values(rule):
    """Values just outside each bound (and a non-choice) of one declared rule."""
    values = []
    if rule.at_least is not None:
        values.append(rule.at_least - (1 if float(rule.at_least).is_integer() else 0.5))
    if rule.above is not None:
        values.append(rule.above)
    if rule.at_most is not None:
        values.append(rule.at_most + 1)
    if rule.below is not None:
        values.append(rule.below)
    if rule.choices is not None:
        values.append("no-such-choice")
    return values


CASES = [(cls, field.name, value) for cls in REQUIRED for field, rule in settings_of(cls)
         for value in broken_values(rule)]


@pytest.mark.parametrize(("cls", "name", "value"), CASES, ids=[f"{c.__name__}.{n}={v}" for c, n, v in CASES])
def test_every_declared_rule_is_enforced_by_the_dataclass_with_a_message_naming_the_flag(cls, name, value):
    field = next(f for f in dataclasses.fields(cls) if f.name == name)
    value = int(value) if field.type in ("int", "int | None") and isinstance(value, float) else value
    with pytest.raises(SettingError) as info:
        cls(**{**REQUIRED[cls], name: value})
    assert str(info.value).startswith(flag_of(field) + " ")
    assert repr(value) in str(info.value) or f"{value:g}" in str(info.value)


def test_rules_are_not_vacuous():
    assert len(CASES) >= 25


def test_a_rollout_config_refuses_what_only_click_refused_before():
    with pytest.raises(SettingError, match="--group-size must be >= 1, got 0"):
        RolloutConfig(group_size=0)
    with pytest.raises(SettingError, match="--tool-overflow must be one of truncate, end, got 'bogus'"):
        RolloutConfig(tool_overflow="bogus")


def test_training_needs_groups_of_two_and_names_the_flag():
    with pytest.raises(SettingError, match="--group-size .*a group of one always has advantage 0"):
        TrainConfig(max_steps=1, data="d", rollout=RolloutConfig(group_size=1))


def test_a_bad_run_name_names_the_flag_and_the_rule():
    with pytest.raises(SettingError, match=r"--run-name '\.\./x' cannot prefix PyTRIO checkpoint names"):
        TrainConfig(max_steps=1, data="d", run_name="../x")


def test_config_json_round_trips_through_the_declarations():
    config = TrainConfig(max_steps=7, data="d.jsonl", learning_rate=1e-3, advantage_mode="zscore",
                         rollout=RolloutConfig(group_size=4, tool_overflow="end", top_p=0.5))
    assert TrainConfig.from_json(json.loads(json.dumps(config.to_json()))) == config
    record = config.to_json()
    record["rollout"]["group_size"] = 0
    with pytest.raises(SettingError, match="--group-size"):
        TrainConfig.from_json(record)


def command_over(cls, **defaults):
    seen = {}

    @click.command()
    @config_file_option()
    @setting_options(cls, defaults=defaults)
    def command(config, **kwargs):
        seen.update(take_settings(cls, kwargs))

    return command, seen


def test_the_flags_default_to_the_declared_defaults():
    command, seen = command_over(RolloutConfig)
    assert CliRunner().invoke(command, []).exit_code == 0
    assert RolloutConfig(**seen) == RolloutConfig()


def test_every_flag_is_checked_by_the_dataclass_rule():
    command, _ = command_over(RolloutConfig)
    result = CliRunner().invoke(command, ["--max-search-calls", "-1"])
    assert result.exit_code == 2 and "must be >= 0, got -1" in result.output


def test_the_help_shows_each_range():
    text = CliRunner().invoke(main, ["train", "--help"]).output
    for flag in ("--group-size", "--max-search-calls", "--top-p", "--lora-rank"):
        assert flag in text
    assert "[0<=x]" in text and "[0<x<=1]" in text and "[4<=x<=64]" in text


def test_a_preset_sets_values_and_the_command_line_wins(tmp_path):
    preset = tmp_path / "p.toml"
    preset.write_text('group_size = 3\n"max-search-calls" = 2\ntool_overflow = "end"\n')
    command, seen = command_over(RolloutConfig)
    assert CliRunner().invoke(command, ["--config", str(preset), "--group-size", "5"]).exit_code == 0
    assert (seen["group_size"], seen["max_search_calls"], seen["tool_overflow"]) == (5, 2, "end")


@pytest.mark.parametrize(("text", "expected"), [
    ("group_size = 2\nbogus = 1\n", "p.toml, line 2: unknown setting 'bogus'"),
    ("\ngroup_size = 0\n", "p.toml, line 2: group_size must be >= 1, got 0"),
    ("tool_overflow = 'sideways'\n", "p.toml, line 1: tool_overflow 'sideways' is not one of"),
    ("group_size = \n", "p.toml is not valid TOML"),
])
def test_a_bad_preset_names_the_file_the_line_the_key_and_the_rule(tmp_path, text, expected):
    preset = tmp_path / "p.toml"
    preset.write_text(text)
    command, _ = command_over(RolloutConfig)
    result = CliRunner().invoke(command, ["--config", str(preset)])
    assert result.exit_code == 2
    assert expected in " ".join(result.output.split()), result.output


def test_old_flag_names_keep_working():
    command, seen = command_over(SearchOptions, backend="deepseek")
    assert CliRunner().invoke(command, ["--backend", "zhihu"]).exit_code == 0 and seen["backend"] == "zhihu"
    command, seen = command_over(TrainConfig, max_steps=None, data=None)
    assert CliRunner().invoke(command, ["--advantage", "zscore"]).exit_code == 0
    assert seen["advantage_mode"] == "zscore"


def test_train_records_the_preset_merged_with_the_flags(tmp_path, tokenizer):
    preset = tmp_path / "p.toml"
    preset.write_text("group_size = 4\nquestions_per_batch = 2\nadvantage = 'zscore'\nmax_steps = 1\n")
    run = tmp_path / "run"
    result = CliRunner().invoke(main, ["train", "--offline", "--offline-policy", "scripted", "--quiet",
                                       "--config", str(preset), "--questions-per-batch", "1", "--run-dir", str(run)])
    assert result.exit_code == 0, result.output
    recorded = json.loads((run / "config.json").read_text())
    assert recorded["rollout"]["group_size"] == 4 and recorded["advantage_mode"] == "zscore"
    assert recorded["questions_per_batch"] == 1 and recorded["max_steps"] == 1


