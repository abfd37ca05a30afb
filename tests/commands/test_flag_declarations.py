"""Each of ``train``'s flags declares its properties where it is declared: the --help section it
is listed under and what ``train --resume`` does with it; the twin's per-policy defaults live in
the settings' declarations. These tests fail when a new flag lacks one. Every command that takes
--offline-policy offers the offline policies as :class:`searchr1.offline.OfflinePolicy` declares them."""

from __future__ import annotations

import click
from cli_support import command_paths

from searchr1.cli import main
from searchr1.commands.help_layout import SECTIONS
from searchr1.commands.train import _MISSING, _flags, _search_record, _stored_value, train
from searchr1.training.config import TrainConfig
from searchr1.core.settings import OnResume, offline_defaults, settings_of
from searchr1.offline import OfflinePolicy
from searchr1.search.options import SearchOptions

OFFLINE_POLICIES = next(param.type.choices for param in train.params if param.name == "offline_policy")


def test_every_train_flag_declares_its_section_and_what_a_resume_does_with_it():
    undeclared = [param.name for param in train.params if isinstance(param, click.Option)
                  and (getattr(param, "section", None) not in SECTIONS
                       or not isinstance(getattr(param, "on_resume", None), OnResume))]
    assert undeclared == []


def test_every_flag_a_resume_compares_or_records_is_found_in_config_json():
    """A resume compares FIXED and SEGMENT flags with config.json and records COST and GUARD
    ones there: a flag of those roles that config.json never holds would be refused on every
    resume, however it was given. --run-dir is refused beside --resume with its own message."""
    config = TrainConfig(offline=True, offline_policy="learning", max_steps=2, data="train.jsonl",
                         search=_search_record(SearchOptions(backend="deepseek"), offline=True))
    recorded = config.to_json()
    roles = (OnResume.FIXED, OnResume.SEGMENT, OnResume.COST, OnResume.GUARD)
    names = set().union(*(_flags(role) for role in roles)) - {"run_dir"}
    assert names, "no flag declares a recorded role"
    assert sorted(name for name in names if _stored_value(recorded, name) is _MISSING) == []


def test_offline_defaults_name_real_policies_and_pass_their_settings_rules():
    for field, rule in settings_of(TrainConfig):
        for policy, value in (rule.offline_defaults or {}).items():
            assert policy in OFFLINE_POLICIES, f"{field.name}: unknown twin policy {policy!r}"
            assert rule.violation(value) is None, f"{field.name}: offline default {value} breaks its rule"
    assert offline_defaults(TrainConfig, "learning")["max_steps"] >= 1
    assert all("max_steps" in offline_defaults(TrainConfig, policy) for policy in OFFLINE_POLICIES), \
        "an offline run needs a number of steps for each twin policy"


def test_every_commands_offline_policy_choices_are_the_offline_policies():
    """Invariant: each command that takes --offline-policy offers exactly the values of
    :class:`OfflinePolicy`, in its order, and defaults to one of them; the twin serves each."""
    commands = {" ".join(words): command for words, command in command_paths(main)}
    taking = {name: param for name, command in commands.items() for param in command.params
              if param.name == "offline_policy"}
    assert set(taking) >= {"train", "eval", "serve", "ask"}
    for name, param in taking.items():
        assert isinstance(param.type, click.Choice), name
        assert tuple(param.type.choices) == tuple(policy.value for policy in OfflinePolicy), name
        assert param.default in set(OfflinePolicy), name
    served = next(param for param in commands["twin serve"].params if param.name == "policy")
    assert set(OfflinePolicy) <= set(served.type.choices)
