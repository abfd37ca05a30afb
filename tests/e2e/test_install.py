"""A wheel holds every file the offline commands read: what ``train --offline`` and ``eval
--offline`` open in the checkout is package code, package data, or a folder setup.py ships.
(``.ci/run`` builds the wheel and runs both from an install outside the checkout.)"""

from __future__ import annotations

import fnmatch
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from searchr1.offline import REPO_ROOT

pytestmark = pytest.mark.slow

# Runs CLI commands one after another in a fresh interpreter and prints, at exit, every file under
# the checkout they opened.
PROBE = """
import atexit, json, sys
from pathlib import Path
root = Path(sys.argv[1]).resolve()
environment = Path(sys.prefix).resolve()  # the virtual environment may live inside the checkout
opened = set()
def hook(event, args):
    if event == "open" and isinstance(args[0], (str, Path)):
        path = Path(args[0]).resolve() if not isinstance(args[0], int) else None
        if path is not None and path.is_relative_to(root) and not path.is_relative_to(environment) and path.is_file():
            opened.add(str(path.relative_to(root)))
sys.addaudithook(hook)
atexit.register(lambda: print("OPENED " + json.dumps(sorted(opened))))
from searchr1.cli import main
for command in json.loads(sys.argv[2]):
    sys.argv = ["searchr1", *command]
    try:
        main()
    except SystemExit as done:
        if done.code not in (0, None):
            raise
"""


def opened_by(tmp_path: Path, *commands: list[str]) -> set[str]:
    done = subprocess.run([sys.executable, "-c", PROBE, str(REPO_ROOT), json.dumps(commands)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("OPENED "))
    return set(json.loads(line.removeprefix("OPENED ")))


def shipped(path: str) -> bool:
    """Whether a wheel built from this checkout carries ``path`` (pyproject's packages and
    package data, and the folders setup.py copies in)."""
    tool = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text("utf-8"))["tool"]
    parts = Path(path).parts
    if parts[0] == "searchr1" and path.endswith(".py") or parts[0].endswith((".egg-info", ".dist-info")):
        return True  # code, or the metadata of an install from this checkout
    if "__pycache__" in parts and path.endswith(".pyc"):
        return True  # the code's compiled copy, which Python writes beside an install too
    package, name = ".".join(parts[:-1]), parts[-1]
    package_data = tool["setuptools"].get("package-data", {}).get(package, [])
    folders = tool.get("searchr1", {}).get("shipped-data", {}) if (REPO_ROOT / "setup.py").is_file() else {}
    return any(fnmatch.fnmatch(name, pattern) for pattern in [*package_data, *folders.get(parts[0], [])])


def test_every_file_the_offline_commands_read_is_in_the_wheel(tmp_path):
    read = opened_by(tmp_path, ["train", "--offline", "--quiet", "--max-steps", "1", "--run-dir", "run"],
                     ["eval", "--offline", "--quiet", "--limit", "2", "--output", "eval.jsonl"])
    assert (tmp_path / "run").is_dir() and (tmp_path / "eval.jsonl").is_file()  # both commands ran
    assert "searchr1/offline/train.jsonl" in read and any(path.startswith("cassettes/") for path in read)
    assert sorted(path for path in read if not shipped(path)) == []
