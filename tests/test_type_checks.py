"""The whole package's annotations are checked, not only written: mypy (``[tool.mypy]`` in
pyproject.toml) finds no error in ``searchr1/``; ``Any`` stands on at most :data:`ANY_LINES` lines,
and every ``type: ignore`` names its error code and says why (CONTRIBUTING, "Types").

``python tests/test_type_checks.py`` prints the lines with ``Any`` per package.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tokenize
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "searchr1"
ANY_LINES = 150
# `# type: ignore[code]  # why`: the code mypy would report, then the reason in words.
IGNORE_WITH_REASON = re.compile(r"#\s*type:\s*ignore\[[a-z-]+(,\s*[a-z-]+)*\]\s+#\s*\S.{8,}")


def _sources() -> list[Path]:
    return sorted(path for path in PACKAGE.rglob("*.py") if "__pycache__" not in path.parts)


def lines_with_any(path: Path) -> list[int]:
    """The lines where the name ``Any`` is code (a comment or a docstring mentioning it is not)."""
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline)
    return sorted({token.start[0] for token in tokens if token.type == tokenize.NAME and token.string == "Any"})


def ignores(path: Path) -> list[tuple[int, str]]:
    """Each ``type: ignore`` comment in the file, with its line."""
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline)
    return [(token.start[0], token.line.strip()) for token in tokens
            if token.type == tokenize.COMMENT and re.match(r"#\s*type:\s*ignore", token.string)]


@pytest.mark.slow  # a subprocess, about 15 seconds without a cache
def test_the_package_type_checks(tmp_path):
    result = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "mypy"), "searchr1"],
                            cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr
    assert "no issues found in" in result.stdout


def test_any_stands_on_few_lines():
    counted = {path.relative_to(ROOT).as_posix(): lines_with_any(path) for path in _sources()}
    total = sum(len(lines) for lines in counted.values())
    assert total <= ANY_LINES, f"{total} lines with Any (at most {ANY_LINES}): " + ", ".join(
        f"{name} {len(lines)}" for name, lines in sorted(counted.items(), key=lambda item: -len(item[1])) if lines)


def test_every_type_ignore_says_why():
    bare = [f"{path.relative_to(ROOT).as_posix()}:{line}: {text}"
            for path in _sources() for line, text in ignores(path) if not IGNORE_WITH_REASON.search(text)]
    assert not bare, "a type: ignore without its code and reason:\n" + "\n".join(bare)


def test_the_counts_see_what_they_count(tmp_path):
    """The readers above can fail: a name is counted, a mention in words is not, a bare ignore is caught."""
    sample = tmp_path / "sample.py"
    sample.write_text('"""Any in a docstring."""\nfrom typing import Any  # Any in a comment\n'
                      'x: Any = 1  # type: ignore[misc]\ny = 2  # type: ignore[misc]  # the stub is wrong about y\n',
                      encoding="utf-8")
    assert lines_with_any(sample) == [2, 3]
    found = ignores(sample)
    assert [line for line, text in found if not IGNORE_WITH_REASON.search(text)] == [3]
    assert len(found) == 2


if __name__ == "__main__":
    per_package: Counter[str] = Counter()
    for source in _sources():
        parts = source.relative_to(PACKAGE).parts
        per_package[parts[0] if len(parts) > 1 else source.name] += len(lines_with_any(source))
    for name, count in per_package.most_common():
        print(f"{count:5d}  {name}")
    print(f"{sum(per_package.values()):5d}  in all (at most {ANY_LINES})")
