"""``train --config RUN`` reads a run's record (config.json) as the flags of a new run: each key
sets the flag its declaration makes, the command line beats it, and a bad record is one line
naming the file and the key (exit 2), never a traceback."""

from __future__ import annotations

import dataclasses
import json
import math
import typing

import click
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchr1.cli import main
from searchr1.commands.run_record import RUN_RECORD, record_warnings, with_unflagged
from searchr1.commands.settings_options import setting_params
from searchr1.commands.train import _health_rules, _search_record, train
from searchr1.core.rollout import RolloutConfig
from searchr1.core.settings import LARGEST, settings_of
from searchr1.health.rules import RULE_NAMES
from searchr1.run.algorithm import parse_loss_fn_config
from searchr1.search.options import SearchOptions
from searchr1.training.config import TrainConfig

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def base_record() -> dict:
    """A record as train writes one for an offline run (its search block included)."""
    config = TrainConfig(offline=True, offline_policy="learning", max_steps=2, data="train.jsonl",
                         search=_search_record(SearchOptions(backend="deepseek"), offline=True),
                         run_id="0123abcd", code_version="0.1.0", data_sha256="0" * 64)
    return json.loads(json.dumps(config.to_json()))


def parsed(path, *args: str) -> click.Context:
    """``train --config path args`` parsed, every flag's callback run, the command not invoked."""
    return train.make_context("train", ["--config", str(path), *args])


def value_strategy(annotation, rule):
    """Values a declared setting's flag takes, from its declaration (choices, type, bounds)."""
    if rule.choices is not None:
        return st.sampled_from(rule.choices)
    base = [t for t in typing.get_args(annotation) if t is not type(None)] or [annotation]
    low = rule.at_least if rule.at_least is not None else rule.above
    high = rule.at_most if rule.at_most is not None else rule.below
    low, high = -LARGEST if low is None else low, LARGEST if high is None else high
    if base[0] is bool:
        return st.booleans()
    if base[0] is int:
        return st.integers(math.ceil(low) + (rule.above is not None), math.floor(high) - (rule.below is not None))
    if base[0] is float:
        return st.floats(low, high, exclude_min=rule.above is not None, exclude_max=rule.below is not None)
    return None


def flag_settings(cls):
    """``(field, parameter, strategy)`` of each flag-backed setting of ``cls`` whose values can be
    drawn from its declaration alone (a free-text setting or one with its own check is left out)."""
    hints = typing.get_type_hints(cls)
    params = {field: param for param, field in setting_params(cls).items()}
    for field, rule in settings_of(cls):
        strategy = value_strategy(hints[field.name], rule)
        if field.name in params and strategy is not None and rule.check is None:
            yield field.name, params[field.name], strategy


TOP = list(flag_settings(TrainConfig))
ROLLOUT = list(flag_settings(RolloutConfig))
SECTIONS = {name: strategy for name, _, strategy in TOP} | {f"rollout.{name}": s for name, _, s in ROLLOUT}
PARAM_OF = {name: param for name, param, _ in TOP} | {f"rollout.{name}": param for name, param, _ in ROLLOUT}
HEALTH = st.dictionaries(st.sampled_from(RULE_NAMES), st.none() | st.floats(-1e6, 1e6, allow_nan=False), max_size=3)
LOSS_CONFIG = st.dictionaries(st.from_regex(r"[a-z][a-z_]{0,11}", fullmatch=True),
                              st.integers(-10**6, 10**6) | st.floats(-1e6, 1e6) | st.booleans(), max_size=3)


def test_the_drawn_settings_cover_the_run_and_the_rollout():
    assert {"advantage_mode", "learning_rate", "loss_fn", "kl_coef", "max_steps"} <= {n for n, _, _ in TOP}
    assert {"group_size", "max_search_calls", "temperature", "tool_overflow"} <= {n for n, _, _ in ROLLOUT}


def as_typed(value) -> str:
    return repr(value) if isinstance(value, float) else str(value)


@PROPERTY
@given(recorded=st.fixed_dictionaries({}, optional=SECTIONS), typed=st.fixed_dictionaries({}, optional=SECTIONS),
       health=HEALTH, loss_config=LOSS_CONFIG)
def test_a_record_sets_every_flag_to_its_recorded_value_and_the_command_line_wins(
        tmp_path, recorded, typed, health, loss_config):
    """Invariant: after ``--config RECORD``, each flag-backed setting of the record (a run's or a
    rollout's, named in config.json by its field, not its flag) is that flag's value, the
    ``NAME=VALUE`` flags parse back to the recorded objects, and a flag typed on the command line
    holds the typed value instead."""
    record = base_record()
    for key, value in recorded.items():
        scope, name = (record["rollout"], key[8:]) if key.startswith("rollout.") else (record, key)
        scope[name] = value
    record["rollout"]["seed"] = record["seed"]  # train records --seed in both places
    record["health_rules"], record["loss_fn_config"] = health, loss_config
    path = tmp_path / "config.json"
    path.write_text(json.dumps(record))
    typed = {key: value for key, value in typed.items() if not isinstance(value, bool)}  # no --no-x for each
    args = [arg for key, value in typed.items()
            for arg in (next(p for p in train.params if p.name == PARAM_OF[key]).opts[0], as_typed(value))]
    ctx = parsed(path, *args)
    for key, value in {**recorded, **typed}.items():
        assert ctx.params[PARAM_OF[key]] == value, key
    assert _health_rules(ctx.params["health_rules"]) == health
    assert parse_loss_fn_config(ctx.params["loss_fn_config"]) == loss_config
    assert ctx.params["offline"] is True and ctx.params["offline_policy"] == "learning"


def test_keys_are_found_through_the_declarations_not_their_spelling(tmp_path):
    """``advantage_mode`` sets ``--advantage``, ``search.options.backend`` sets
    ``--search-backend``, the rollout's ``tools`` list sets the comma-separated flag."""
    record = base_record()
    record["advantage_mode"] = "zscore"
    record["search"]["options"]["backend"] = "wikipedia"
    record["rollout"]["tools"] = ["search", "open_page"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(record))
    ctx = parsed(tmp_path)  # the run directory names its config.json
    assert ctx.params["advantage"] == "zscore" and ctx.params["search_backend"] == "wikipedia"
    assert ctx.params["tools"] == ("search", "open_page")
    assert ctx.meta[RUN_RECORD].path == path


def test_settings_no_flag_carries_and_facts_are_kept_apart_from_the_flags(tmp_path):
    record = base_record()
    record["rollout"]["system_prompt"] = "Answer in one word."
    record["max_micro_batch_items"] = 7
    path = tmp_path / "config.json"
    path.write_text(json.dumps(record))
    found = parsed(path).meta[RUN_RECORD]
    assert {(s.scope, s.name, s.value, s.overridden_by) for s in found.unflagged} >= {
        ("rollout", "system_prompt", "Answer in one word.", "system_prompt_file"),
        (None, "max_micro_batch_items", 7, None)}
    assert {"run_id", "data_sha256", "code_version"} <= set(found.facts)
    assert not {"run_id", "data_sha256", "code_version", "server_limits"} & set(found.flags)


def record_verdict(tmp_path, text: str) -> tuple[int, list[str], str]:
    path = tmp_path / "config.json"
    path.write_text(text)
    result = CliRunner().invoke(main, ["train", "--config", str(path), "--help"])
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, [line for line in result.output.splitlines() if line.startswith("Error")], result.output


def mutated(change) -> str:
    record = base_record()
    change(record)
    return json.dumps(record)


@pytest.mark.parametrize(("text", "says"), [
    ('{"max_steps": 2,', "invalid JSON (Expecting property name enclosed in double quotes at line 1, column 17)"),
    ("[1, 2]", "the top level must be an object"),
    (mutated(lambda r: r.update(bogus=1)), "unknown key 'bogus'"),
    (mutated(lambda r: r["rollout"].update(max_turns=3)), "unknown key 'rollout.max_turns'"),
    (mutated(lambda r: r["search"]["options"].update(colour="red")), "unknown key 'search.options.colour'"),
    (mutated(lambda r: r["rollout"].update(group_size="eight")), "rollout.group_size must be an integer, not a string"),
    (mutated(lambda r: r.update(learning_rate=[0.1])), "learning_rate must be a number, not an array"),
    (mutated(lambda r: r.update(dynamic_sampling=1)), "dynamic_sampling must be a boolean (true or false), not an "
                                                      "integer (1)"),
    (mutated(lambda r: r.update(advantage_mode="best")), "advantage_mode 'best' is not one of"),
    (mutated(lambda r: r.update(lora_rank=2)), "lora_rank must be >= 4, got 2"),
    (mutated(lambda r: r.update(health_rules=[1])), "health_rules must be an object of NAME: VALUE, not an array"),
    (mutated(lambda r: r.update(rollout=None)), "rollout must be an object, not null"),
    (mutated(lambda r: r.update(max_micro_batch_items="many")), "max_micro_batch_items cannot be a string"),
    (mutated(lambda r: r["rollout"].update(sample_retry_backoff=-1)), "rollout.sample_retry_backoff must be >= 0"),
    (mutated(lambda r: r["rollout"].update(seed=7)), "rollout.seed (7) and seed (42) are the same setting (--seed)"),
])
def test_a_bad_record_is_one_line_naming_the_file_and_the_key(tmp_path, text, says):
    code, errors, output = record_verdict(tmp_path, text)
    assert code == 2 and "Traceback" not in output
    assert len(errors) == 1, output
    assert errors[0].startswith(f"Error: Invalid value for --config: {tmp_path / 'config.json'}: {says}"), output


RECORD_KEYS = st.sampled_from(["max_steps", "learning_rate", "advantage_mode", "rollout", "search", "health_rules",
                               "loss_fn_config", "offline", "run_id", "segments", "seed", "tools", "x"])
JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False,
                    allow_infinity=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                    max_leaves=8)


@PROPERTY
@given(changes=st.dictionaries(RECORD_KEYS, JSON, max_size=3))
def test_any_record_is_taken_or_refused_in_one_line_naming_it(tmp_path, changes):
    """Invariant: whatever a record's keys hold, ``train --config`` takes it (exit 0) or refuses it
    with exit 2 and one error line naming the file; never a traceback."""
    record = base_record()
    record.update(changes)
    code, errors, output = record_verdict(tmp_path, json.dumps(record))
    if code == 0:
        return
    assert code == 2 and "Traceback" not in output
    assert len(errors) == 1 and str(tmp_path / "config.json") in errors[0], output


def test_eval_names_a_run_record_for_what_it_is(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(base_record()))
    result = CliRunner().invoke(main, ["eval", "--config", str(path), "--help"])
    assert result.exit_code == 2 and f"{path} is a run's record, not a TOML preset" in result.output


def test_values_config_json_keeps_only_in_part_are_left_to_the_new_run(tmp_path):
    """The Wikipedia contact (recorded as a placeholder) is not sent; a retriever URL whose
    credentials were removed must be given again, before any work."""
    record = base_record()
    record["search"]["options"].update(backend="retriever", retriever_url="http://host:8000/retrieve",
                                       wikipedia_contact="<CONTACT>")
    record["search"]["retriever_url_credentials_removed"] = True
    path = tmp_path / "config.json"
    path.write_text(json.dumps(record))
    ctx = parsed(path)
    assert ctx.params["retriever_url"] is None and ctx.params["wikipedia_contact"] is None
    assert ctx.params["search_backend"] == "retriever"
    result = CliRunner().invoke(main, ["train", "--config", str(path), "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    assert f"the --retriever-url of {path} carried credentials" in " ".join(result.output.split())
    assert not (tmp_path / "run").exists()


def test_a_setting_no_flag_carries_is_applied_unless_the_flag_recorded_under_its_name_is_given(tmp_path):
    record = base_record()
    record["rollout"]["system_prompt"] = "Answer in one word."
    record["rollout"]["sample_retry_backoff"] = 0.5
    path = tmp_path / "config.json"
    path.write_text(json.dumps(record))
    found = parsed(path).meta[RUN_RECORD]
    config = TrainConfig(max_steps=1, data="d.jsonl")
    applied = with_unflagged(config, found, set())
    assert applied.rollout.system_prompt == "Answer in one word." and applied.rollout.sample_retry_backoff == 0.5
    kept = with_unflagged(config, found, {"system_prompt_file"})  # --system-prompt-file typed: its text wins
    assert kept.rollout.system_prompt is None and kept.rollout.sample_retry_backoff == 0.5


def test_the_old_runs_facts_warn_where_the_new_run_will_not_repeat_it(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("{}\n")
    record = base_record()
    record.update(data=str(data), code_version="0.0.1",
                  segments=[{"from_step": 4, "changed": {"learning_rate": {"from": 0.2, "to": 0.1}}}])
    path = tmp_path / "config.json"
    path.write_text(json.dumps(record))
    found = parsed(path).meta[RUN_RECORD]
    same = TrainConfig(max_steps=2, data=str(data), data_sha256=record["data_sha256"])
    assert record_warnings(found, dataclasses.replace(same, data=str(tmp_path / "other.jsonl")), "0.0.1") == [
        f"{path}: that run changed settings from step 4 (--from-step); this run uses the last ones from step 0"]
    warnings = record_warnings(found, dataclasses.replace(same, data_sha256="1" * 64), "0.1.0")
    assert warnings[:2] == [
        f"{data} changed since {path} was written (sha256 differs): this run will not repeat that one",
        f"{path} was written by searchr1 0.0.1, this is 0.1.0: metrics may differ"]
