"""The types of JSON values, and the checked reads that narrow them.

A value decoded from JSON is one of :data:`JsonValue`; a record (one line of a ``.jsonl`` file, a
``config.json``) is a :data:`JsonObject`. Code that writes records takes ``Mapping[str, object]``
(whatever ``json.dumps`` accepts); code that reads them narrows each field with the functions
below, which raise :class:`TypeError` naming the field when a record does not have the shape its
writer gives it. A record whose keys are fixed has its own ``TypedDict`` beside its writer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeAlias

JsonScalar: TypeAlias = "str | int | float | bool | None"
JsonValue: TypeAlias = "str | int | float | bool | None | list[JsonValue] | dict[str, JsonValue]"
JsonObject: TypeAlias = "dict[str, JsonValue]"


def _wrong(name: str, want: str, value: object) -> TypeError:
    return TypeError(f"{name}: expected {want}, got {type(value).__name__}")


def as_float(value: object, name: str = "value") -> float:
    """A JSON number as a float (``true``/``false`` are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _wrong(name, "a number", value)
    return float(value)


def as_int(value: object, name: str = "value") -> int:
    """A JSON integer (a float with no fraction, as JSON writers may give it, counts)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _wrong(name, "an integer", value)
    return value


def as_str(value: object, name: str = "value") -> str:
    """A JSON string."""
    if not isinstance(value, str):
        raise _wrong(name, "a string", value)
    return value


def as_object(value: object, name: str = "value") -> Mapping[str, object]:
    """A JSON object."""
    if not isinstance(value, Mapping):
        raise _wrong(name, "an object", value)
    return value


def as_list(value: object, name: str = "value") -> list[object]:
    """A JSON array."""
    if not isinstance(value, list):
        raise _wrong(name, "an array", value)
    return value


def optional_float(value: object, name: str = "value") -> float | None:
    """A JSON number or null."""
    return None if value is None else as_float(value, name)
