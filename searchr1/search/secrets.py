"""Keeping API keys out of everything that is printed, logged, recorded or shown to the model.

A key lives in a :class:`Secret`, whose ``repr``/``str`` never show the value; only
``reveal()`` does, at the single place where a request header is built. Error texts that may
carry server-provided words pass through :func:`sanitise_error`, which bounds them, strips
control characters and masks known secrets and anything that looks like a credential.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

MASK = "[redacted]"

# Things that look like credentials even when we do not know the value.
_CREDENTIAL_PATTERNS = (
    re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]+"),
    re.compile(r"\bsk-[A-Za-z0-9_-]{6,}"),
    re.compile(r"(?i)\b(api[_-]?key|access[_-]?secret|token|secret)\s*[=:]\s*\S+"),
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


class Secret:
    """A string that does not print itself. Compare and hash like the value."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if not isinstance(value, str):
            raise TypeError(f"Secret value must be str, got {type(value).__name__}")
        self._value = value

    def reveal(self) -> str:
        return self._value

    def fingerprint(self) -> str:
        """A short, non-reversible tag to tell keys apart in messages."""
        return hashlib.sha256(self._value.encode()).hexdigest()[:8]

    def __repr__(self) -> str:
        return "Secret('****')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("Secret", self._value))

    def __bool__(self) -> bool:
        return bool(self._value)

    def __reduce__(self):  # never pickle a key into a file by accident
        raise TypeError("Secret objects cannot be pickled")


def redact(text: str, secrets: Iterable[Secret | str] = ()) -> str:
    """Replace every known secret value, and credential-looking spans, by ``[redacted]``."""
    values = sorted(
        {s.reveal() if isinstance(s, Secret) else s for s in secrets} - {""},
        key=len,
        reverse=True,
    )
    for value in values:
        text = text.replace(value, MASK)
    for pattern in _CREDENTIAL_PATTERNS:
        text = pattern.sub(MASK, text)
    return text


def sanitise_error(text: object, secrets: Iterable[Secret | str] = (), *, limit: int = 160) -> str:
    """A short single-line error text safe for logs and for the model's context."""
    cleaned = _CONTROL.sub(" ", str(text))
    cleaned = " ".join(cleaned.split())
    cleaned = redact(cleaned, secrets)
    if len(cleaned) > limit:
        cleaned = cleaned[: max(0, limit - 1)].rstrip() + "…"
    return cleaned
