"""What a checkout promises about its own files: what the commands write by default stays out of
git, and CONTRIBUTING names only files that exist."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Where the commands write unless told otherwise, and where the README sends their output.
WRITTEN_BY_DEFAULT = [
    "runs/search-r1-qwen35-4b/metrics.jsonl",  # train (and runs/judge-cache.jsonl, runs/twin)
    "eval_result/eval_offline_twin-learning_deepseek.jsonl",  # eval
    "exported/offline-demo/adapter_model.safetensors",  # export --out exported/<run> (README)
    "datasets/train.jsonl",  # prepare-data
    "indexes/wiki-18/manifest.json",  # index build --out indexes/... (docs)
    "bench.json",  # bench
]


@pytest.mark.skipif(not (REPO / ".git").exists() or shutil.which("git") is None, reason="needs a git checkout")
@pytest.mark.parametrize("path", WRITTEN_BY_DEFAULT)
def test_what_the_commands_write_by_default_is_ignored_by_git(path):
    checked = subprocess.run(["git", "-C", str(REPO), "check-ignore", "--no-index", "-q", path], timeout=30)
    assert checked.returncode == 0, f"{path} is not ignored by {REPO / '.gitignore'}"
