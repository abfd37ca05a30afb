"""The package imports POSIX-only modules (``fcntl`` for the run directory's lock, ``resource``), so
it says it is POSIX only where a user looks before installing: the package metadata's classifier
and the README's quick start."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import searchr1

PACKAGE = Path(searchr1.__file__).resolve().parent
ROOT = PACKAGE.parent
POSIX_ONLY = {"fcntl", "resource", "termios", "pwd", "grp", "posix"}  # the standard library's Unix-only modules
POSIX = "Operating System :: POSIX"


def posix_only_imports() -> list[str]:
    """``file:line module`` of every import of a POSIX-only module in the package."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(ROOT)}:{node.lineno} {name}" for name in names
                      if name.split(".")[0] in POSIX_ONLY]
    return found


def test_a_package_that_imports_posix_only_modules_says_it_is_posix_only():
    imports = posix_only_imports()
    assert any(hit.startswith("searchr1/basics/fileio.py:") and hit.endswith(" fcntl") for hit in imports), imports
    classifiers = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"].get("classifiers", [])
    assert POSIX in classifiers
    assert not [c for c in classifiers if c.startswith("Operating System ::") and c != POSIX], classifiers
    quick_start = (ROOT / "README.md").read_text("utf-8").split("## Quick start", 1)[1].split("<!-- ci:main -->")[0]
    assert "POSIX only" in quick_start and "Windows" in quick_start
