"""The policies a twin can serve, by name: ``scripted`` (the shipped offline scenario, or any
scenario file), ``toy`` (the bucketed bigram) and ``learning`` (a small policy that learns). An
offline run is served ``learning`` or ``scripted`` (:class:`searchr1.offline.OfflinePolicy`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from searchr1.offline import OfflinePolicy
from searchr1.runtime.tokenizer import Qwen35Tokenizer
from searchr1.twin.policy import TwinPolicy

if TYPE_CHECKING:
    from searchr1.twin.scenario import Scenario

POLICY_NAMES = (OfflinePolicy.SCRIPTED.value, "toy", OfflinePolicy.LEARNING.value)


def offline_policy_label(policy: str | None) -> str:
    """How every output of an offline run names what produced it: the twin's policy, never the
    model the run would train live (``None``: the scripted one, the twin's default)."""
    return f"twin {policy or OfflinePolicy.SCRIPTED} policy"


def make_policy(name: str, tokenizer: Qwen35Tokenizer, *,
                scenario: Scenario | str | os.PathLike[str] | None = None) -> TwinPolicy:
    """Build the named policy. ``scenario`` (a :class:`~searchr1.twin.scenario.Scenario` or a
    path) is what ``scripted`` replies from; default: the shipped offline world."""
    if name == OfflinePolicy.SCRIPTED:
        from searchr1.offline import SCENARIO
        from searchr1.twin.scenario import Scenario, load_scenario
        from searchr1.twin.scripted_policy import ScriptedPolicy

        if not isinstance(scenario, Scenario):
            scenario = load_scenario(Path(scenario) if scenario is not None else SCENARIO)
        return ScriptedPolicy(scenario, tokenizer)
    if name == "toy":
        from searchr1.twin.toy_policy import ToyPolicy

        return ToyPolicy(vocab_size=len(tokenizer), stop_token=int(tokenizer.convert_tokens_to_ids("<|im_end|>")))
    if name == OfflinePolicy.LEARNING:
        from searchr1.twin.learning_policy import LearningPolicy

        return LearningPolicy(tokenizer)
    raise ValueError(f"unknown twin policy {name!r}; expected one of {', '.join(POLICY_NAMES)}")
