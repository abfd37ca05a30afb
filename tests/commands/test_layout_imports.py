"""Import rules of the layout outside the core, read from every import statement in the source
(those inside functions too): click is imported only by the commands, and the commands only by
the entry point; the BM25 package never reaches into the twin; every import is absolute."""

from __future__ import annotations

import ast
from pathlib import Path

import searchr1

PACKAGE = Path(searchr1.__file__).resolve().parent


def imports_of(path: Path) -> list[tuple[int, str, int]]:
    """``(line, module, level)`` of every import in ``path``; ``level`` > 0 for a relative one."""
    found = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, 0) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.append((node.lineno, node.module or "", node.level))
    return found


def importers(prefix: str, *, under: Path = PACKAGE) -> list[str]:
    """``file:line`` of each import of ``prefix`` (or a submodule of it) below ``under``."""
    return [f"{path.relative_to(PACKAGE.parent)}:{line}" for path in sorted(under.rglob("*.py"))
            for line, module, _ in imports_of(path) if module == prefix or module.startswith(prefix + ".")]


def test_only_the_commands_import_click():
    commands = PACKAGE / "commands"
    outside = [where for where in importers("click")
               if not (PACKAGE.parent / where.split(":")[0]).resolve().is_relative_to(commands)]
    assert outside == []
    assert importers("click", under=commands)  # the probe does see an import of click


def test_nothing_but_the_entry_point_imports_the_commands():
    commands = PACKAGE / "commands"
    outside = [where for where in importers("searchr1.commands")
               if not (PACKAGE.parent / where.split(":")[0]).resolve().is_relative_to(commands)]
    assert [where.split(":")[0] for where in outside] == ["searchr1/cli.py"]


def test_the_bm25_package_does_not_import_the_twin():
    assert importers("searchr1.twin", under=PACKAGE / "bm25") == []


def test_every_import_inside_the_package_is_absolute():
    relative = [f"{path.relative_to(PACKAGE.parent)}:{line}" for path in sorted(PACKAGE.rglob("*.py"))
                for line, _, level in imports_of(path) if level > 0]
    assert relative == []


def test_the_probe_reads_imports_inside_functions_and_relative_ones(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text("def f():\n    import click\n    from . import sibling\n", "utf-8")
    assert imports_of(source) == [(2, "click", 0), (3, "", 1)]
