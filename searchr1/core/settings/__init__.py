"""One declaration per setting: a dataclass field carries its default, its rule and its help.

A configuration class (``RolloutBudgets``, ``SamplingRuntime``, ``StepConfig``, a run's
``TrainConfig``, ``SearchOptions``) declares each user setting with :func:`setting`::

    group_size: int = setting(8, at_least=1, help="Trajectories per question.")

From that one line come the command-line flag (``searchr1.commands.settings_options`` builds the
click options from the fields), the validation (:func:`check_settings`, called by the class's
``__post_init__``, the only place a rule is enforced), the help text with its range, and the
key of a ``--config`` preset file. A value that breaks a rule raises :class:`SettingError`, whose
message names the flag and the rule.

Every number a setting takes is finite (no nan, no inf) and, unless its declaration bounds it
closer, at most :data:`LARGEST` in size: what a seed, a count or a budget can be on the service,
in msgpack and in numpy, and a list that length is never built. A setting whose value sizes work
or memory (a group, a token budget) declares its own ``at_most``.

This module is pure (no click, no I/O): the core imports it.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from searchr1.core.errors import UsageError

_MISSING = dataclasses.MISSING
LARGEST = 2**31 - 1  # the size no number setting exceeds (a signed 32-bit integer)


def _shown(number: float) -> str:
    """``262144``, ``1000000``, ``4e-05``: whole numbers in full, others as ``%g``, or in full
    where ``%g``'s six digits would make them look whole (``100000.5``)."""
    if isinstance(number, int) or (math.isfinite(number) and number.is_integer() and abs(number) < 1e16):
        return str(int(number))
    text = f"{number:g}"
    looks_whole = math.isfinite(number) and not ("." in text or "e" in text)
    return repr(float(number)) if looks_whole else text


class SettingError(UsageError, ValueError):
    """A setting holds a value its rule refuses; ``flag`` names it as the user types it."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"{flag} {message}")
        self.flag = flag
        self.rule = message


class OnResume(enum.Enum):
    """What ``train --resume`` does with a flag given again; each flag declares its own."""

    FIXED = "fixed"  # part of the run: config.json fixes it, and a different value is refused
    SEGMENT = "segment"  # an algorithm choice a restart from step K (--from-step) may change, as a new segment
    COST = "cost"  # the price table and the budgets: any resume applies them as given, and config.json records them
    GUARD = "guard"  # the collapse guard: any resume may change it, and config.json records the change
    FREE = "free"  # how this one invocation runs (output, waits, checks): not part of the run's record


@dataclass(frozen=True)
class Rule:
    """What a setting accepts and how the command line shows it."""

    help: str = ""
    flag: str | None = None  # the flag as typed (default: --field-name)
    aliases: tuple[str, ...] = ()  # older names that keep working
    at_least: float | None = None
    above: float | None = None
    at_most: float | None = None
    below: float | None = None
    choices: tuple[str, ...] | None = None
    check: Callable[[object], str | None] | None = None  # returns the broken rule, or None
    metavar: str | None = None
    default_text: str | None = None  # shown as [default: ...] when the real default is decided later
    cli: bool = True  # False: recorded in config.json, but not a flag
    group: str | None = None  # the heading --help lists it under (default: its class's)
    on_resume: OnResume = OnResume.FIXED  # what `train --resume` does with it (a recorded setting is fixed)
    offline_defaults: Mapping[str, float] | None = None  # the default under --offline, per twin policy

    def describe(self) -> str:
        """The range as ``--help`` shows it (``x>=1``, ``0<x<=1``)."""
        low = f"{_shown(self.at_least)}<=" if self.at_least is not None else (
            f"{_shown(self.above)}<" if self.above is not None else "")
        high = f"<={_shown(self.at_most)}" if self.at_most is not None else (
            f"<{_shown(self.below)}" if self.below is not None else "")
        return f"{low}x{high}" if low or high else ""

    def violation(self, value: object) -> str | None:
        """The rule ``value`` breaks, in words, or None when it is accepted."""
        if value is None:
            return None
        if self.choices is not None and value not in self.choices:
            return f"must be one of {', '.join(self.choices)}, got {value!r}"
        if isinstance(value, bool) or not isinstance(value, int | float):
            return self.check(value) if self.check else None
        if not math.isfinite(value):
            return f"must be a finite number, got {value}"
        if self.at_least is not None and value < self.at_least:
            return f"must be >= {_shown(self.at_least)}, got {_shown(value)}"
        if self.above is not None and value <= self.above:
            return f"must be > {_shown(self.above)}, got {_shown(value)}"
        if self.at_most is not None and value > self.at_most:
            return f"must be <= {_shown(self.at_most)}, got {_shown(value)}"
        if self.below is not None and value >= self.below:
            return f"must be < {_shown(self.below)}, got {_shown(value)}"
        if abs(value) > LARGEST:
            return f"must be within ±{LARGEST} (the largest number a setting takes), got {_shown(value)}"
        return self.check(value) if self.check else None


def setting(default: Any = _MISSING, *, default_factory: Any = _MISSING, repr: bool = True, **rule: Any) -> Any:  # noqa: A002
    """A dataclass field that is a user setting (see the module docstring); ``repr=False`` keeps
    a value that may be private (a URL with credentials, a person's address) out of ``repr``."""
    metadata = {"setting": Rule(**rule)}
    if default_factory is not _MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata, repr=repr)
    return dataclasses.field(default=default, metadata=metadata, repr=repr)


def flag_of(field: dataclasses.Field[object]) -> str:
    rule = rule_of(field)
    return (rule.flag if rule and rule.flag else None) or "--" + field.name.replace("_", "-")


def rule_of(field: dataclasses.Field[object]) -> Rule | None:
    return field.metadata.get("setting")


def offline_defaults(cls: type, policy: str) -> dict[str, float]:
    """``{field name: default}`` of the settings of ``cls`` that declare a default for the offline
    twin's ``policy``."""
    return {field.name: rule.offline_defaults[policy] for field, rule in settings_of(cls)
            if rule.offline_defaults and policy in rule.offline_defaults}


def settings_of(cls: type) -> Iterator[tuple[dataclasses.Field[object], Rule]]:
    """The fields of ``cls`` declared with :func:`setting`, in declaration order."""
    for field in dataclasses.fields(cls):
        rule = rule_of(field)
        if rule is not None:
            yield field, rule


def key_value(item: str, flag: str, expected: str) -> tuple[str, str]:
    """One ``KEY=VALUE`` item of a repeatable flag, both sides stripped; a ValueError naming the
    flag, the item and the ``expected`` form when a side is missing."""
    key, sep, value = item.partition("=")
    key, value = key.strip(), value.strip()
    if not sep or not key or not value:
        raise ValueError(f"{flag} {item!r}: expected {expected}")
    return key, value


def check_settings(instance: object) -> None:
    """Every rule of every setting of a configuration object (its ``__post_init__`` calls this)."""
    for field, rule in settings_of(type(instance)):
        broken = rule.violation(getattr(instance, field.name))
        if broken:
            raise SettingError(flag_of(field), broken)
