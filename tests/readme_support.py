"""The README's ``bash`` blocks, read as a reader types them."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_lines(*, install: bool = True) -> list[list[list[str]]]:
    """Each ``bash`` block's lines as words (continued lines joined, comments dropped, blank
    lines left out); ``install=False`` leaves out the install blocks (``<!-- ci:... -->``, CI's own)."""
    blocks = []
    for marker, block in re.findall(r"(<!-- ci:\w+ -->\n)?```bash\n(.*?)```", README.read_text("utf-8"), re.S):
        if marker and not install:
            continue
        lines = [shlex.split(line, comments=True) for line in block.replace("\\\n", " ").splitlines()]
        blocks.append([words for words in lines if words])
    return blocks


def cli_commands(words: list[str]) -> list[list[str]]:
    """The ``python cli.py`` commands of one line, without the program (a command ends at ``&&``)."""
    found = []
    for start in [i + 2 for i, word in enumerate(words) if words[i:i + 2] == ["python", "cli.py"]]:
        end = words.index("&&", start) if "&&" in words[start:] else len(words)
        found.append(words[start:end])
    return found


def readme_blocks(*, install: bool = True) -> list[list[list[str]]]:
    """Each ``bash`` block's ``python cli.py`` commands, in order."""
    return [[command for words in block for command in cli_commands(words)] for block in readme_lines(install=install)]


def readme_commands() -> list[list[str]]:
    """Every ``python cli.py`` command of the README, block after block."""
    return [words for block in readme_blocks() for words in block]
