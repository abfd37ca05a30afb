"""The core's annotations are checked, not only written: mypy (``[tool.mypy]`` in pyproject.toml)
finds no error in ``searchr1/core/`` checked on its own. Mutation testing counts a mutant mypy refuses as caught, which
holds only because this test holds the core to it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # a subprocess, several seconds


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory):
    """One cache for both checks: the second reads the core's analysis instead of redoing it
    (mypy keys its cache by each file's contents, so a changed file is analysed again)."""
    return tmp_path_factory.mktemp("mypy")


def test_the_core_type_checks(mypy_cache):
    result = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(mypy_cache), "searchr1/core"],
                            cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues found in" in result.stdout


def test_the_check_sees_an_error(tmp_path, mypy_cache):
    """mypy does read the core (the test above can fail): a wrong call in a copy is reported."""
    copy = tmp_path / "core_copy.py"
    copy.write_text("from searchr1.core.advantage import group_advantages\n\ngroup_advantages(None, mode=3)\n",
                    encoding="utf-8")
    result = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(mypy_cache), str(copy)],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 1 and "core_copy.py:3: error" in result.stdout
