"""Click options made from the settings a configuration class declares (``searchr1.core.settings``),
and ``--config FILE.toml`` presets.

``setting_options(RolloutConfig)`` adds one flag per declared field (type, default, choices,
range and help from the declaration; the value is checked by the same rule the dataclass
enforces). ``take_settings(RolloutConfig, kwargs)`` pops those flags back out as field values.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import math
import re
import tomllib
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

import click
from click.core import ParameterSource

from searchr1.commands.help_layout import SectionOption
from searchr1.core.settings import LARGEST, OnResume, Rule, flag_of, settings_of
from searchr1.basics import invocation

F = TypeVar("F", bound=Callable[..., object])  # a command's function, as click's decorators hand it on
T = TypeVar("T")


def param_name(flag: str) -> str:
    """The keyword a flag reaches the command under (click's own rule)."""
    return flag.lstrip("-").replace("-", "_").lower()


def setting_params(cls: type, *, exclude: tuple[str, ...] = ()) -> dict[str, str]:
    """``{click parameter name: field name}`` of the flags ``setting_options(cls)`` adds."""
    return {param_name(flag_of(field)): field.name for field, rule in settings_of(cls)
            if rule.cli and field.name not in exclude}


def _base_type(annotation: object) -> object:
    """``int | None`` -> ``int``."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [member for member in typing.get_args(annotation) if member is not type(None)]
        return members[0] if len(members) == 1 else str
    return annotation


class FiniteFloatRange(click.FloatRange):
    """``click.FloatRange`` for a plain flag (not a declared setting), held to the rule of every
    number a setting takes: finite (click's range lets nan and inf through) and within
    :data:`~searchr1.core.settings.LARGEST`."""

    def convert(self, value: float, param: click.Parameter | None, ctx: click.Context | None) -> float:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number) or abs(number) > LARGEST:
            self.fail(f"must be a finite number within ±{LARGEST}, got {value}", param, ctx)
        return number


class NameList(click.ParamType):
    """A setting that holds a tuple of names, typed comma-separated (``--tools search,open_page``)."""

    name = "names"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> tuple[str, ...]:
        if isinstance(value, tuple):
            return value
        return tuple(name.strip() for name in str(value).split(","))


def _validator(rule: Rule) -> Callable[[click.Context, click.Parameter, object], object]:
    def check(ctx: click.Context, param: click.Parameter, value: object) -> object:
        broken = rule.violation(value)
        if broken:
            raise click.BadParameter(broken)
        return value

    return check


def _default(field: dataclasses.Field[object]) -> object:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None if field.default is dataclasses.MISSING else field.default


def setting_option(annotation: object, field: dataclasses.Field[object], rule: Rule, *,
                   default: object = dataclasses.MISSING, help: str | None = None,
                   section: str | None = None) -> Callable[[F], F]:
    """The click option of one declared setting (``annotation``: the field's resolved type;
    ``section``: its heading in --help unless the declaration names one)."""
    base = _base_type(annotation)
    value = _default(field) if default is dataclasses.MISSING else default
    value = value.value if isinstance(value, enum.Enum) else value  # a choice is given and shown as its text
    listed = typing.get_origin(base) is tuple  # a tuple of names, given and shown comma-separated
    value = ",".join(value) if listed and isinstance(value, tuple) else value
    text = help if help is not None else rule.help
    if rule.describe():
        text = f"{text} [{rule.describe()}]".strip()
    flag = flag_of(field)
    names = (flag, *rule.aliases, param_name(flag))
    show_default: bool | str | None = None  # click's own default: the command's show_default
    if rule.default_text is not None:
        show_default = rule.default_text
    elif rule.offline_defaults:
        offline = ", ".join(f"{default:g} with --offline-policy {policy}"
                            for policy, default in rule.offline_defaults.items())
        show_default = offline if value is None else f"{value:g}; {offline}"
    elif value is not None:
        show_default = True
    if base is bool:
        # A setting on by default can be turned off: --name/--no-name.
        switch = (f"{flag}/--no-{flag.removeprefix('--')}", *rule.aliases, param_name(flag)) if value else names
        return click.option(*switch, is_flag=True, default=bool(value), help=text, cls=SectionOption,
                            section=rule.group or section, on_resume=rule.on_resume)
    if rule.choices is not None:
        kind: object = click.Choice(rule.choices)
    elif listed:
        kind = NameList()
    elif base is Path:
        kind = click.Path(dir_okay=False, path_type=Path)
    else:
        kind = base if base in (int, float) else str
    return click.option(*names, type=kind, default=value, callback=_validator(rule), help=text, metavar=rule.metavar,
                        cls=SectionOption, section=rule.group or section, on_resume=rule.on_resume,
                        show_default=show_default)


def setting_options(cls: type, *, defaults: Mapping[str, object] | None = None, helps: Mapping[str, str] | None = None,
                    exclude: tuple[str, ...] = (), section: str | None = None) -> Callable[[F], F]:
    """One click option per declared setting of ``cls``, in declaration order (a subclass's fields
    follow its base's); ``defaults``/``helps`` per field name for a command whose default differs,
    e.g. eval's greedy temperature; ``section``: the --help heading of the settings that declare
    none."""
    defaults, helps = defaults or {}, helps or {}
    annotations = typing.get_type_hints(cls)  # resolved once per class, not once per field
    options = [setting_option(annotations[field.name], field, rule,
                              default=defaults.get(field.name, dataclasses.MISSING), help=helps.get(field.name),
                              section=section)
               for field, rule in settings_of(cls) if rule.cli and field.name not in exclude]

    def decorate(command: F) -> F:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def take_settings(cls: type, kwargs: dict[str, object], *, exclude: tuple[str, ...] = ()) -> dict[str, object]:
    """Pop the flags of ``setting_options(cls)`` out of a command's kwargs, as field values."""
    return {field: kwargs.pop(param) for param, field in setting_params(cls, exclude=exclude).items()}


def call_with(function: Callable[..., T], values: Mapping[str, object]) -> T:
    """``function(**values)``: a settings class made from its field values by name
    (:func:`take_settings`'s), or a command's body called with its flags. Each value is what its
    flag's declaration makes of it (click converts it); the class checks it by the setting's rule
    as it is made."""
    return function(**values)


def flag_value(values: Mapping[str, object], name: str, kind: type[T]) -> T:
    """A command's flag (or the setting taken from it), as the ``kind`` its declaration makes of it
    (click converts every value; another kind is a declaration's mistake, not the user's)."""
    value = values[name]
    if not isinstance(value, kind):
        raise TypeError(f"flag {name}: expected {kind.__name__}, got {type(value).__name__}")
    return value


def pop_flag(kwargs: dict[str, object], name: str, kind: type[T]) -> T:
    """Pop a command's flag out of its kwargs, as the ``kind`` its declaration makes of it."""
    value = flag_value(kwargs, name, kind)
    del kwargs[name]
    return value


def pop_optional(kwargs: dict[str, object], name: str, kind: type[T]) -> T | None:
    """:func:`pop_flag` of a flag that may be left out (``None``)."""
    if kwargs.get(name) is None:
        kwargs.pop(name)
        return None
    return pop_flag(kwargs, name, kind)


# --- --config FILE.toml ---------------------------------------------------------------------------


def given_params(ctx: click.Context) -> set[str]:
    """The parameters the user set: on the command line or in the ``--config`` preset."""
    given = (ParameterSource.COMMANDLINE, ParameterSource.DEFAULT_MAP, ParameterSource.ENVIRONMENT)
    return {name for name in ctx.params if ctx.get_parameter_source(name) in given}


def _key_line(text: str, key: str) -> int | None:
    """The line that sets ``key`` at the top of a TOML file: ``key = ...``, a dotted
    ``key.sub = ...`` or a table header ``[key]`` / ``[key.sub]``."""
    quoted = rf"(?:{re.escape(key)}|\"{re.escape(key)}\"|'{re.escape(key)}')"
    for number, line in enumerate(text.splitlines(), 1):
        if re.match(rf"\s*{quoted}\s*[=.]", line) or re.match(rf"\s*\[+\s*{quoted}\s*[].]", line):
            return number
    return None


def _toml_kind(value: object) -> str:
    """What a TOML value is, in the words of the TOML spec."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, datetime.datetime):
        return "a date-time"
    if isinstance(value, datetime.date):
        return "a date"
    if isinstance(value, datetime.time):
        return "a time"
    return type(value).__name__


def _expected_kind(param: click.Option) -> tuple[tuple[type, ...], str]:
    """The TOML values a flag takes (the Python types ``tomllib`` gives) and their name."""
    if param.is_flag:
        return (bool,), "a boolean (true or false)"
    kind = param.type
    if isinstance(kind, click.types.IntParamType):
        return (int,), "an integer"
    if isinstance(kind, click.types.FloatParamType):
        return (int, float), "a number"
    return (str,), "a string"


def _shaped(param: click.Option, value: object, kind: Callable[[object], str]) -> str | None:
    """Why ``value`` is not the shape ``param`` takes (``None`` when it is): a scalar of the
    flag's type, or an array of them for a repeatable flag. An integer flag refuses 8.5 (click
    would truncate it to 8) and every flag refuses dates. ``kind`` names what a value is in the
    file's own words (TOML's, JSON's)."""
    types_, words = _expected_kind(param)
    items = value if param.multiple and isinstance(value, list) else [value]
    for item in items:
        if isinstance(item, bool) != (types_ == (bool,)) or not isinstance(item, types_):
            many = f"{words} or an array of them" if param.multiple else words
            return f"must be {many}, not {kind(item)}" + (f" ({item!r})" if isinstance(item, int | float) else "")
    return None


def checked_value(ctx: click.Context, param: click.Option, value: object, *, where: str, key: str,
                  kind: Callable[[object], str] = _toml_kind) -> object:
    """A value read from a file for ``param``, as the flag takes it (a lone value of a repeatable
    flag as a list of one), checked as the flag would check it: its shape, click's conversion and
    the declared rule. A refusal is one ``BadParameter`` naming ``where`` (the file, its line or
    key) and ``key``."""
    wrong = _shaped(param, value, kind)
    if wrong:
        raise click.BadParameter(f"{where}: {key} {wrong}", param_hint="--config")
    if param.multiple and not isinstance(value, list):
        value = [value]
    try:
        converted = param.type_cast_value(ctx, value)
        if param.callback is not None:
            param.callback(ctx, param, converted)
    except click.BadParameter as error:
        raise click.BadParameter(f"{where}: {key} {error.message}", param_hint="--config") from None
    return value


PRESET_READERS = ("train", "eval")  # the commands that take --config; one preset serves them all


def _sibling_options(ctx: click.Context) -> dict[str, str]:
    """``{parameter name: command}`` of the options the other commands that read a ``--config``
    preset take (train's settings in a file that eval reads, and the other way round)."""
    group = ctx.parent.command if ctx.parent is not None else None
    found: dict[str, str] = {}
    if not isinstance(group, click.Group):
        return found
    for name in PRESET_READERS:
        command = group.get_command(ctx, name)
        if command is None or command is ctx.command:
            continue
        for param in command.params:
            if isinstance(param, click.Option) and param.name not in ("config", "help"):
                for option in param.opts:
                    found.setdefault(param_name(option), name)
    return found


PRESET_ORIGINS = "searchr1.preset_origins"  # ctx.meta key: {parameter name: "FILE, line N"}


def preset_params(ctx: click.Context) -> dict[str, click.Option]:
    """The options of ``ctx``'s command a ``--config`` file may set, by parameter name."""
    return {param.name: param for param in ctx.command.params
            if isinstance(param, click.Option) and param.name and param.name not in ("config", "help")}


def read_preset(ctx: click.Context, path: Path) -> dict[str, object]:
    """The preset's values by parameter name, each checked as its flag would be; an unknown key,
    a value of the wrong shape or a bad value names the file, the line and the key. A key
    another command takes (a train setting in a file eval reads) is noted and left out; two
    spellings of one setting (``loss_fn`` and ``loss-fn``) are refused."""
    try:
        text = path.read_text("utf-8")
        table = tomllib.loads(text)
    except OSError as error:
        raise click.BadParameter(f"cannot read {path}: {error.strerror or error}", param_hint="--config") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise click.BadParameter(f"{path} is not valid TOML: {error}", param_hint="--config") from None
    params = preset_params(ctx)
    aliases = {param_name(opt): param.name for param in params.values() for opt in param.opts}
    others = _sibling_options(ctx)
    values: dict[str, object] = {}
    spelled: dict[str, str] = {}
    ignored: dict[str, list[str]] = {}
    origins: dict[str, str] = {}
    for key, value in table.items():
        line = _key_line(text, key)
        where = f"{path}" + (f", line {line}" if line else "")
        name = aliases.get(param_name(key), param_name(key))
        if name not in params:
            if param_name(key) in others:
                ignored.setdefault(others[param_name(key)], []).append(key)
                continue
            raise click.BadParameter(f"{where}: unknown setting {key!r} (the settings are the command's flags, "
                                     f"e.g. group_size = 8; see --help)", param_hint="--config")
        if name in spelled:
            raise click.BadParameter(f"{where}: {key!r} and {spelled[name]!r} are the same setting; keep one",
                                     param_hint="--config")
        spelled[name] = key
        values[name] = checked_value(ctx, params[name], value, where=where, key=key)
        origins[name] = where
    for command, keys in ignored.items():
        click.echo(f"note: {path}: {', '.join(keys)} {'is a setting' if len(keys) == 1 else 'are settings'} "
                   f"of {command}; {ctx.command.name} ignores {'it' if len(keys) == 1 else 'them'}", err=True)
    ctx.meta[PRESET_ORIGINS] = origins
    return values


def preset_origin(ctx: click.Context | None, message: str) -> str:
    """``message`` with `` (set in FILE, line N)`` added when it names a flag whose value came
    from the ``--config`` preset, so a check made later than the preset's own still names the
    file."""
    if ctx is None:
        return message
    origins: dict[str, str] = ctx.meta.get(PRESET_ORIGINS, {})
    for param in ctx.command.params:
        where = origins.get(param.name or "")
        if where is None or ctx.get_parameter_source(param.name or "") is not ParameterSource.DEFAULT_MAP:
            continue
        if any(re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", message) for opt in getattr(param, "opts", ())):
            return f"{message} (set in {where})"
    return message


RecordReader = Callable[[click.Context, Path], Mapping[str, object]]


def is_run_record(path: Path) -> bool:
    """Whether ``--config PATH`` names a run's record (its directory or a ``.json`` file) rather
    than a TOML preset."""
    return path.is_dir() or path.suffix.lower() == ".json"


def config_file_option(records: str = "config.json records the merged result", *,
                       read_record: RecordReader | None = None) -> Callable[[F], F]:
    """``--config FILE.toml``: settings from a preset file; flags on the command line win.
    ``records`` says where the command records the merged settings. With ``read_record``, the
    command also takes a run's record (``RUN`` or ``RUN/config.json``) there: the reader gives its
    settings by parameter name, as a preset's, and the command line wins over them too."""

    def load(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
        if value is None:
            return None
        if is_run_record(value):
            if read_record is None:
                raise click.BadParameter(f"{value} is a run's record, not a TOML preset; "
                                         f"`{invocation.command('train --config RUN')}` runs a run again from it",
                                         param_hint="--config")
            values = read_record(ctx, value)
        else:
            values = read_preset(ctx, value)
        ctx.default_map = {**(ctx.default_map or {}), **values}
        return value

    takes_runs = read_record is not None
    text = ("Read settings from this TOML file (keys are the flag names, e.g. group_size = 16; train and eval "
            "read the same file, each noting the other's keys it ignores)")
    if takes_runs:
        text += ", or from a run's record (RUN or RUN/config.json: the run's settings, to run it again)"
    return click.option("--config", "config", type=click.Path(dir_okay=takes_runs, path_type=Path), default=None,
                        is_eager=True, expose_value=True, callback=load,
                        metavar="FILE.toml|RUN" if takes_runs else "FILE.toml",
                        cls=SectionOption, section="run", on_resume=OnResume.FREE,
                        help=f"{text}; flags given on the command line override it, and {records}.")
