"""Numbers read back from a record as ``float()`` and ``int()`` read a JSON value: a number, a
boolean (``cover_em`` is written as one) or a numeric string. Any other value (null, an array, an
object) is the TypeError ``float()`` would raise, naming the field; a string that is no number is
its ValueError. Readers that used ``float(record[key])`` keep accepting what they accepted."""

from __future__ import annotations


def float_of(value: object, name: str = "value") -> float:
    """``float(value)`` for a JSON value."""
    if isinstance(value, int | float | str):  # a bool is an int
        return float(value)
    raise TypeError(f"{name}: expected a number, got {type(value).__name__}")


def int_of(value: object, name: str = "value") -> int:
    """``int(value)`` for a JSON value (a float is cut toward zero, as ``int()`` cuts it)."""
    if isinstance(value, int | float | str):
        return int(value)
    raise TypeError(f"{name}: expected a number, got {type(value).__name__}")
