"""A run's settings (:class:`searchr1.training.config.TrainConfig`): the core step's settings and
the run's, each declared once; the rules that span several settings, the checkpoint prefix held
to pytrio's own name rule, the offline policy, and ``config.json`` read back."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import re

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from pytrio.client.builders.training import CHECKPOINT_NAME_PATTERN_TEXT

import searchr1.training.config as harness
from searchr1.core.config import StepConfig
from searchr1.core.rollout import RolloutConfig
from searchr1.core.settings import SettingError, settings_of
from searchr1.offline import OfflinePolicy
from searchr1.training.config import TrainConfig

REQUIRED = {"max_steps": 1, "data": "train.jsonl"}
NAME_CHARACTERS = st.text(st.sampled_from("aZ09._-/ \n\u00e9"), max_size=160)


def declared_in(source: str, name: str) -> list[str]:
    """The field names the body of class ``name`` in ``source`` declares, as often as it declares
    each."""
    body = next(node for node in ast.parse(source).body if isinstance(node, ast.ClassDef) and node.name == name)
    return [node.target.id for node in body.body
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)]


def test_every_field_of_a_run_is_the_core_steps_or_declared_once_by_the_run():
    """Invariant: a run's fields are the core step's and the ones its own class declares, each
    declared once: none twice in the run's class, and none of the core's again."""
    core = [field.name for field in dataclasses.fields(StepConfig)]
    own = declared_in(inspect.getsource(harness), TrainConfig.__name__)
    assert len(own) == len(set(own)), sorted({name for name in own if own.count(name) > 1})
    assert set(own).isdisjoint(core), sorted(set(own) & set(core))
    assert sorted(field.name for field in dataclasses.fields(TrainConfig)) == sorted(core + own)
    assert issubclass(TrainConfig, StepConfig)


def test_the_probe_sees_a_field_declared_twice_and_reads_the_real_class_bodies():
    assert declared_in("class Twice:\n    a: int = 1\n    b: int = 2\n    a: int = 3\n", "Twice") == ["a", "b", "a"]
    assert declared_in(inspect.getsource(harness), "TrainConfig")[:2] == ["max_steps", "data"]
    assert declared_in(inspect.getsource(inspect.getmodule(StepConfig)), "StepConfig")[:2] == [
        "base_model", "lora_rank"]


@given(name=st.one_of(NAME_CHARACTERS, st.text(max_size=20), st.builds(lambda n: "a" * n, st.integers(140, 160))))
@example(name="a" * 150)
@example(name="a" * 151)
@example(name="run.")
@example(name="run\n")
@example(name="x")
@example(name="b/" + "a" * 56)  # its repr is exactly 60 characters: shown whole
@example(name="b/" + "a" * 57)  # 61: shown cut to 57 and "..."
def test_a_run_name_is_accepted_exactly_when_pytrio_accepts_it_as_a_checkpoint_prefix(name):
    """Invariant: the prefix rule is pytrio's checkpoint-name pattern (read from the SDK), whole,
    within 150 characters."""
    accepted = re.fullmatch(CHECKPOINT_NAME_PATTERN_TEXT, name) is not None and len(name) <= 150
    if accepted:
        assert TrainConfig(**REQUIRED, run_name=name).run_name == name
        return
    with pytest.raises(SettingError) as info:
        TrainConfig(**REQUIRED, run_name=name)
    message = str(info.value)
    assert info.value.flag == "--run-name"
    shown = repr(name) if len(repr(name)) <= 60 else repr(name)[:57] + "..."
    assert message == (f"--run-name {shown} cannot prefix PyTRIO checkpoint names: use letters, digits, '.', "
                       "'_' and '-' (at most 150 characters, not starting or ending with '.')")


def test_a_run_name_that_is_not_text_is_refused():
    with pytest.raises(SettingError, match="^--run-name 7 cannot prefix"):
        TrainConfig(**REQUIRED, run_name=7)


def test_the_core_steps_rules_hold_for_a_run():
    with pytest.raises(SettingError, match="^--group-size 1: group advantages"):
        TrainConfig(**REQUIRED, rollout=RolloutConfig(group_size=1))
    with pytest.raises(SettingError, match="^--lora-rank must be >= 4, got 3$"):
        TrainConfig(**REQUIRED, lora_rank=3)


@pytest.mark.parametrize(("dynamic", "off_policy", "refused"), [(True, 1, True), (True, 0, False), (False, 3, False)])
def test_dynamic_sampling_needs_an_on_policy_run(dynamic, off_policy, refused):
    settings = {**REQUIRED, "dynamic_sampling": dynamic, "max_steps_off_policy": off_policy}
    if not refused:
        assert TrainConfig(**settings).dynamic_sampling is dynamic
        return
    with pytest.raises(SettingError) as info:
        TrainConfig(**settings)
    assert str(info.value) == ("--dynamic-sampling needs --max-steps-off-policy 0: how many questions a step draws "
                               "is known only when it has finished, so the next step's batch cannot start earlier")


@pytest.mark.parametrize("policy", [*OfflinePolicy, *(policy.value for policy in OfflinePolicy)])
def test_the_offline_policy_is_the_enum_whether_given_as_it_or_as_its_text(policy):
    config = TrainConfig(**REQUIRED, offline=True, offline_policy=policy)
    assert isinstance(config.offline_policy, OfflinePolicy) and config.offline_policy == policy
    written = json.loads(json.dumps(config.to_json()))
    assert written["offline_policy"] == OfflinePolicy(policy).value  # config.json holds the text
    assert TrainConfig.from_json(written) == config


def test_an_offline_policy_that_is_none_of_the_enums_is_refused_naming_the_choices():
    with pytest.raises(SettingError) as info:
        TrainConfig(**REQUIRED, offline=True, offline_policy="toy")
    assert str(info.value) == "--offline-policy must be one of learning, scripted, got 'toy'"
    assert TrainConfig(**REQUIRED).offline_policy is None  # a live run's


def test_every_offline_default_is_keyed_by_an_offline_policy():
    keys = {key for _, rule in settings_of(TrainConfig) for key in rule.offline_defaults or {}}
    assert keys and keys <= set(OfflinePolicy)


def test_config_json_reads_back_to_the_same_config():
    config = TrainConfig(**REQUIRED, run_name="r", rollout=RolloutConfig(group_size=3, max_search_calls=2),
                         search={"backend": "local"}, loss_fn="ppo", loss_fn_config={"clip_low_threshold": 0.8},
                         reward="f1", advantage_mode="rloo", seed=9, offline=True)
    written = json.loads(json.dumps(config.to_json()))
    assert written["rollout"]["group_size"] == 3 and written["run_name"] == "r"
    read = TrainConfig.from_json(written)
    assert read == config and isinstance(read.rollout, RolloutConfig)


def test_config_json_is_flat_the_core_steps_settings_beside_the_runs():
    written = TrainConfig(**REQUIRED).to_json()
    assert set(written) == {field.name for field in dataclasses.fields(TrainConfig)}
    assert {field.name for field in dataclasses.fields(StepConfig)} < set(written)
    assert isinstance(written["rollout"], dict)  # the one nested object, as before


def test_config_json_leaves_out_the_flag_history_and_refuses_fields_it_does_not_know():
    written = TrainConfig(**REQUIRED).to_json()
    assert TrainConfig.from_json({**written, "segments": [{"from_step": 0}]}) == TrainConfig(**REQUIRED)
    without_rollout = {k: v for k, v in written.items() if k != "rollout"}
    assert TrainConfig.from_json(without_rollout).rollout == RolloutConfig()
    with pytest.raises(ValueError) as info:
        TrainConfig.from_json({**written, "zeta": 1, "alpha": 2})
    assert str(info.value) == "config.json holds unknown fields ['alpha', 'zeta']; written by another version?"
    assert written == TrainConfig(**REQUIRED).to_json()  # reading did not change what it was given


@pytest.mark.parametrize("rollout, kind", [([], "list"), ("x", "str"), (3, "int")])
def test_config_json_whose_rollout_is_not_an_object_is_refused_naming_what_it_holds(rollout, kind):
    payload = {**REQUIRED, "rollout": rollout}
    with pytest.raises(ValueError, match=f"rollout must be an object, not {kind}$"):
        TrainConfig.from_json(payload)
