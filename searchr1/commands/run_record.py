"""A run's record (``config.json``) read as the settings of a new run: ``train --config RUN``.

``config.json`` is the run's :class:`~searchr1.training.config.TrainConfig`, flat, with the
rollout's settings under ``rollout`` and the search flags as given under ``search.options``. Each
key is placed through the declarations, never through a table of names:

- a declared setting that has a flag sets that flag (``advantage_mode`` sets ``--advantage``,
  ``rollout.group_size`` sets ``--group-size``, ``search.options.backend`` sets
  ``--search-backend``), as a ``--config`` preset would;
- a field named like one of the command's flags sets it (``offline``, ``offline_policy``,
  ``health_rules`` and ``loss_fn_config`` as their ``NAME=VALUE`` items, the rollout's ``seed``);
- a declared setting no flag carries (the micro-batch sizes, ``rollout.system_prompt``) is
  applied to the new run's settings as recorded, unless the command line gives the flag recorded
  under that name (``--system-prompt-file``, which declares ``recorded_as="system_prompt"``);
- every other field is a fact of the recorded run (its id, the data's sha256, the code's
  version, the server's limits, the history of its changed settings): the new run makes its own,
  and :func:`record_warnings` says where one tells that the new run will not repeat the old.

A flag given on the command line beats the record, as it beats a preset. Each value goes through
the check its flag makes; an unreadable file, an unknown key or a value the flag refuses is one
line naming the file and the key (exit 2).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from dataclasses import dataclass
from pathlib import Path

import click
from click.core import ParameterSource

from searchr1.commands.settings_options import (
    PRESET_ORIGINS,
    NameList,
    call_with,
    checked_value,
    preset_params,
    setting_params,
)
from searchr1.core.settings import Rule, rule_of
from searchr1.core.types import JsonValue
from searchr1.run.directory import CONFIG
from searchr1.basics.jsonl import JsonInputError, read_json_object
from searchr1.search.options import SearchOptions
from searchr1.training.config import TrainConfig

RUN_RECORD = "searchr1.run_record"  # ctx.meta key: the RunRecord that --config read
SEGMENTS = "segments"  # config.json's history of the settings a restart changed (train --from-step)
SEARCH = "search"  # config.json's search block: what was used, and the flags as given under OPTIONS
OPTIONS = "options"
CREDENTIALS_REMOVED = "retriever_url_credentials_removed"  # the search block says the URL lost its userinfo


@dataclass(frozen=True)
class UnflaggedSetting:
    """A recorded setting that no flag of the command sets: applied to the new run as recorded,
    unless the flag ``overridden_by`` names is given on the command line."""

    scope: str | None  # the nested settings object that holds it (``rollout``); None: the top level
    name: str
    value: JsonValue
    overridden_by: str | None


@dataclass(frozen=True)
class RunRecord:
    """What ``--config`` read from a run's record: the flags it sets (by parameter name), the
    settings no flag carries, and the recorded run's facts."""

    path: Path  # the config.json read
    flags: dict[str, object]
    unflagged: tuple[UnflaggedSetting, ...]
    facts: dict[str, JsonValue]
    credentials_removed: bool  # the run's --retriever-url carried credentials config.json does not keep

    @property
    def run_dir(self) -> Path:
        return self.path.parent


def record_file(given: Path) -> Path:
    """The ``config.json`` that ``--config`` names: the file, or the one in a run directory."""
    return given / CONFIG if given.is_dir() else given


def json_kind(value: object) -> str:
    """What a JSON value is, in JSON's words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def _item_text(value: JsonValue) -> str:
    """One value of a recorded ``NAME: VALUE`` object as its flag's ``NAME=VALUE`` item writes it
    (``null`` is ``off``, a rule turned off; numbers exactly)."""
    if value is None:
        return "off"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def _settings_class(annotation: object) -> type | None:
    """The settings dataclass a field holds nested (``rollout``: RolloutConfig), or None."""
    return annotation if isinstance(annotation, type) and dataclasses.is_dataclass(annotation) else None


def _fits(annotation: object, value: object) -> bool:
    """Whether a JSON value is one the field's type holds (``int | None``: an integer or null)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_fits(member, value) for member in typing.get_args(annotation))
    if typing.get_origin(annotation) is typing.Literal:
        return value in typing.get_args(annotation)
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return value in {member.value for member in annotation}
    origin = typing.get_origin(annotation) or annotation
    return isinstance(value, dict) if origin is dict else isinstance(value, list) if origin in (list, tuple) else True


class _Reader:
    """One record read into flags, unflagged settings and facts (:func:`read_run_record`)."""

    def __init__(self, ctx: click.Context, path: Path) -> None:
        self.ctx, self.path = ctx, path
        self.params = preset_params(ctx)
        recorded_as = {name: getattr(param, "recorded_as", None) for name, param in self.params.items()}
        self.recorded_as = {setting: name for name, setting in recorded_as.items() if setting}
        self.flags: dict[str, object] = {}
        self.origins: dict[str, str] = {}
        self.keys: dict[str, str] = {}  # parameter name -> the key that set it
        self.unflagged: list[UnflaggedSetting] = []
        self.facts: dict[str, JsonValue] = {}
        self.credentials_removed = False

    def refuse(self, message: str) -> click.BadParameter:
        return click.BadParameter(f"{self.path}: {message}", param_hint="--config")

    def scope(self, cls: type, values: object, key: str, *, nested: str | None = None) -> None:
        """The keys of one settings object of the record (``cls``'s fields, under ``key``;
        ``nested``: the field of the run's settings that holds it, None at the top)."""
        if not isinstance(values, dict):
            raise self.refuse(f"{key} must be an object, not {json_kind(values)}")
        fields = {field.name: field for field in dataclasses.fields(cls)}
        hints = typing.get_type_hints(cls)
        flagged = {field: param for param, field in setting_params(cls).items()}
        for name, value in values.items():
            dotted = f"{key}.{name}" if key else name
            if name not in fields:
                if not key and name == SEGMENTS:
                    self.facts[name] = value
                    continue
                raise self.refuse(f"unknown key {dotted!r} (not a setting of a run; a record written by "
                                  "another version?)")
            inner = _settings_class(hints[name])
            rule = rule_of(fields[name])
            if inner is not None:
                self.scope(inner, value, dotted, nested=name)
            elif not key and name == SEARCH:
                self.search(value, dotted)
            elif name in flagged:
                self.flag(flagged[name], value, dotted, declared=True)
            elif name in self.params:
                self.flag(name, value, dotted, declared=rule is not None)
            elif rule is not None and nested != SEARCH:  # the search block is a record, not settings to replace
                self.setting(nested, name, rule, hints[name], value, dotted)
            elif rule is not None:
                raise self.refuse(f"{dotted}: no flag sets it, so a new run cannot take it")
            else:
                self.facts[dotted] = value

    def search(self, block: object, key: str) -> None:
        """``search``: what the run used (facts), and the search flags as given under ``options``;
        a value config.json keeps only in part (the Wikipedia contact) is left to the new run."""
        from searchr1.search.wikipedia import CONTACT_PLACEHOLDER

        if not isinstance(block, dict):
            raise self.refuse(f"{key} must be an object, not {json_kind(block)}")
        self.credentials_removed = block.get(CREDENTIALS_REMOVED) is True
        options = block.get(OPTIONS)
        if options is None:
            return
        if isinstance(options, dict):
            options = {name: value for name, value in options.items()
                       if not (name == "wikipedia_contact" and value == CONTACT_PLACEHOLDER)
                       and not (name == "retriever_url" and self.credentials_removed)}
        self.scope(SearchOptions, options, f"{key}.{OPTIONS}", nested=SEARCH)

    def flag(self, name: str, value: JsonValue, key: str, *, declared: bool) -> None:
        """A recorded value that sets the flag ``name``; ``null`` leaves a flag unset when not
        setting it means the same (its default is none, or the field is not a declared setting)."""
        param = self.params[name]
        if value is None and (param.default is None or not declared):
            return
        if param.multiple:
            if not isinstance(value, dict):
                raise self.refuse(f"{key} must be an object of NAME: VALUE, not {json_kind(value)}")
            value = [f"{item}={_item_text(setting)}" for item, setting in value.items()]
        elif isinstance(param.type, NameList) and isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = ",".join(str(v) for v in value)
        taken = checked_value(self.ctx, param, value, where=str(self.path), key=key, kind=json_kind)
        if name in self.flags and self.flags[name] != taken:
            raise self.refuse(f"{key} ({taken!r}) and {self.keys[name]} ({self.flags[name]!r}) are the same "
                              f"setting ({param.opts[0]}) and differ")
        self.flags[name], self.keys[name] = taken, key
        self.origins[name] = f"{self.path}, key {key}"

    def setting(self, scope: str | None, name: str, rule: Rule, annotation: object, value: JsonValue,
                key: str) -> None:
        """A declared setting no flag sets, checked by its type and rule."""
        if not _fits(annotation, value):
            raise self.refuse(f"{key} cannot be {json_kind(value)}")
        broken = rule.violation(value)
        if broken:
            raise self.refuse(f"{key} {broken}")
        self.unflagged.append(UnflaggedSetting(scope, name, value, self.recorded_as.get(name)))


def read_run_record(ctx: click.Context, given: Path) -> dict[str, object]:
    """The settings of the run recorded at ``given`` (``RUN`` or ``RUN/config.json``) by
    parameter name, each checked as its flag checks it; the whole :class:`RunRecord` goes to
    ``ctx.meta[RUN_RECORD]``, and each flag's key to the origins a later check names."""
    path = record_file(given)
    try:
        payload = read_json_object(path, JsonInputError, "run record")
    except JsonInputError as error:
        raise click.BadParameter(str(error), param_hint="--config") from None
    reader = _Reader(ctx, path)
    reader.scope(TrainConfig, payload, "")
    ctx.meta[RUN_RECORD] = RunRecord(path, reader.flags, tuple(reader.unflagged), reader.facts,
                                     reader.credentials_removed)
    ctx.meta[PRESET_ORIGINS] = reader.origins
    return reader.flags


def command_line_params(ctx: click.Context) -> set[str]:
    """The parameters given on the command line (or its environment), which beat the record."""
    given = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
    return {name for name in ctx.params if ctx.get_parameter_source(name) in given}


def with_unflagged(config: TrainConfig, record: RunRecord, command_line: set[str]) -> TrainConfig:
    """``config`` with the record's settings that no flag carries, as recorded (a nested one in
    its settings object), except those whose flag the command line gives."""
    top: dict[str, object] = {}
    nested: dict[str, dict[str, JsonValue]] = {}
    for setting in record.unflagged:
        if setting.overridden_by not in command_line:
            (top if setting.scope is None else nested.setdefault(setting.scope, {}))[setting.name] = setting.value
    for scope, values in nested.items():
        top[scope] = dataclasses.replace(getattr(config, scope), **values)
    return call_with(functools.partial(dataclasses.replace, config), top) if top else config


def record_warnings(record: RunRecord, config: TrainConfig, version: str) -> list[str]:
    """Where the recorded run's facts tell that the new run (``config``, of code ``version``) will
    not repeat it step for step: its data file changed, other code wrote it, or a restart changed
    its settings on the way (the new run uses the last ones throughout)."""
    warnings = []
    sha256, data = record.facts.get("data_sha256"), record.flags.get("data")
    if isinstance(data, str) and Path(data) == Path(config.data) and sha256 and sha256 != config.data_sha256:
        warnings.append(f"{config.data} changed since {record.path} was written (sha256 differs): "
                        "this run will not repeat that one")
    written_by = record.facts.get("code_version")
    if written_by and written_by != version:
        warnings.append(f"{record.path} was written by searchr1 {written_by}, this is {version}: "
                        "metrics may differ")
    segments = record.facts.get(SEGMENTS)
    if isinstance(segments, list) and segments:
        steps = ", ".join(str(segment.get("from_step")) for segment in segments if isinstance(segment, dict))
        warnings.append(f"{record.path}: that run changed settings from step {steps} (--from-step); this run "
                        "uses the last ones from step 0")
    return warnings


def same_directory(one: Path, other: Path) -> bool:
    """Whether two paths name one directory (symlinks and ``..`` resolved)."""
    return one.resolve() == other.resolve()
