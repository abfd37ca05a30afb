"""The core step's settings (:class:`searchr1.core.config.StepConfig`): each setting's rule, and
the rule that spans the step and its rollout (a group of two or more)."""

from __future__ import annotations

import pytest

from searchr1.core.config import StepConfig
from searchr1.core.rollout import RolloutConfig
from searchr1.core.settings import SettingError


@pytest.mark.parametrize("size", [2, 3, 8])
def test_a_group_of_two_or_more_is_accepted(size):
    assert StepConfig(rollout=RolloutConfig(group_size=size)).rollout.group_size == size


def test_a_group_of_one_is_refused_with_the_reason():
    with pytest.raises(SettingError) as info:
        StepConfig(rollout=RolloutConfig(group_size=1))
    assert info.value.flag == "--group-size"
    assert str(info.value) == ("--group-size 1: group advantages compare a question's samples with each other, so a "
                               "group of one always has advantage 0 and no step could ever update; use at least 2")


def test_each_settings_rule_is_checked_when_a_config_is_made():
    with pytest.raises(SettingError, match="^--lora-rank must be >= 4, got 3$"):
        StepConfig(lora_rank=3)
    with pytest.raises(SettingError, match="^--advantage must be one of"):
        StepConfig(advantage_mode="median")  # type: ignore[arg-type]


def test_the_defaults_are_the_lab_ports_recipe():
    config = StepConfig()
    assert (config.loss_fn, config.reward, config.advantage_mode, config.num_substeps) == (
        "importance_sampling", "em", "mean", 1)
    assert not config.keep_env_failures and config.loss_fn_config == {}
