"""Writing files so that a crash never leaves half of one, and reading JSON Lines with errors
that name the file and the line. Every module that persists something goes through here."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def _fsync_directory(directory: Path) -> None:
    """Make a rename durable (best effort: not every platform can open a directory)."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


@contextmanager
def replacing(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block succeeds, the temporary file is
    fsynced and renamed over ``path``; when it fails, it is removed and ``path`` is untouched."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    descriptor, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(descriptor)
    temporary = Path(name)
    try:
        yield temporary
        with open(temporary, "rb+") as stream:
            os.fsync(stream.fileno())
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _fsync_directory(target.parent)


def write_bytes_atomically(path: str | os.PathLike[str], data: bytes) -> None:
    with replacing(path) as temporary:
        temporary.write_bytes(data)


def write_text_atomically(path: str | os.PathLike[str], text: str) -> None:
    write_bytes_atomically(path, text.encode("utf-8"))


def write_json_atomically(path: str | os.PathLike[str], payload: Any, *, sort_keys: bool = True) -> None:
    write_text_atomically(path, json.dumps(payload, indent=2, sort_keys=sort_keys, ensure_ascii=False) + "\n")


def read_json_object(path: str | os.PathLike[str], error: type[Exception], what: str) -> dict[str, Any]:
    """The JSON object in ``path``; otherwise ``error`` with one line naming the file (and the
    line of a syntax error). ``what`` says what the file is meant to be."""
    path = Path(path)
    try:
        payload = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist") from None
    except json.JSONDecodeError as problem:
        raise error(f"{path}:{problem.lineno}: not valid JSON ({problem.msg})") from None
    if not isinstance(payload, dict):
        raise error(f"{path}: the top level must be an object")
    return payload


def json_line(record: Any) -> str:
    return json.dumps(record, sort_keys=True, ensure_ascii=False) + "\n"


def append_text(path: str | os.PathLike[str], text: str) -> None:
    """Append and fsync before returning: once this returns, the text survives a crash."""
    with open(path, "a", encoding="utf-8") as stream:
        stream.write(text)
        stream.flush()
        os.fsync(stream.fileno())


def append_json_line(path: str | os.PathLike[str], record: Any) -> None:
    append_text(path, json_line(record))


def iter_json_lines(
    path: str | os.PathLike[str], *, error: type[Exception] = ValueError
) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` for every non-blank line; a line that is not JSON raises
    ``error("<path>:<line>: invalid JSON (...)")``."""
    with open(path, encoding="utf-8") as stream:
        for number, line in enumerate(stream, start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                raise error(f"{path}:{number}: invalid JSON ({exc.msg} at column {exc.colno})") from None
            yield number, value
