"""Counts in printed text: ``1 step``, ``2 steps``, ``0 questions``; never ``1 steps`` or ``step(s)``."""

from __future__ import annotations


def plural(count: int, noun: str, plural_form: str | None = None) -> str:
    """``count`` and ``noun``, the noun in the plural unless ``count`` is exactly one.
    The plural is ``noun + "s"`` unless ``plural_form`` says otherwise (``"entries"``)."""
    return f"{count} {noun if count == 1 else plural_form or noun + 's'}"
