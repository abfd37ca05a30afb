"""No function in the package is longer than a screen: every ``def`` and ``async def`` in
``searchr1/`` (methods and nested functions included) spans at most MAX_LINES lines, counted from
its ``def`` line to its last line (decorators not counted, docstring and comments counted). A
longer one is named with its file, line, name and length; the check itself does catch one."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "searchr1"
MAX_LINES = 100


def function_lengths(source: str, filename: str) -> list[tuple[int, str, int]]:
    """``(line of its def, name, lines from its def to its end)`` of every function in ``source``."""
    tree = ast.parse(source, filename)
    return [(node.lineno, node.name, node.end_lineno - node.lineno + 1)  # type: ignore[operator]
            for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def too_long(root: Path, limit: int = MAX_LINES) -> list[str]:
    """``file:line name length`` of each function under ``root`` longer than ``limit`` lines."""
    found = []
    for path in sorted(root.rglob("*.py")):
        shown = path.relative_to(root.parent)
        for line, name, length in function_lengths(path.read_text("utf-8"), str(path)):
            if length > limit:
                found.append(f"{shown}:{line} {name} {length}")
    return found


def test_no_function_in_the_package_is_longer_than_a_screen():
    long = too_long(PACKAGE)
    assert not long, (f"{len(long)} functions over {MAX_LINES} lines; split each by what its parts do:\n"
                      + "\n".join(long))


def _function(name: str, body_lines: int, *, indent: str = "") -> str:
    return (f"{indent}@decorator\n{indent}def {name}():\n"
            + "".join(f"{indent}    x = {n}\n" for n in range(body_lines)))


def test_the_check_names_a_function_one_line_over_and_passes_one_at_the_limit(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    source = (_function("at_limit", MAX_LINES - 1) + "\n\nclass Holder:\n"
              + _function("one_over", MAX_LINES, indent="    ")
              + "\n\nasync def outer():\n    pass\n")
    (package / "module.py").write_text(source, "utf-8")
    one_over_line = source.splitlines().index("    def one_over():") + 1
    assert too_long(package) == [f"pkg/module.py:{one_over_line} one_over {MAX_LINES + 1}"]


def test_every_kind_of_function_is_measured():
    source = "def plain():\n    pass\n\n\nclass C:\n    async def method(self):\n        def inner():\n" \
             "            pass\n        return inner\n"
    assert sorted(name for _, name, _ in function_lengths(source, "x.py")) == ["inner", "method", "plain"]
    assert {name: length for _, name, length in function_lengths(source, "x.py")} == {
        "plain": 2, "method": 4, "inner": 2}
