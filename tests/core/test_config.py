"""A run's settings (:class:`searchr1.core.config.TrainConfig`): the rules that span several
settings, the checkpoint prefix held to pytrio's own name rule, and ``config.json`` read back."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from pytrio.client.builders.training import CHECKPOINT_NAME_PATTERN_TEXT

from searchr1.core.config import TrainConfig
from searchr1.core.rollout import RolloutConfig
from searchr1.core.settings import SettingError

REQUIRED = {"max_steps": 1, "data": "train.jsonl"}
NAME_CHARACTERS = st.text(st.sampled_from("aZ09._-/ \n\u00e9"), max_size=160)


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


@pytest.mark.parametrize("size", [2, 3, 8])
def test_a_group_of_two_or_more_is_accepted(size):
    assert TrainConfig(**REQUIRED, rollout=RolloutConfig(group_size=size)).rollout.group_size == size


def test_a_group_of_one_is_refused_with_the_reason():
    with pytest.raises(SettingError) as info:
        TrainConfig(**REQUIRED, rollout=RolloutConfig(group_size=1))
    assert info.value.flag == "--group-size"
    assert str(info.value) == ("--group-size 1: group advantages compare a question's samples with each other, so a "
                               "group of one always has advantage 0 and no step could ever update; use at least 2")


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


def test_each_settings_rule_is_checked_when_a_config_is_made():
    with pytest.raises(SettingError, match="^--lora-rank must be >= 4, got 3$"):
        TrainConfig(**REQUIRED, lora_rank=3)


def test_config_json_reads_back_to_the_same_config():
    config = TrainConfig(**REQUIRED, run_name="r", rollout=RolloutConfig(group_size=3, max_search_calls=2),
                         search={"backend": "local"}, loss_fn="ppo", loss_fn_config={"clip_low_threshold": 0.8},
                         reward="f1", advantage_mode="rloo", seed=9, offline=True)
    written = json.loads(json.dumps(config.to_json()))
    assert written["rollout"]["group_size"] == 3 and written["run_name"] == "r"
    read = TrainConfig.from_json(written)
    assert read == config and isinstance(read.rollout, RolloutConfig)


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
