"""Where API keys come from: the process environment first, then a ``.env`` file.

The ``.env`` file is read with python-dotenv but never loaded into ``os.environ``, so the
keys do not leak into child processes or unrelated code. A missing key is a
:class:`MissingApiKeyError` at backend construction, naming the variable and the file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from dotenv import dotenv_values

from searchr1.core.errors import UserError
from searchr1.basics.secrets import Secret

DEFAULT_ENV_FILE = Path(".env")


class MissingApiKeyError(UserError, ValueError):
    """A backend that needs a key was constructed without one."""

    def __init__(self, variables: Sequence[str], env_file: Path) -> None:
        self.variables = tuple(variables)
        self.env_file = env_file
        names = " or ".join(self.variables)
        super().__init__(
            f"{names} is not set: export it, or add a line `{self.variables[0]}=...` to "
            f"{env_file.resolve()} (read if present; pass --search-env-file to use another file)"
        )


def read_env_file(env_file: Path | str | None) -> dict[str, str]:
    """The ``KEY=value`` pairs of a dotenv file ({} when it does not exist)."""
    path = Path(env_file) if env_file is not None else DEFAULT_ENV_FILE
    if not path.is_file():
        return {}
    return {k: v for k, v in dotenv_values(path).items() if v is not None}


def lookup(
    variables: Sequence[str],
    *,
    env_file: Path | str | None = None,
    environ: Mapping[str, str] | None = None,
) -> str | None:
    """The first non-empty value among ``variables``: environment first, then the file."""
    environ = os.environ if environ is None else environ
    file_values: dict[str, str] | None = None
    for name in variables:
        value = environ.get(name, "").strip()
        if value:
            return value
    file_values = read_env_file(env_file)
    for name in variables:
        value = file_values.get(name, "").strip()
        if value:
            return value
    return None


def split_keys(raw: str) -> list[str]:
    """Keys separated by commas, whitespace or newlines; stripped, de-duplicated, in order."""
    seen: dict[str, None] = {}
    for part in re.split(r"[,\s]+", raw):
        if part:
            seen.setdefault(part, None)
    return list(seen)


def require_keys(
    variables: Sequence[str],
    *,
    env_file: Path | str | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[Secret, ...]:
    """All keys found under the first variable that is set, or :class:`MissingApiKeyError`."""
    raw = lookup(variables, env_file=env_file, environ=environ)
    keys = split_keys(raw) if raw else []
    if not keys:
        raise MissingApiKeyError(variables, Path(env_file) if env_file else DEFAULT_ENV_FILE)
    return tuple(Secret(k) for k in keys)


def coerce_keys(keys: str | Secret | Sequence[str | Secret], what: str) -> tuple[Secret, ...]:
    """Keys passed explicitly (a string of several keys, a Secret, or a sequence)."""
    if isinstance(keys, Secret):
        items: list[str | Secret] = [keys]
    elif isinstance(keys, str):
        items = list(split_keys(keys))
    else:
        items = list(keys)
    out: dict[Secret, None] = {}
    for item in items:
        secret = item if isinstance(item, Secret) else Secret(str(item).strip())
        if secret:
            out.setdefault(secret, None)
    if not out:
        raise ValueError(f"{what}: no usable key given (empty)")
    return tuple(out)
