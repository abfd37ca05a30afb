"""The package, cli.py and setup.py pass ruff with the project's configuration (pyproject.toml's
[tool.ruff]); the check itself does catch a finding. Skipped, saying so, where ruff is not installed
(it comes with the test extra)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("searchr1", "cli.py", "setup.py")

pytestmark = [
    pytest.mark.slow,  # a subprocess
    pytest.mark.skipif(importlib.util.find_spec("ruff") is None,
                       reason="ruff is not installed (the test extra has it: uv sync --locked --inexact --extra test)"),
]


def ruff(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *arguments], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_ruff_finds_nothing_in_the_package():
    result = ruff(*CHECKED)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_configuration_catches_an_unused_import_and_a_long_line(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import os\n\nVALUE = '" + "x" * 120 + "'\n", "utf-8")
    result = ruff("--config", str(ROOT / "pyproject.toml"), "--output-format", "concise", str(sample))
    assert result.returncode == 1
    assert " F401 " in result.stdout and " E501 " in result.stdout
