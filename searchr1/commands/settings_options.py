"""Click options made from the settings a configuration class declares (``searchr1.core.settings``),
and ``--config FILE.toml`` presets.

``setting_options(RolloutConfig)`` adds one flag per declared field (type, default, choices,
range and help from the declaration; the value is checked by the same rule the dataclass
enforces). ``take_settings(RolloutConfig, kwargs)`` pops those flags back out as field values.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from searchr1.core.settings import Rule, flag_of, settings_of

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def param_name(flag: str) -> str:
    """The keyword a flag reaches the command under (click's own rule)."""
    return flag.lstrip("-").replace("-", "_").lower()


def setting_params(cls: type, *, exclude: tuple[str, ...] = ()) -> dict[str, str]:
    """``{click parameter name: field name}`` of the flags ``setting_options(cls)`` adds."""
    return {param_name(flag_of(field)): field.name for field, rule in settings_of(cls)
            if rule.cli and field.name not in exclude}


def _base_type(annotation: Any) -> Any:
    """``int | None`` -> ``int``."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [member for member in typing.get_args(annotation) if member is not type(None)]
        return members[0] if len(members) == 1 else str
    return annotation


def _validator(rule: Rule) -> Callable[[click.Context, click.Parameter, Any], Any]:
    def check(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        broken = rule.violation(value)
        if broken:
            raise click.BadParameter(broken)
        return value

    return check


def _default(field: dataclasses.Field[Any]) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None if field.default is dataclasses.MISSING else field.default


def setting_option(annotation: Any, field: dataclasses.Field[Any], rule: Rule, *,
                   default: Any = dataclasses.MISSING, help: str | None = None) -> Decorator:
    """The click option of one declared setting (``annotation``: the field's resolved type)."""
    base = _base_type(annotation)
    value = _default(field) if default is dataclasses.MISSING else default
    text = help if help is not None else rule.help
    if rule.describe():
        text = f"{text} [{rule.describe()}]".strip()
    flag = flag_of(field)
    names = (flag, *rule.aliases, param_name(flag))
    common: dict[str, Any] = {"help": text, "metavar": rule.metavar}
    if rule.default_text is not None:
        common["show_default"] = rule.default_text
    elif value is not None:
        common["show_default"] = True
    if base is bool:
        return click.option(*names, is_flag=True, default=bool(value), help=text)
    if rule.choices is not None:
        kind: Any = click.Choice(rule.choices)
    elif base is Path:
        kind = click.Path(dir_okay=False, path_type=Path)
    else:
        kind = base if base in (int, float) else str
    return click.option(*names, type=kind, default=value, callback=_validator(rule), **common)


def setting_options(cls: type, *, defaults: dict[str, Any] | None = None, helps: dict[str, str] | None = None,
                    exclude: tuple[str, ...] = ()) -> Decorator:
    """One click option per declared setting of ``cls`` (``defaults``/``helps`` per field name
    for a command whose default differs, e.g. eval's greedy temperature)."""
    defaults, helps = defaults or {}, helps or {}
    annotations = typing.get_type_hints(cls)  # resolved once per class, not once per field
    options = [setting_option(annotations[field.name], field, rule,
                              default=defaults.get(field.name, dataclasses.MISSING), help=helps.get(field.name))
               for field, rule in settings_of(cls) if rule.cli and field.name not in exclude]

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def take_settings(cls: type, kwargs: dict[str, Any], *, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """Pop the flags of ``setting_options(cls)`` out of a command's kwargs, as field values."""
    return {field: kwargs.pop(param) for param, field in setting_params(cls, exclude=exclude).items()}


# --- --config FILE.toml ---------------------------------------------------------------------------


def given_params(ctx: click.Context) -> set[str]:
    """The parameters the user set: on the command line or in the ``--config`` preset."""
    given = (ParameterSource.COMMANDLINE, ParameterSource.DEFAULT_MAP, ParameterSource.ENVIRONMENT)
    return {name for name in ctx.params if ctx.get_parameter_source(name) in given}


def _key_line(text: str, key: str) -> int | None:
    for number, line in enumerate(text.splitlines(), 1):
        if re.match(rf"\s*[\"']?{re.escape(key)}[\"']?\s*=", line):
            return number
    return None


def read_preset(ctx: click.Context, path: Path) -> dict[str, Any]:
    """The preset's values by parameter name, each checked as its flag would be; an unknown key
    or a bad value names the file, the line and the key."""
    try:
        text = path.read_text("utf-8")
        table = tomllib.loads(text)
    except OSError as error:
        raise click.BadParameter(f"cannot read {path}: {error.strerror or error}", param_hint="--config") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise click.BadParameter(f"{path} is not valid TOML: {error}", param_hint="--config") from None
    params = {param.name: param for param in ctx.command.params
              if isinstance(param, click.Option) and param.name not in ("config", "help")}
    aliases = {param_name(opt): param.name for param in params.values() for opt in param.opts}
    values: dict[str, Any] = {}
    for key, value in table.items():
        line = _key_line(text, key)
        where = f"{path}" + (f", line {line}" if line else "")
        name = aliases.get(param_name(key), param_name(key))
        if name not in params:
            raise click.BadParameter(f"{where}: unknown setting {key!r} (the settings are the command's flags, "
                                     f"e.g. group_size = 8; see --help)", param_hint="--config")
        if isinstance(value, dict):
            raise click.BadParameter(f"{where}: {key} is a table; write settings as plain keys",
                                     param_hint="--config")
        param = params[name]
        try:
            converted = param.type_cast_value(ctx, value)
            if param.callback is not None:
                converted = param.callback(ctx, param, converted)
        except click.BadParameter as error:
            raise click.BadParameter(f"{where}: {key} {error.message}", param_hint="--config") from None
        values[name] = value
    return values


def config_file_option() -> Decorator:
    """``--config FILE.toml``: settings from a preset file; flags on the command line win."""

    def load(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
        if value is not None:
            ctx.default_map = {**(ctx.default_map or {}), **read_preset(ctx, value)}
        return value

    return click.option("--config", "config", type=click.Path(dir_okay=False, path_type=Path), default=None,
                        is_eager=True, expose_value=True, callback=load, metavar="FILE.toml",
                        help="Read settings from this TOML file (keys are the flag names, e.g. "
                             "group_size = 16); flags given on the command line override it, and "
                             "config.json records the merged result.")
